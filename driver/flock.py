"""Waiting for an exclusive ``flock`` with a deadline (the standard call can only block)."""

from __future__ import annotations

import fcntl
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
