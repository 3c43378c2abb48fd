"""``gpudra explain`` of one claim against many simulated 8-GPU nodes.

    python -m bench.explain [--nodes 1000] [--runs 3] [--cold] [--claim FILE]
                            [--layout default|dynamic-mig|both]

Runs the real command in a fresh process each time (start-up included) and reports wall
time, the CPU time it used (user + system: what it costs on an idle machine, whatever else a
shared one runs) and peak RSS. ``--layout dynamic-mig`` simulates nodes that offer dynamic MIG
on every GPU (``--dynamic-mig-gpus all``: 208 devices per DGX H100), ``default`` the driver's
default offer, ``both`` one after the other. The CEL parser's tables and the selectors'
parse trees are cached in the user's cache directory after the first run; ``--cold`` gives
every run an empty one (the first run after an install or an upgrade).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.preamble import compile_tree

ROOT = Path(__file__).resolve().parents[1]
CLAIM = ROOT / "examples" / "two-mig-same-gpu" / "claim.yaml"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", default="dgx-h100")
    parser.add_argument("--cold", action="store_true",
                        help="an empty cache directory (XDG_CACHE_HOME) for every run")
    parser.add_argument("--claim", type=Path, default=CLAIM)
    parser.add_argument("--layout", choices=("default", "dynamic-mig", "both"),
                        default="dynamic-mig")
    args = parser.parse_args()
    compile_tree()  # timed as installed, not while compiling changed modules
    layouts = ("default", "dynamic-mig") if args.layout == "both" else (args.layout,)
    for layout in layouts:
        flags = ["--dynamic-mig-gpus", "all"] if layout == "dynamic-mig" else []
        for run in range(args.runs):
            _run(args, layout, flags, run)


def _run(args: argparse.Namespace, layout: str, flags: list[str], run: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gpudra-bench-cache-") as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache} if args.cold else None
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "gpudra.cli.main", "explain", str(args.claim),
             "--simulate", args.profile, "--nodes", str(args.nodes), *flags],
            cwd=ROOT, capture_output=True, text=True, check=False, env=env)
        elapsed = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rss = after.ru_maxrss / 1024
    verdict = done.stdout.strip().splitlines()[-1] if done.stdout else done.stderr
    print(f"run {run + 1}: {args.nodes} x {args.profile} ({layout}), {args.claim.parent.name}: "
          f"{elapsed:.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss:.0f} MiB, "
          f"exit {done.returncode}: {verdict[:90]}")

if __name__ == "__main__":
    main()
