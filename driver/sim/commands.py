"""The simulated node's ``nvidia-smi`` and ``nvidia-cuda-mps-control``.

Time slices are kept in ``<state>/commands.json``; an MPS control daemon is a real
stand-in process (``gpudra/driver/sim/mps_daemon.py``, run as a script) listening on the
``control`` FIFO in its pipe directory, as the real daemon does, so start, configure and
quit are observable.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpudra.driver import files, mps_process
from gpudra.driver.commands import CommandError
from gpudra.driver.files import CHILD_UMASK
from gpudra.driver.sim.mps_daemon import REPLY

STARTUP_TIMEOUT = 5.0


class SimulatedCommandRunner:
    """Implements :class:`gpudra.driver.commands.CommandRunner` for a simulated node."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        files.make_dirs(self.state_dir, files.DIR_MODE)
        lock = files.open_created(self.state_dir / "commands.lock", os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.state_dir / "commands.json"
            data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
            yield data
            files.atomic_write(path, json.dumps(data, sort_keys=True).encode(),
                               tmp=path.with_suffix(".tmp"), mode=0o640, durable=False)
        finally:
            os.close(lock)  # closing releases the flock

    def time_slices(self) -> dict[str, int]:
        with self._locked() as data:
            return dict(data.get("timeslice", {}))

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            stdin: str | None = None) -> str:
        env = dict(env or {})
        if argv[:2] == ["nvidia-smi", "compute-policy"]:
            return self._compute_policy(list(argv[2:]))
        if argv[0] == "nvidia-cuda-mps-control":
            return self._mps_control(list(argv[1:]), env, stdin or "")
        raise CommandError(f"{argv[0]}: command not found (simulated node)")

    def _compute_policy(self, args: list[str]) -> str:
        try:
            uuid = args[args.index("-i") + 1]
            value = int(args[args.index("--set-timeslice") + 1])
        except (ValueError, IndexError) as exc:
            raise CommandError(f"nvidia-smi compute-policy {' '.join(args)}: bad arguments"
                               ) from exc
        if value not in (0, 1, 2, 3):
            raise CommandError(f"nvidia-smi compute-policy: invalid timeslice {value}")
        with self._locked() as data:
            data.setdefault("timeslice", {})[uuid] = value
        return f"Set timeslice to {value} for GPU {uuid}\n"

    def _mps_control(self, args: list[str], env: dict[str, str], stdin: str) -> str:
        pipe = Path(env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
        logs = Path(env.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
        control = pipe / "control"
        if args == ["-d"]:
            if control.exists():
                if _listening(control):
                    raise CommandError("nvidia-cuda-mps-control -d: An instance of this daemon "
                                       "is already running")
                control.unlink()  # left by a daemon that was killed
            # Like the real `-d`: the launcher forks the daemon off and returns at once; its
            # own session keeps it out of our process group's signals (Ctrl-C, a group kill).
            # A script with stdlib imports only, isolated (-I) and without site (-S): an
            # interpreter start as cheap as it gets, not the simulator package's imports.
            subprocess.run(
                [sys.executable, "-IS", str(mps_process.SIM_CONTROL), "--daemonize", str(pipe),
                 str(logs)],
                env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, check=True, timeout=STARTUP_TIMEOUT,
                start_new_session=True, umask=CHILD_UMASK)  # as CommandRunner.run does
            if not mps_process.wait_for(control.exists, STARTUP_TIMEOUT):
                raise CommandError("nvidia-cuda-mps-control -d: daemon did not start")
            return ""
        lines = stdin if stdin.endswith("\n") else stdin + "\n"
        quitting = "quit" in (line.strip() for line in lines.splitlines())
        # Like the real client, return once the daemon has handled the commands: it
        # answers by creating the reply file named in the last line.
        reply = pipe / f"reply-{os.getpid()}-{threading.get_ident()}"
        reply.unlink(missing_ok=True)
        if not quitting:
            lines += f"{REPLY} {reply}\n"
        fd = _open_writer(control)
        with os.fdopen(fd, "w") as fifo:
            fifo.write(lines)
        # quit: until the daemon has gone; anything else: until it answered
        if not mps_process.wait_for((lambda: not control.exists()) if quitting
                                    else reply.exists, STARTUP_TIMEOUT):
            raise CommandError("nvidia-cuda-mps-control: no answer from the MPS control "
                               f"daemon in {STARTUP_TIMEOUT:g}s")
        reply.unlink(missing_ok=True)
        return ""


def _listening(control: Path) -> bool:
    try:
        os.close(_open_writer(control, timeout=0.2))
    except CommandError:
        return False
    return True


def _open_writer(control: Path, timeout: float = STARTUP_TIMEOUT) -> int:
    """Open the daemon's FIFO for writing without blocking forever on a dead daemon.

    A blocking open would wait for a reader that never comes; non-blocking fails with ENXIO
    while no one reads, which is also the short moment the daemon re-opens between clients.
    """
    deadline = time.monotonic() + timeout
    pause = 0.0005  # the daemon re-opens within a millisecond or so
    while True:
        try:
            fd = os.open(control, os.O_WRONLY | os.O_NONBLOCK)
        except FileNotFoundError as exc:
            raise CommandError("nvidia-cuda-mps-control: cannot find MPS control daemon "
                               "process") from exc
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise CommandError("nvidia-cuda-mps-control: cannot find MPS control daemon "
                                   f"process ({exc.strerror})") from exc
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
            continue
        os.set_blocking(fd, True)  # the write itself may wait for the daemon to read
        return fd
