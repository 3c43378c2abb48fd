"""Idle detection on injected time: quiet claims become idle, activity clears it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpudra.driver.usage import DeviceUsage, IdleTracker, IdleTransition


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def usage(sm: float, *, uid: str = "u1", device: str = "gpu-0",
          memory: int = 2**30) -> DeviceUsage:
    return DeviceUsage(claim_uid=uid, namespace="ns", claim=f"claim-{uid}", pods=("pod-a",),
                       device=device, gpu_uuid="GPU-x", sm_percent=sm,
                       memory_used_bytes=memory, memory_total_bytes=80 * 2**30,
                       sampled_at=0.0)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def seen() -> list[IdleTransition]:
    return []


@pytest.fixture
def tracker(clock: Clock, seen: list[IdleTransition]) -> IdleTracker:
    return IdleTracker(threshold_percent=5, idle_after=60, clock=clock, listeners=[seen.append])


def test_quiet_for_idle_after_makes_a_claim_idle_once(tracker, clock, seen):
    tracker.observe([usage(1)])
    assert tracker.idle_seconds("u1") == 0  # quiet from now on
    clock.now += 59
    assert tracker.observe([usage(3)]) == []
    assert not tracker.is_idle("u1") and tracker.idle_since("u1") is None
    clock.now += 1
    [became] = tracker.observe([usage(2)])
    assert became.idle and became.since == 1000.0 and became.at == 1060.0
    assert (became.sm_low, became.sm_high) == (1, 3)
    assert became.pods == ("pod-a",) and became.memory_used_bytes == 2**30
    assert tracker.is_idle("u1") and tracker.idle_since("u1") == 1000.0
    assert tracker.idle_seconds("u1") == 60
    clock.now += 600
    assert tracker.observe([usage(0)]) == []  # still idle: no second transition
    assert seen == [became]


def test_activity_clears_idle_and_restarts_the_clock(tracker, clock, seen):
    tracker.observe([usage(0)])
    clock.now += 60
    tracker.observe([usage(0)])
    clock.now += 10
    [active] = tracker.observe([usage(40)])
    assert not active.idle and active.since == 1000.0
    assert not tracker.is_idle("u1") and tracker.idle_seconds("u1") == 0
    clock.now += 30
    tracker.observe([usage(0)])
    clock.now += 59
    assert tracker.observe([usage(0)]) == []  # quiet again only 59 s
    assert [t.idle for t in seen] == [True, False]


def test_one_busy_device_keeps_the_whole_claim_active(tracker, clock):
    tracker.observe([usage(0, device="gpu-0"), usage(90, device="gpu-1")])
    clock.now += 120
    tracker.observe([usage(0, device="gpu-0"), usage(90, device="gpu-1")])
    assert not tracker.is_idle("u1")


def test_the_threshold_itself_is_activity(tracker, clock):
    tracker.observe([usage(5)])
    clock.now += 120
    tracker.observe([usage(5)])
    assert not tracker.is_idle("u1")


def test_claims_missing_from_a_complete_pass_are_forgotten(tracker, clock, seen):
    tracker.observe([usage(0, uid="a"), usage(0, uid="b")])
    clock.now += 60
    tracker.observe([usage(0, uid="a")])
    assert tracker.state("b") is None
    assert [t.claim_uid for t in seen] == ["a"]
    tracker.forget("a")
    assert tracker.state("a") is None and not tracker.is_idle("a")


def test_a_failing_listener_does_not_silence_the_others(clock):
    seen: list[IdleTransition] = []

    def broken(_: IdleTransition) -> None:
        raise RuntimeError("boom")

    tracker = IdleTracker(5, 0, clock=clock, listeners=[broken, seen.append])
    tracker.observe([usage(0)])
    assert [t.idle for t in seen] == [True]
