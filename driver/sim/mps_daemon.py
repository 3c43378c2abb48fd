"""Stand-in for ``nvidia-cuda-mps-control -d`` on a simulated node.

Writes ``<pipe>/nvidia-cuda-mps-control.pid`` and creates ``<pipe>/control`` (a FIFO), logs
every command to ``<log>/control.log`` like the real daemon, writes ``<log>/startup.log`` when
ready, and exits on ``quit`` or SIGTERM. Killed with SIGKILL it leaves both files behind, as
the real one does.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

REPLY = "#reply"
"""Not a real MPS command: the runner asks the daemon to touch a file once it has read the
lines before (the real control client waits for the daemon's answer too)."""


def main(pipe_dir: str, log_dir: str) -> None:
    pipe, logs = Path(pipe_dir), Path(log_dir)
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    control = pipe / "control"
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    # SIGTERM exits through the `finally` below (Python's default would skip it).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
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
                    if command.startswith(REPLY + " "):
                        Path(command.removeprefix(REPLY + " ")).touch()
                        continue
                    log.write(f"[sim] {command}\n")
                    if command == "quit":
                        return
    finally:
        control.unlink(missing_ok=True)
        pid_file.unlink(missing_ok=True)
        log.write("[sim] exit\n")
        log.close()


def daemonize() -> None:
    """Detach like a classic Unix daemon: the launcher's process exits at once, so the daemon
    is re-parented to init (or the nearest subreaper), in a session of its own, and the
    node daemon that started it can exit or be killed without taking it along."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    os.chdir("/")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--daemonize":
        daemonize()
        args = args[1:]
    main(args[0], args[1])
