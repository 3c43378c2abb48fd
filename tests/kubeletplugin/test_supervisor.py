"""Root-task supervision: restart with back-off, say what is down, give up on a task that
keeps dying."""

from __future__ import annotations

import asyncio

import pytest

from gpudra.kubeletplugin.node.supervisor import (
    RestartPolicy,
    RootTaskFailed,
    Supervisor,
    describe,
)
from tests.fake_time import FakeTime

FAST = RestartPolicy(initial=0.01, cap=0.05, max_deaths=4, window=60)


class Flaky:
    """A root task that raises its first ``failures`` runs, then runs until cancelled."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.runs = 0
        self.running = asyncio.Event()

    async def run(self) -> None:
        self.runs += 1
        if self.runs <= self.failures:
            await asyncio.sleep(0)
            raise RuntimeError(f"boom {self.runs}")
        self.running.set()
        await asyncio.Event().wait()


def supervised(policy: RestartPolicy) -> tuple[Supervisor, FakeTime]:
    clock = FakeTime()
    return Supervisor(policy, clock=clock.monotonic, sleep=clock.sleep), clock


async def test_a_dead_task_is_restarted_with_back_off_until_it_runs():
    supervisor, clock = supervised(FAST)
    task = Flaky(failures=3)
    supervisor.start("publisher", task.run)
    for deaths in range(1, 4):
        await clock.until_sleeping()  # waiting to restart, not restarted yet
        assert task.runs == deaths and not task.running.is_set()
        await clock.advance_to_next()
    await asyncio.wait_for(task.running.wait(), 5)
    assert task.runs == 4
    assert supervisor.problems() == []
    first, second, third = clock.slept
    assert 0.008 <= first <= 0.012 and 0.016 <= second <= 0.024 and third <= 0.05  # doubling
    await supervisor.stop()


async def test_problems_name_the_task_and_why_while_it_waits_to_restart():
    supervisor, clock = supervised(RestartPolicy(initial=5, cap=5, max_deaths=3, window=60))
    task = Flaky(failures=1)
    supervisor.start("publisher", task.run)
    await clock.until_sleeping()
    (line,) = supervisor.problems()
    assert line.startswith("publisher: not running: died with RuntimeError: boom 1")
    assert "restarting" in line
    await supervisor.stop()  # also cancels the pending restart
    assert task.runs == 1


async def test_a_task_that_keeps_dying_is_given_up_on():
    supervisor, clock = supervised(FAST)
    task = Flaky(failures=100)
    supervisor.start("publisher", task.run)
    for _ in range(FAST.max_deaths - 1):
        await clock.until_sleeping()
        await clock.advance_to_next()
    with pytest.raises(RootTaskFailed) as failed:
        await asyncio.wait_for(supervisor.failed(), 5)
    assert task.runs == FAST.max_deaths
    message = str(failed.value)
    assert message.startswith("root task publisher not running: gave up after 4 deaths "
                              "within 60 s")
    assert message.endswith("RuntimeError: boom 4")
    (line,) = supervisor.problems()
    assert line.startswith("publisher: not running: gave up")
    await supervisor.stop()


async def test_returning_counts_as_dying():
    supervisor, clock = supervised(RestartPolicy(initial=0.01, cap=0.01, max_deaths=2,
                                                 window=60))
    runs = []

    async def quits() -> None:
        runs.append(1)

    supervisor.start("quitter", quits)
    await clock.until_sleeping()
    await clock.advance_to_next()
    with pytest.raises(RootTaskFailed, match="the last with ended without an error"):
        await asyncio.wait_for(supervisor.failed(), 5)
    assert len(runs) == 2


async def test_deaths_older_than_the_window_do_not_count():
    supervisor, clock = supervised(RestartPolicy(initial=0.01, cap=0.01, max_deaths=2,
                                                 window=10))
    deaths = []
    alive = asyncio.Event()

    async def dies_once_per_window() -> None:
        deaths.append(clock.now)
        if len(deaths) == 5:
            alive.set()
            await asyncio.Event().wait()
        clock.now += 11  # it runs until the previous death has left the window
        raise RuntimeError("rare")

    supervisor.start("rare", dies_once_per_window)
    for _ in range(4):
        await clock.until_sleeping()
        await clock.advance_to_next()
    await asyncio.wait_for(alive.wait(), 5)
    assert len(deaths) == 5  # never two within 10 s: never given up
    assert supervisor.problems() == []
    await supervisor.stop()


async def test_a_name_runs_once():
    supervisor, _ = supervised(FAST)
    task = Flaky(failures=0)
    supervisor.start("publisher", task.run)
    with pytest.raises(ValueError, match="already running"):
        supervisor.start("publisher", task.run)
    await supervisor.stop()


def test_describe_looks_through_task_group_wrapping():
    group = ExceptionGroup("unhandled errors in a TaskGroup", [ValueError("bad code")])
    assert describe(group) == "ValueError: bad code"
    assert describe(KeyError()) == "KeyError"


def test_policy_is_checked():
    with pytest.raises(ValueError):
        RestartPolicy(initial=0)
    with pytest.raises(ValueError):
        RestartPolicy(max_deaths=0)
