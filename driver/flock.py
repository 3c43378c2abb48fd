"""Waiting for an exclusive ``flock`` with a deadline (the standard call can only block)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from gpudra.driver.files import PRIVATE_DIR_MODE, make_dirs, open_created


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
    directory; exactly ``mode`` and a private directory, whatever the umask) and ``fd``
    closed.

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
    make_dirs(Path(os.path.dirname(path)), PRIVATE_DIR_MODE)  # noqa: PTH120
    return open_created(path, os.O_RDWR, mode)
