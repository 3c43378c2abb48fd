"""Stand-in for ``nvidia-cuda-mps-control -d`` on a simulated node.

Writes ``<pipe>/nvidia-cuda-mps-control.pid`` and creates ``<pipe>/control`` (a FIFO), logs
every command to ``<log>/control.log`` like the real daemon, writes ``<log>/startup.log`` when
ready, and exits on ``quit`` or SIGTERM. Killed with SIGKILL it leaves both files behind, as
the real one does.

The limit commands the real control shell accepts (``set_default_active_thread_percentage``,
``set_default_device_pinned_mem_limit``, and their per-server forms taking a server PID)
are checked and kept in ``<log>/limits.txt`` (:func:`read_limits`), so tests see which
limits a daemon enforces; a command the real shell would reject lands in ``rejected``.

It runs as a script (``python -IS mps_daemon.py``) and imports ``os``, ``sys`` and ``signal``
only: the real binary is up almost at once, and the stand-in should cost no more than an
interpreter's start (importing ``json``, ``pathlib`` and ``typing`` would add to every start).
So paths are strings, and the limits file is a Python literal, read back with
``ast.literal_eval``.
"""

# os.path, not pathlib: pathlib's own imports (re, urllib.parse) would slow the start-up.
# ruff: noqa: PTH103, PTH105, PTH108, PTH110, PTH118, PTH123

from __future__ import annotations

import os
import signal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: never imported at run time
    from typing import Any

REPLY = "#reply"
"""Not a real MPS command: the runner asks the daemon to touch a file once it has read the
lines before (the real control client waits for the daemon's answer too)."""


LIMITS_FILE = "limits.txt"


def read_limits(log_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """What a (simulated) control daemon was told: defaults, per-server limits, rejects."""
    import ast  # the reader's import, not the daemon's start-up

    path = os.path.join(log_dir, LIMITS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as file:
        limits: dict[str, Any] = ast.literal_eval(file.read())
    return limits


def _memory(text: str) -> bool:
    """A pinned memory limit as the shell takes it: digits, then ``M`` or ``G`` or nothing."""
    digits = text[:-1] if text[-1:] in ("M", "G") else text
    return digits.isdecimal()  # what the pattern \d+ matches


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
        ok = len(args) == 2 and _memory(args[1])
        if ok:
            limits.setdefault("defaultDevicePinnedMemLimit", {})[args[0]] = args[1]
    elif name == "set_active_thread_percentage":
        ok = len(args) == 2 and args[0].isdigit() and _percentage(args[1]) is not None
        if ok:
            limits.setdefault("servers", {}).setdefault(args[0], {})[
                "activeThreadPercentage"] = int(args[1])
    elif name == "set_device_pinned_mem_limit":
        ok = len(args) == 3 and args[0].isdigit() \
            and _memory(args[2])
        if ok:
            limits.setdefault("servers", {}).setdefault(args[0], {}).setdefault(
                "devicePinnedMemLimit", {})[args[1]] = args[2]
    else:
        return False
    if not ok:
        limits.setdefault("rejected", []).append(command)
    return True


def _save(log_dir: str, limits: dict[str, Any]) -> None:
    path = os.path.join(log_dir, LIMITS_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as file:
        file.write(repr(limits))
    os.replace(path + ".tmp", path)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)


def main(pipe: str, logs: str) -> None:
    os.makedirs(pipe, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    control = os.path.join(pipe, "control")
    pid_file = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
    if os.path.exists(control):
        try:
            fd = os.open(control, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader: left by a daemon that was killed (SIGKILL)
            os.unlink(control)
        else:  # another daemon serves this pipe directory, as the real one refuses
            os.close(fd)
            sys.stderr.write("An instance of this daemon is already running\n")
            os._exit(1)
    _write(pid_file, f"{os.getpid()}\n")
    # SIGTERM exits through the `finally` below (Python's default would skip it).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.mkfifo(control)
    log = open(os.path.join(logs, "control.log"), "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    log.write(f"[sim] MPS control daemon started pid={os.getpid()} "
              f"devices={os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
    limits: dict[str, Any] = {"devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    _save(logs, limits)
    _write(os.path.join(logs, "startup.log"), "ready\n")
    try:
        while True:
            with open(control, encoding="utf-8") as fifo:
                for line in fifo:
                    command = line.strip()
                    if not command:
                        continue
                    if command.startswith(REPLY + " "):
                        _write(command.removeprefix(REPLY + " "), "")
                        continue
                    log.write(f"[sim] {command}\n")
                    if command == "quit":
                        return
                    if _apply_limit(limits, command):
                        _save(logs, limits)
    finally:
        for path in (control, pid_file):
            if os.path.exists(path):
                os.unlink(path)
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
    # No interpreter tear-down: like the real daemon, gone once it has cleaned up.
    try:
        main(args[0], args[1])
    except SystemExit:  # SIGTERM, after main's clean-up
        os._exit(0)
    os._exit(0)
