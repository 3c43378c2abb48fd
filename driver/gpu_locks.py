"""Per-GPU locks: work on one physical GPU is serialised, work on different GPUs is not.

Each GPU has a thread lock (this process) and an ``flock`` file (other processes: two
daemon instances share the data directory during a rolling update). Several GPUs are
always taken in sorted order, so two callers can never wait for each other in a circle.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpudra.driver.files import FILE_MODE
from gpudra.driver.flock import reopened_lock_file, wait_for_flock


class GpuLockTimeout(TimeoutError):
    """A GPU stayed busy (another claim or daemon instance) for longer than allowed."""


class GpuLocks:
    """Lock files stay open between holds (one per GPU, released with ``LOCK_UN``): opening
    and closing one per claim was a measurable part of a prepare."""

    def __init__(self, directory: Path, *, poll: float = 0.01) -> None:
        self.directory = directory
        self._poll = poll
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._fds: dict[str, int] = {}
        self._paths: dict[str, str] = {}  # built once per GPU, not a Path per hold

    def _thread_lock(self, uuid: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(uuid, threading.Lock())

    def _lock_file(self, uuid: str) -> int:
        """The GPU's open lock file; the caller holds the GPU's thread lock."""
        path = self._paths.get(uuid)
        if path is None:
            path = self._paths[uuid] = str(self.directory / f"{uuid}.lock")
        fd = self._fds[uuid] = reopened_lock_file(path, self._fds.pop(uuid, None), FILE_MODE)
        return fd

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():  # dropped without close(): no leak
            os.close(fd)

    def close(self) -> None:
        """Close every lock file (releasing any flock still held)."""
        with self._guard:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    @contextlib.contextmanager
    def hold(self, uuids: Iterable[str], timeout: float = 30.0) -> Iterator[None]:
        """Hold every GPU in ``uuids`` (in sorted order) for the duration of the block."""
        deadline = time.monotonic() + timeout
        ordered = sorted(set(uuids))
        if len(ordered) == 1:  # a single-GPU claim, the common case: no ExitStack
            with self._one(ordered[0], deadline):
                yield
            return
        with contextlib.ExitStack() as stack:
            for uuid in ordered:
                stack.enter_context(self._one(uuid, deadline))
            yield

    @contextlib.contextmanager
    def _one(self, uuid: str, deadline: float) -> Iterator[None]:
        lock = self._thread_lock(uuid)
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise GpuLockTimeout(f"GPU {uuid} stayed busy with another claim")
        try:
            fd = self._lock_file(uuid)
            if not wait_for_flock(fd, deadline, self._poll):
                raise GpuLockTimeout(f"GPU {uuid} stayed busy in another daemon instance")
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            lock.release()
