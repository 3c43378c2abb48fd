"""Processes the node daemon starts but does not parent: MPS control daemons.

A control daemon detaches itself (fork + ``setsid``), so it is re-parented to init and
outlives the node daemon. Its pid is then only a number in a file: before it is trusted
(adopted, signalled) ``/proc`` must show an MPS control daemon whose environment carries the
claim's :data:`OWNER_ENV` mark, so a pid the kernel has since given to another process is
neither adopted nor killed. A mark of our own rather than ``CUDA_MPS_PIPE_DIRECTORY``: a
command run chrooted into the driver root sees the pipe directory under another path.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from gpudra.driver import files

# What the first arguments of a control daemon's command line name: the real binary, or
# the simulated node's stand-in (``python -IS <SIM_CONTROL>``; ``python -m
# gpudra.driver.sim.mps_daemon`` in earlier versions, still adopted).
CONTROL_NAMES = frozenset({"nvidia-cuda-mps-control", "gpudra.driver.sim.mps_daemon"})
SIM_CONTROL = Path(__file__).resolve().parent / "sim" / "mps_daemon.py"
"""The simulated control daemon, run as a script: ``-m`` would import the simulator package
(and pynvml) first, about 170 modules where the script needs 35, a cost the real binary
does not have."""
CONTROL = "nvidia-cuda-mps-control"
"""The control binary (here, not in :mod:`gpudra.driver.mps`: the command of a daemon's pod
needs it without that module's imports)."""
OWNER_ENV = "GPUDRA_MPS_OWNER"
"""Set in a control daemon's environment to :func:`owner_mark` of its claim directory."""
PROC = Path("/proc")


def read_pid(path: Path) -> int | None:
    """The pid in a pid file; ``None`` when it is missing or not a positive number."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def write_pid(path: Path, pid: int) -> None:
    """Write a pid file atomically (a reader never sees half a number), only ours to read."""
    files.atomic_write(path, f"{pid}\n".encode(), tmp=path.with_name(path.name + ".tmp"),
                       mode=files.FILE_MODE, durable=False)


def _state(pid: int) -> str | None:
    """The one-letter state of a process (``R``, ``S``, ``Z``, ...); ``None`` if it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may contain spaces and ")": split after the last one.
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    """Whether a process runs; a zombie (exited, not yet reaped) does not."""
    return _state(pid) not in (None, "Z", "X")


def owner_mark(claim_dir: Path) -> str:
    """The value of :data:`OWNER_ENV` for a claim's daemon (not a path, so a runner that
    maps paths into a chroot passes it on unchanged)."""
    return f"gpudra:{claim_dir}"


def pod_owner_mark(claim_dir: Path) -> str:
    """:data:`OWNER_ENV` of a daemon running in a pod of its own: never equal to
    :func:`owner_mark`, so the plugin never signals or adopts it as its own child."""
    return f"gpudra-pod:{claim_dir}"


def is_control_daemon(pid: int, claim_dir: Path) -> bool:
    """Whether ``pid`` is a live MPS control daemon started for ``claim_dir``.

    The environment a process was started with cannot change, so a reused pid fails the
    check even if it is another claim's control daemon.
    """
    if not alive(pid):
        return False
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        environ = (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile, or not ours to read: not ours to touch either
        return False
    names = {Path(a.decode(errors="replace")).name for a in argv[:3]}
    if not names & CONTROL_NAMES and str(SIM_CONTROL).encode() not in argv[:3]:
        return False
    return f"{OWNER_ENV}={owner_mark(claim_dir)}".encode() in environ


def wait_for(done: Callable[[], bool], timeout: float) -> bool:
    """Poll ``done`` until it holds or ``timeout`` passes; whether it held.

    The pause starts at half a millisecond and doubles up to 20 ms: a control daemon is up,
    or gone after ``quit``, within the first few pauses, and a fixed pause of the longest
    length was most of a first share's prepare and a last share's unprepare.
    """
    deadline = time.monotonic() + timeout
    pause = 0.0005
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
    return True


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait until the process is gone (or a zombie); whether it went in time."""
    if not wait_for(lambda: not alive(pid), timeout):
        return False
    reap(pid)
    return True


def reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child (it is when we are PID 1 and it was
    re-parented to us); waiting for this one pid leaves other children to their owners."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def terminate(pid: int, claim_dir: Path, timeout: float) -> bool:
    """SIGTERM, then SIGKILL, each with ``timeout`` to exit; the identity is checked before
    each signal. Whether the process is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not is_control_daemon(pid, claim_dir):
            reap(pid)
            return True
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if wait_exit(pid, timeout):
            return True
    return False
