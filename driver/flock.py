"""Waiting for an exclusive ``flock`` with a deadline (the standard call can only block)."""

from __future__ import annotations

import fcntl
import os
import time


def wait_for_flock(fd: int, deadline: float, poll: float) -> bool:
    """Take an exclusive flock on ``fd``, polling until ``deadline`` (monotonic clock).

    Returns ``False`` on timeout; the caller owns ``fd`` either way and says who waited
    for what in its own error.
    """
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(poll, remaining))


def reopened_lock_file(path: str, fd: int | None, mode: int) -> int:
    """``fd`` while it is still the file at ``path``, else ``path`` opened (created, with its
    directory) and ``fd`` closed.

    Lock files stay open between holds (opening one is a path walk per kubelet call); one
    removed or replaced meanwhile would be locked in vain, so the one there now is locked.
    """
    if fd is not None:
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):  # noqa: PTH116 - per call: no Path
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    os.makedirs(os.path.dirname(path), exist_ok=True)  # noqa: PTH103, PTH120
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
