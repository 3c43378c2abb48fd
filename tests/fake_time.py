"""A clock and a sleep for code under test, so that time moves only when the test says.

Components that wait (back-off, the claim-status writer, the supervisor, the publisher)
take ``monotonic`` and ``sleep`` callables; a test hands them :class:`FakeTime`'s, then
asserts the order of events: what happened before a deadline, what happened once the test
moved the clock past it. No test needs to sleep for real or bound elapsed seconds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class FakeTime:
    """Monotonic seconds that advance only through :meth:`advance`."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self.slept: list[float] = []
        """Every duration asked of :meth:`sleep`, in order."""

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        """Return once the test has advanced the clock by ``seconds`` (0: at once)."""
        self.slept.append(seconds)
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wakes: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._order), wakes))
        await wakes

    def sleeping(self) -> list[float]:
        """The deadlines of the sleeps still waiting, soonest first."""
        return sorted(at for at, _, wakes in self._sleepers if not wakes.done())

    async def advance(self, seconds: float) -> None:
        """Move the clock forward, waking each sleep whose deadline passes, in order."""
        target = self.now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            at, _, wakes = heapq.heappop(self._sleepers)
            self.now = max(self.now, at)
            if not wakes.done():
                wakes.set_result(None)
                await settle()
        self.now = target
        await settle()

    async def advance_to_next(self) -> None:
        """Move the clock to the soonest waiting sleep's deadline, waking just that one."""
        waiting = self.sleeping()
        if not waiting:
            raise AssertionError("nothing is sleeping")
        await self.advance(waiting[0] - self.now)

    async def until_sleeping(self, count: int = 1, seconds: float = 5.0) -> None:
        """Wait (on the loop, not the clock) until ``count`` sleeps are waiting."""
        async with asyncio.timeout(seconds):
            while len(self.sleeping()) < count:  # noqa: ASYNC110
                await asyncio.sleep(0.001)


async def settle(rounds: int = 5) -> None:
    """Let the tasks that are ready run (a few loop iterations)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
