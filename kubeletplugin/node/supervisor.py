"""The node daemon's root tasks, kept running: a task that dies is restarted with back-off,
and one that keeps dying takes the daemon down, so the pod restarts instead of a node that
silently stopped doing its job.

Every root task is meant to run until cancelled; returning counts as dying too. What is not
running, and why, is readable from any thread (``problems()``, for ``/readyz``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from gpudra.kube.backoff import Backoff

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a dead root task after a back-off of ``initial`` doubling up to ``cap``
    seconds; give up when it died ``max_deaths`` times within ``window`` seconds."""

    initial: float = 0.2
    cap: float = 10.0
    max_deaths: int = 5
    window: float = 60.0

    def __post_init__(self) -> None:
        Backoff(self.initial, cap=self.cap)  # raises on a bad initial/cap
        if self.max_deaths < 1 or self.window <= 0:
            raise ValueError(f"need max_deaths >= 1 and window > 0, got {self.max_deaths} "
                             f"and {self.window}")


class RootTaskFailed(Exception):
    """A root task kept dying; the daemon cannot go on without it."""


def describe(error: BaseException) -> str:
    """``Type: message``, looking through the one-member groups ``TaskGroup`` raises."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class Supervisor:
    """Runs named root tasks on the event loop and keeps them running (see module doc)."""

    def __init__(self, policy: RestartPolicy | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._policy = policy or RestartPolicy()
        self._clock = clock
        self._sleep = sleep
        self._keepers: dict[str, asyncio.Task[None]] = {}
        self._lock = threading.Lock()  # guards _down: /readyz reads it from its thread
        self._down: dict[str, str] = {}  # task name → why it is not running
        self._failed: asyncio.Future[RootTaskFailed] | None = None

    def start(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run ``run()`` as the root task ``name``, again each time it ends."""
        if name in self._keepers:
            raise ValueError(f"root task {name!r} is already running")
        if self._failed is None:
            self._failed = asyncio.get_running_loop().create_future()
        self._keepers[name] = asyncio.create_task(self._keep(name, run), name=f"keep:{name}")

    def problems(self) -> list[str]:
        """One line per root task that is not running, saying why; empty when all run."""
        with self._lock:
            return [f"{name}: {why}" for name, why in sorted(self._down.items())]

    async def failed(self) -> None:
        """Return never; raise :class:`RootTaskFailed` once a root task is given up on."""
        if self._failed is None:
            self._failed = asyncio.get_running_loop().create_future()
        raise await asyncio.shield(self._failed)

    async def stop(self) -> None:
        """Cancel every root task (and pending restart) and wait for them to end."""
        keepers = list(self._keepers.values())
        for keeper in keepers:
            keeper.cancel()
        await asyncio.gather(*keepers, return_exceptions=True)

    async def _keep(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        policy = self._policy
        backoff = Backoff(policy.initial, cap=policy.cap)
        deaths: deque[float] = deque()
        while True:
            self._set_down(name, None)
            try:
                await run()
                reason = "ended without an error"
                error: BaseException | None = None
            except Exception as exc:  # any bug in the task; cancellation passes through
                reason, error = describe(exc), exc
            now = self._clock()
            while deaths and now - deaths[0] > policy.window:
                deaths.popleft()
            if not deaths:
                backoff.reset()  # a task that ran quietly for a whole window starts afresh
            deaths.append(now)
            if len(deaths) >= policy.max_deaths:
                why = (f"not running: gave up after {len(deaths)} deaths within "
                       f"{policy.window:g} s, the last with {reason}")
                self._set_down(name, why)
                log.error("root task keeps dying; stopping the daemon", task=name,
                          deaths=len(deaths), error=reason, exc_info=error)
                assert self._failed is not None
                if not self._failed.done():
                    self._failed.set_result(RootTaskFailed(f"root task {name} {why}"))
                return
            delay = backoff.next()
            self._set_down(name, f"not running: died with {reason} ({len(deaths)} in the "
                                 f"last {policy.window:g} s); restarting")
            log.error("root task died; restarting", task=name, error=reason,
                      restart_in=round(delay, 3), deaths=len(deaths), exc_info=error)
            await self._sleep(delay)
            log.info("restarting root task", task=name)

    def _set_down(self, name: str, why: str | None) -> None:
        with self._lock:
            if why is None:
                self._down.pop(name, None)
            else:
                self._down[name] = why
