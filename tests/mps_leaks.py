"""Simulated MPS control daemons a test left running: found through ``/proc``, stopped, and
the leaked ones among them named.

A control daemon detaches itself (it must outlive the node daemon, :mod:`gpudra.driver.
mps_process`), so neither a crash worker that dies nor a temporary directory that is removed
takes it along: blocked on its control FIFO, it would run until the machine reboots. Each
test's processes inherit :data:`MARK_ENV` (set by ``tests/conftest.py``), and so do the
daemons they start, however deep: that mark, not a path, says which daemons are a test's own
(another engineer's run in the same checkout has other marks).

A daemon whose pipe directory is gone is a leak: whatever removed the directory (the driver
stopping a claim, a fixture cleaning up) should have stopped the daemon first, and no node
daemon can find it again. A daemon whose directory is still there is a prepared claim's,
which the driver keeps running by design; the test's clean-up stops it quietly.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from gpudra.driver import mps_process

MARK_ENV = "GPUDRA_TEST_MARK"
PROC = Path("/proc")
# The stand-in's command lines: `python -IS <SIM_CONTROL> [--daemonize] <pipe> <log>`, and
# `python -m gpudra.driver.sim.mps_daemon <pipe> <log>` from earlier versions.
_MODULE = b"gpudra.driver.sim.mps_daemon"
_SCRIPT = os.fsencode(mps_process.SIM_CONTROL)


@dataclass(frozen=True)
class SimDaemon:
    """A live simulated control daemon: its pid and the pipe directory it serves."""

    pid: int
    pipe_dir: Path

    @property
    def leaked(self) -> bool:
        """Running while its directory is gone: nothing can reach or adopt it any more."""
        return not self.pipe_dir.is_dir()


def _identify(pid: int, mark: str) -> SimDaemon | None:
    """``pid`` as a live simulated control daemon carrying ``mark``; else ``None``."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        environ = (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read (then not ours to stop either)
        return None
    if _SCRIPT in argv[:3]:
        rest = argv[argv.index(_SCRIPT) + 1:]
    elif _MODULE in argv[:4]:
        rest = argv[argv.index(_MODULE) + 1:]
    else:
        return None
    if f"{MARK_ENV}={mark}".encode() not in environ or not mps_process.alive(pid):
        return None
    args = [a for a in rest if a and a != b"--daemonize"]
    return SimDaemon(pid, Path(os.fsdecode(args[0]))) if args else None


def find(mark: str) -> list[SimDaemon]:
    """The live simulated control daemons started with ``mark`` in their environment."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            daemon = _identify(int(entry.name), mark)
            if daemon is not None:
                found.append(daemon)
    return found


def stop(daemon: SimDaemon, mark: str, timeout: float = 5.0) -> bool:
    """SIGTERM, then SIGKILL, each only while ``/proc`` still shows this very daemon (its
    pid may have been handed on); whether it is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if _identify(daemon.pid, mark) != daemon:
            return True
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon.pid, sig)
        if mps_process.wait_for(lambda: not mps_process.alive(daemon.pid), timeout):
            mps_process.reap(daemon.pid)
            return True
    return False


def stop_all(mark: str) -> list[SimDaemon]:
    """Stop every daemon carrying ``mark``; the leaked ones, judged before any was stopped
    (a stopped daemon removes its own pid file and FIFO)."""
    found = find(mark)
    leaked = [d for d in found if d.leaked]
    stubborn = [d for d in found if not stop(d, mark)]
    if stubborn:
        raise AssertionError(f"simulated MPS control daemons survived SIGKILL: {stubborn}")
    return leaked


def describe(leaked: list[SimDaemon]) -> str:
    return (f"{len(leaked)} simulated MPS control daemon(s) still ran after the test with "
            "their directories removed (stopped now): "
            + ", ".join(f"pid {d.pid} for {d.pipe_dir}" for d in leaked))
