"""The checkpoint's lock: one holder at a time across the threads and processes of a node."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from gpudra.driver.checkpoint_codec import CheckpointError
from gpudra.driver.files import FILE_MODE
from gpudra.driver.flock import reopened_lock_file, wait_for_flock

_POLL_SECONDS = 0.02


class CheckpointLockTimeout(CheckpointError):
    """Another process (or thread) held the checkpoint lock for longer than the timeout."""


class CheckpointLock:
    """A ``flock`` on ``path`` (two daemon instances during a rolling update) plus a
    re-entrant thread lock (``flock`` excludes other open files, not other threads sharing
    ours; the RLock does that, and makes nested holds in one thread re-entrant)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mutex = threading.RLock()
        self._depth = 0
        self._fd: int | None = None
        self._held = False

    @contextlib.contextmanager
    def held(self, timeout: float) -> Iterator[None]:
        deadline = time.monotonic() + timeout
        if not self._mutex.acquire(timeout=max(timeout, 0.0)):
            raise CheckpointLockTimeout(
                f"timed out after {timeout:g}s waiting for checkpoint lock {self.path}"
                " (held by another thread of this process)"
            )
        try:
            if self._depth == 0:
                self._flock(deadline, timeout)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._held:
                    assert self._fd is not None
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    self._held = False
        finally:
            self._mutex.release()

    def _flock(self, deadline: float, timeout: float) -> None:
        kept, self._fd = self._fd, None  # not ours until reopened_lock_file returns
        fd = self._fd = reopened_lock_file(str(self.path), kept, FILE_MODE)
        if not wait_for_flock(fd, deadline, _POLL_SECONDS):
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise CheckpointLockTimeout(
                f"timed out after {timeout:g}s waiting for checkpoint lock"
                f" {self.path} (held by pid {holder}); is another gpudra"
                " node daemon running on this node (rolling update)?"
            )
        self._held = True
        # Diagnostics only: the holder's pid, for the next waiter's timeout message. Fixed
        # width, so it overwrites the last holder's without a truncate.
        os.pwrite(fd, f"{os.getpid():<20}\n".encode(), 0)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._held = False

    def close(self) -> None:
        """Close the lock file (a hold is released with it)."""
        with self._mutex:
            self._close()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:  # dropped without close(): do not leak the fd
            os.close(fd)
