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
LEAK_GRACE = 2.0
"""Seconds a daemon that looks leaked may take to exit by itself (only such a daemon waits)."""
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
        """Running while its directory is gone (nothing can reach or adopt it any more), and
        not already on its way out (a test may have killed it a moment ago)."""
        return not self.pipe_dir.is_dir() and not _exiting(self.pid)


_PF_EXITING = 0x4
"""``/proc/<pid>/stat`` flags: the kernel is tearing the process down."""
_ENDING = (1 << (signal.SIGKILL - 1)) | (1 << (signal.SIGTERM - 1))
"""Pending-signal bits that end a control daemon (it exits on SIGTERM too)."""


def _exiting(pid: int) -> bool:
    """Whether the process is gone, exiting, or has a SIGKILL or SIGTERM pending: a signal
    sent is not yet a process gone, and that gap is not a leak."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        return True
    # The command name in parentheses may contain spaces and ")": split after the last one;
    # then state, ppid, pgrp, session, tty, tpgid, flags.
    if int(stat.rsplit(")", 1)[1].split()[6]) & _PF_EXITING:
        return True
    pending = 0
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return bool(pending & _ENDING)


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
    # Every test's teardown runs this: only command lines that name the stand-in are looked
    # at closely (one raw read of each, keeps the scan cheap).
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            fd = os.open(f"{entry.path}/cmdline", os.O_RDONLY)
        except OSError:
            continue
        try:
            named = b"mps_daemon" in os.read(fd, 4096)
        except OSError:
            named = False
        finally:
            os.close(fd)
        if not named:
            continue
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
    suspects = [d for d in found if d.leaked]
    # One that handles a SIGTERM sent just before is neither pending nor exiting in the
    # kernel's eyes for a moment: it gets a grace to go by itself before it counts.
    mps_process.wait_for(lambda: not any(_identify(d.pid, mark) == d for d in suspects),
                         LEAK_GRACE)
    leaked = [d for d in suspects if _identify(d.pid, mark) == d]
    stubborn = [d for d in found if not stop(d, mark)]
    if stubborn:
        raise AssertionError(f"simulated MPS control daemons survived SIGKILL: {stubborn}")
    return leaked


def describe(leaked: list[SimDaemon]) -> str:
    return (f"{len(leaked)} simulated MPS control daemon(s) still ran after the test with "
            "their directories removed (stopped now): "
            + ", ".join(f"pid {d.pid} for {d.pipe_dir}" for d in leaked))
