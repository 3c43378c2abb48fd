"""Log each distinct failure of a retry loop once, not once per retry, and its recovery once."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


class FailureLog:
    """Failures seen since the last success; one already seen goes to debug.

    A retry loop calls ``failed`` on every failed attempt and ``recovered`` after a success,
    so the log shows every distinct failure once, with its context, and one line when the
    trouble ends. ``key`` says what makes two failures "the same" (e.g. verb and status).
    """

    def __init__(self, logger: Any, *, level: str = "warning") -> None:
        self._log = logger
        self._level = level
        self._seen: set[Hashable] = set()
        self.retries = 0

    @property
    def failing(self) -> bool:
        return bool(self._seen)

    def failed(self, key: Hashable, event: str, **fields: Any) -> bool:
        """Log ``event`` unless a failure with this ``key`` was logged since the last
        success; True if it was logged."""
        self.retries += 1
        if key in self._seen:
            self._log.debug(event, retry=self.retries, **fields)
            return False
        self._seen.add(key)
        getattr(self._log, self._level)(event, **fields)
        return True

    def recovered(self, event: str, **fields: Any) -> None:
        """Log ``event`` if anything failed since the last success, then forget it all."""
        if self._seen:
            self._log.info(event, failed_attempts=self.retries, **fields)
        self._seen.clear()
        self.retries = 0
