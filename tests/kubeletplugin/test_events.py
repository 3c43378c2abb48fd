"""Idle Events on the pod, through real HTTP to the test API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest_asyncio
from prometheus_client import REGISTRY

from gpudra.api.claims import ClaimRef
from gpudra.kube.raw_api import RawApi
from gpudra.kube.session import ApiSession
from gpudra.kubeletplugin.cluster.events import IdleEvents, idle_message
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.fakeapi.fixtures import api_session, fake_api  # noqa: F401
from tests.kubeletplugin.test_claim_status import put_claim, transition, until

DRIVER = "gpu.nvidia.com"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest_asyncio.fixture
async def clock() -> Clock:
    return Clock()


@pytest_asyncio.fixture
async def recorder(api_session: ApiSession, clock: Clock  # noqa: F811
                   ) -> AsyncIterator[IdleEvents]:
    events = IdleEvents(RawApi(api_session), driver=DRIVER, node="node-a", cap=3,
                        window=600.0, clock=clock)
    task = asyncio.create_task(events.run())
    yield events
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def events(fake_api: FakeApiServer) -> list[dict]:  # noqa: F811
    return fake_api.list("events.events.k8s.io", "ns")


def sent(outcome: str) -> float:
    return REGISTRY.get_sample_value("gpudra_events_total",
                                     {"reason": "GPUClaimIdle", "outcome": outcome}) or 0.0


def test_the_message_says_which_gpu_how_long_and_how_busy():
    ref = ClaimRef("ns", "c1", "u1")
    assert idle_message(transition(ref, idle=True)) == \
        "GPU gpu-0 idle for 30m: 0\u20132 % SM, 1.0 GiB used"


async def test_an_idle_claim_gets_one_event_on_its_pod(
        recorder: IdleEvents, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    recorder.idle_changed(transition(ref, idle=True))
    await until(lambda: len(events(fake_api)) == 1)
    event = events(fake_api)[0]
    assert event["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ns",
                                  "name": "trainer-0", "uid": "pod-uid"}
    assert event["related"]["kind"] == "ResourceClaim"
    assert event["related"]["uid"] == ref.uid
    assert event["reportingController"] == DRIVER
    assert event["reportingInstance"] == "node-a"
    assert event["reason"] == "GPUClaimIdle"
    assert event["note"].startswith("GPU gpu-0 idle for 30m")
    # The same episode again (e.g. a repeated transition): no second event.
    recorder.idle_changed(transition(ref, idle=True))
    await asyncio.sleep(0.1)
    assert len(events(fake_api)) == 1
    # Active, then idle again: a new episode earns a new event.
    recorder.idle_changed(transition(ref, idle=False))
    recorder.idle_changed(transition(ref, idle=True))
    await until(lambda: len(events(fake_api)) == 2)


async def test_the_node_wide_cap_holds_back_a_flood(
        recorder: IdleEvents, fake_api: FakeApiServer, clock: Clock):  # noqa: F811
    capped = sent("capped")
    refs = [put_claim(fake_api, f"c{i}") for i in range(5)]
    for ref in refs:
        recorder.idle_changed(transition(ref, idle=True))
    await until(lambda: sent("capped") == capped + 2)
    assert len(events(fake_api)) == 3
    clock.now += 601  # the window has passed
    recorder.idle_changed(transition(refs[0], idle=False))
    recorder.idle_changed(transition(refs[0], idle=True))
    await until(lambda: len(events(fake_api)) == 4)


async def test_a_failed_event_is_counted_not_retried(
        recorder: IdleEvents, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    failed = sent("failed")
    fake_api.fail_next(1, status=500, verb="create", resource="events")
    recorder.idle_changed(transition(ref, idle=True))
    await until(lambda: sent("failed") == failed + 1)
    assert events(fake_api) == []
