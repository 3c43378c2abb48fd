"""Capped exponential back-off with jitter, for retrying API calls without spinning.

The jitter spreads the retries of many node daemons that all lost the API server at the
same moment, so they do not come back in lock-step.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

MAX_RETRY_AFTER: Final = 60.0
"""The longest Retry-After honoured; a bigger one is most likely a misconfigured proxy."""


@dataclass
class Backoff:
    """``initial`` doubling (``factor``) up to ``cap`` seconds, each delay ±``jitter``.

    ``next()`` gives the delay before the next attempt; ``reset()`` after a success.
    """

    initial: float = 0.1
    factor: float = 2.0
    cap: float = 10.0
    jitter: float = 0.2
    random: Callable[[], float] = field(default=random.random, repr=False)
    """Uniform in [0, 1); replaceable for deterministic tests."""
    _attempt: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.cap:
            raise ValueError(f"need 0 < initial ({self.initial}) <= cap ({self.cap})")
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1, got {self.factor}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")

    @property
    def attempts(self) -> int:
        """Failures since the last reset."""
        return self._attempt

    def next(self) -> float:
        """The delay before the next attempt; each call counts one more failure."""
        base = min(self.cap, self.initial * self.factor ** min(self._attempt, 64))
        self._attempt += 1
        return base * (1 + self.jitter * (2 * self.random() - 1))

    def honouring(self, retry_after: float | None) -> float:
        """``next()``, but at least what the server asked for (``Retry-After``)."""
        delay = self.next()
        if retry_after:
            delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
        return delay

    def at_cap(self) -> float:
        """A delay at the cap (with jitter), for failures that retrying soon cannot fix."""
        self._attempt = max(self._attempt, 64)
        return self.next()

    def reset(self) -> None:
        self._attempt = 0

    def fresh(self) -> Backoff:
        """A new back-off with the same parameters and no failures counted."""
        return Backoff(self.initial, self.factor, self.cap, self.jitter, self.random)
