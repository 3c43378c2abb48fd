"""Claim device status and idle Events end to end: the real daemon, the kubelet emulator over
unix sockets, the test API server over real HTTP (its validation of ``status.devices``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from gpudra.api.claims import ClaimRef
from gpudra.driver.sim import SimControl
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import DRIVER, Daemon, claim_object, node_daemon

GV = "resource.nvidia.com/v1beta1"
POD_UID = "11111111-2222-4333-8444-555555555555"


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    with node_daemon(fake_api, extra_args=("--usage-interval", "100ms",
                                           "--idle-after", "1s")) as d:
        yield d


@pytest.fixture
async def kubelet(daemon: Daemon) -> AsyncIterator[KubeletEmulator]:
    daemon.start()
    emulator = await KubeletEmulator.discover(daemon.registrar)
    try:
        yield emulator
    finally:
        await emulator.close()


async def eventually(check: Callable[[], Any], what: str, seconds: float = 15.0) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {seconds}s"
        await asyncio.sleep(0.05)
    return found


def entries(fake_api: FakeApiServer, ref: ClaimRef) -> list[dict[str, Any]]:
    claim = fake_api.get("ResourceClaim", ref.name, ref.namespace) or {}
    return list((claim.get("status") or {}).get("devices") or [])


def condition(entry: dict[str, Any], kind: str) -> str:
    return next((c["status"] for c in entry["conditions"] if c["type"] == kind), "-")


async def test_status_is_written_after_prepare_despite_failures_and_shows_idle(
        kubelet, daemon, fake_api):
    obj = claim_object("train", devices=["gpu-1"], configs=[
        {"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": GV, "kind": "GpuConfig", "computeMode": "ExclusiveProcess"}}}])
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": "trainer-0", "uid": POD_UID}]
    meta = fake_api.put(obj)["metadata"]
    ref = ClaimRef(meta["namespace"], meta["name"], meta["uid"])
    # The first status writes fail: prepare must not notice, the writer retries.
    fake_api.fail_next(2, status=503, verb="patch", resource="resourceclaims/status",
                       retry_after=None)
    assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""

    (entry,) = await eventually(lambda: entries(fake_api, ref), "status.devices written")
    assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, "node-a", "gpu-1")
    assert entry["data"]["computeMode"] == "ExclusiveProcess"
    assert entry["data"]["uuid"].startswith("GPU-")
    assert entry["data"]["cdiDeviceIDs"] == [f"k8s.{DRIVER}/claim={ref.uid}-gpu-1"]
    assert condition(entry, "Ready") == "True"
    assert fake_api.calls[("patch", "resourceclaims/status")] >= 3
    claim = fake_api.get("ResourceClaim", ref.name, ref.namespace) or {}
    assert any(m["manager"] == DRIVER and m.get("subresource") == "status"
               for m in claim["metadata"]["managedFields"])

    # No load on the simulated GPU: idle after 1 s → the Idle condition and one Event.
    await eventually(lambda: [e for e in entries(fake_api, ref) if condition(e, "Idle") == "True"],
                     "Idle condition")
    (event,) = await eventually(lambda: fake_api.list("events.events.k8s.io", ref.namespace),
                                "idle Event")
    assert event["regarding"]["name"] == "trainer-0"
    assert event["reportingController"] == DRIVER
    assert event["reportingInstance"] == "node-a"
    assert event["note"].startswith("GPU gpu-1 idle for")

    # A critical XID on the claim's GPU: the watcher taints it, the entry says why.
    SimControl(daemon.sim_state).raise_xid(1, 79)
    (entry,) = await eventually(
        lambda: [e for e in entries(fake_api, ref) if condition(e, "Healthy") == "False"],
        "Healthy=False after XID 79")
    healthy = next(c for c in entry["conditions"] if c["type"] == "Healthy")
    assert "79" in healthy["message"]

    assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    await eventually(lambda: not entries(fake_api, ref), "entries removed on unprepare")
