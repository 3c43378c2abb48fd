"""``gpudra explain`` of one claim against many simulated 8-GPU nodes.

    python -m bench.explain [--nodes 1000] [--runs 3] [--cold]

Runs the real command in a fresh process each time (start-up included) and reports wall
time and peak RSS. The CEL parser's tables and the selectors' parse trees are cached in the
user's cache directory after the first run; ``--cold`` gives every run an empty one (the
first run after an install or an upgrade).
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
    args = parser.parse_args()
    compile_tree()  # timed as installed, not while compiling changed modules
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="gpudra-bench-cache-") as cache:
            env = {**os.environ, "XDG_CACHE_HOME": cache} if args.cold else None
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "gpudra.cli.main", "explain", str(CLAIM), "--simulate",
                 args.profile, "--nodes", str(args.nodes), "--dynamic-mig-gpus", "all"],
                cwd=ROOT, capture_output=True, text=True, check=False, env=env)
            elapsed = time.perf_counter() - started
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        verdict = done.stdout.strip().splitlines()[-1] if done.stdout else done.stderr
        print(f"run {run + 1}: {args.nodes} x {args.profile}: {elapsed:.2f} s, "
              f"peak RSS {rss:.0f} MiB, exit {done.returncode}: {verdict[:90]}")


if __name__ == "__main__":
    main()
