"""Compile the tree's bytecode before timing start-ups, as ``pip install`` does.

Without it, a process whose modules changed since their ``.pyc`` was written compiles them
on every start (and never saves the result where ``PYTHONDONTWRITEBYTECODE`` is set, as in
this project's sandboxes): tens of milliseconds that no installed driver pays.
"""

from __future__ import annotations

import compileall
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "driver", "kube", "controller", "kubeletplugin", "scheduling", "testing",
            "cli", "bench", "tests")


def compile_tree() -> None:
    for package in PACKAGES:
        compileall.compile_dir(ROOT / package, quiet=2)
