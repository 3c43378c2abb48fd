"""Stand-in for ``nvidia-cuda-mps-control -d`` on a simulated node.

Writes ``<pipe>/nvidia-cuda-mps-control.pid`` and creates ``<pipe>/control`` (a FIFO), logs
every command to ``<log>/control.log`` like the real daemon, writes ``<log>/startup.log`` when
ready, and exits on ``quit`` or SIGTERM. Killed with SIGKILL it leaves both files behind, as
the real one does.

The limit commands the real control shell accepts (``set_default_active_thread_percentage``,
``set_default_device_pinned_mem_limit``, and their per-server forms taking a server PID)
are checked and kept in ``<log>/limits.json`` (:func:`read_limits`), so tests see which
limits a daemon enforces; a command the real shell would reject lands in ``rejected``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

REPLY = "#reply"
"""Not a real MPS command: the runner asks the daemon to touch a file once it has read the
lines before (the real control client waits for the daemon's answer too)."""


LIMITS_FILE = "limits.json"
_MEMORY_RE = re.compile(r"\d+[MG]?")


def read_limits(log_dir: Path) -> dict[str, Any]:
    """What a (simulated) control daemon was told: defaults, per-server limits, rejects."""
    path = log_dir / LIMITS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _percentage(text: str) -> int | None:
    return int(text) if text.isdigit() and 0 <= int(text) <= 100 else None


def _apply_limit(limits: dict[str, Any], command: str) -> bool:
    """Record one limit command as the real shell would take it; whether it is one."""
    words = command.split()
    name, args = words[0], words[1:]
    if name == "set_default_active_thread_percentage":
        ok = len(args) == 1 and _percentage(args[0]) is not None
        if ok:
            limits["defaultActiveThreadPercentage"] = int(args[0])
    elif name == "set_default_device_pinned_mem_limit":
        ok = len(args) == 2 and _MEMORY_RE.fullmatch(args[1]) is not None
        if ok:
            limits.setdefault("defaultDevicePinnedMemLimit", {})[args[0]] = args[1]
    elif name == "set_active_thread_percentage":
        ok = len(args) == 2 and args[0].isdigit() and _percentage(args[1]) is not None
        if ok:
            limits.setdefault("servers", {}).setdefault(args[0], {})[
                "activeThreadPercentage"] = int(args[1])
    elif name == "set_device_pinned_mem_limit":
        ok = len(args) == 3 and args[0].isdigit() \
            and _MEMORY_RE.fullmatch(args[2]) is not None
        if ok:
            limits.setdefault("servers", {}).setdefault(args[0], {}).setdefault(
                "devicePinnedMemLimit", {})[args[1]] = args[2]
    else:
        return False
    if not ok:
        limits.setdefault("rejected", []).append(command)
    return True


def _save(log_dir: Path, limits: dict[str, Any]) -> None:
    tmp = log_dir / (LIMITS_FILE + ".tmp")
    tmp.write_text(json.dumps(limits, sort_keys=True))
    tmp.replace(log_dir / LIMITS_FILE)


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
    limits: dict[str, Any] = {"devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    _save(logs, limits)
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
                    if _apply_limit(limits, command):
                        _save(logs, limits)
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
