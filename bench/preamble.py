"""What a bench does before it measures: say which tree and machine load it measures, and
compile the tree's bytecode, as ``pip install`` does.

Without the compile, a process whose modules changed since their ``.pyc`` was written compiles them
on every start (and never saves the result where ``PYTHONDONTWRITEBYTECODE`` is set, as in
this project's sandboxes): tens of milliseconds that no installed driver pays.
"""

from __future__ import annotations

import compileall
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "driver", "kube", "controller", "kubeletplugin", "scheduling", "testing",
            "cli", "bench", "tests")


def compile_tree() -> None:
    for package in PACKAGES:
        compileall.compile_dir(ROOT / package, quiet=2)


def preamble() -> None:
    """Print the commit and the load average, then :func:`compile_tree`."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False, cwd=ROOT).stdout.strip()
    print(f"commit {head} (working tree may differ); load {os.getloadavg()[0]:.2f}")
    compile_tree()  # start-ups timed as installed, not while compiling
