"""Stand-in for ``nvidia-cuda-mps-control -d`` on a simulated node.

Creates ``<pipe>/control`` (a FIFO), logs every command to ``<log>/control.log`` like the
real daemon, writes ``<log>/startup.log`` when ready, and exits on ``quit``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(pipe_dir: str, log_dir: str) -> None:
    pipe, logs = Path(pipe_dir), Path(log_dir)
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    control = pipe / "control"
    (pipe / "nvidia-mps.pid").write_text(f"{os.getpid()}\n")
    os.mkfifo(control)
    log = (logs / "control.log").open("a", buffering=1)
    log.write(f"[sim] MPS control daemon started pid={os.getpid()} "
              f"devices={os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
    (logs / "startup.log").write_text("ready\n")
    try:
        while True:
            with control.open() as fifo:
                for line in fifo:
                    command = line.strip()
                    if not command:
                        continue
                    log.write(f"[sim] {command}\n")
                    if command == "quit":
                        return
    finally:
        control.unlink(missing_ok=True)
        (pipe / "nvidia-mps.pid").unlink(missing_ok=True)
        log.write("[sim] exit\n")
        log.close()


def daemonize() -> None:
    """Detach like a classic Unix daemon: the launcher's process exits immediately."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--daemonize":
        daemonize()
        args = args[1:]
    main(args[0], args[1])
