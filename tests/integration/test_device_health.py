"""XID on a simulated GPU → taint in the published slice, Unhealthy on the kubelet stream,
not allocatable for claims that don't tolerate it; cleared on recovery."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from gpudra.api.proto import health_v1_pb2, health_v1_pb2_grpc
from gpudra.cli.main import main
from gpudra.scheduling.allocator import Allocator
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.integration.daemon import DRIVER, Daemon

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [yaml.safe_load(p.read_text())
           for p in (ROOT / "deploy" / "deviceclasses").glob("*.yaml")]


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    d = Daemon(fake_api.url, profile="l4-x4", extra_args=["--xid-quiet-period", "2"])
    d.start()
    yield d
    if d.process is not None and d.process.poll() is None:
        d.stop()
    shutil.rmtree(d.base, ignore_errors=True)


def taints(api: FakeApiServer, device: str) -> list[dict]:
    for s in api.list("ResourceSlice"):
        for d in s["spec"].get("devices", []):
            if d["name"] == device:
                return d.get("taints", [])
    return []


def wait_for(predicate, timeout: float = 5.0) -> None:
    """Wait for an event of the daemon's; fail if it never comes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def sim(daemon: Daemon, *args: str) -> None:
    assert main(["sim", *args, "--sim-state", str(daemon.sim_state)]) == 0


def gpu_claim(count: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": count}}]}}}


async def health_of(daemon: Daemon) -> dict[str, int]:
    sock = daemon.plugins / DRIVER / "dra.sock"
    async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
        stub = health_v1_pb2_grpc.DRAResourceHealthStub(channel)
        call = stub.NodeWatchResources(health_v1_pb2.NodeWatchResourcesRequest())
        response = await call.read()
        call.cancel()
    return {d.device.device_name: d.health for d in response.devices}


async def test_critical_xid_taints_reports_unhealthy_and_recovers(daemon, fake_api):
    wait_for(lambda: len(fake_api.list("ResourceSlice")) == 4)
    sim(daemon, "xid", "--gpu", "0", "--xid", "79")
    wait_for(lambda: bool(taints(fake_api, "gpu-0")))  # how fast: bench/xid_taint.py
    (taint,) = taints(fake_api, "gpu-0")
    assert (taint["key"], taint["value"], taint["effect"]) == ("gpu.nvidia.com/xid", "79",
                                                                 "NoSchedule")
    assert taints(fake_api, "gpu-1") == []
    health = await health_of(daemon)
    assert health["gpu-0"] == health_v1_pb2.UNHEALTHY
    assert health["gpu-1"] == health_v1_pb2.HEALTHY
    # the reference allocator (like the scheduler) skips the tainted GPU
    allocator = Allocator(fake_api.list("ResourceSlice"), CLASSES)
    three = allocator.allocate(gpu_claim(3), "node-a").result
    assert three is not None
    assert [r["device"] for r in three["devices"]["results"]] == ["gpu-1", "gpu-2", "gpu-3"]
    four = allocator.allocate(gpu_claim(4), "node-a")
    assert four.result is None
    assert "taint" in (four.blocking or "")
    # quiet period (2 s) without new critical XIDs: the taint clears
    wait_for(lambda: taints(fake_api, "gpu-0") == [], timeout=6)
    assert (await health_of(daemon))["gpu-0"] == health_v1_pb2.HEALTHY


async def test_application_xid_is_recorded_but_does_not_block(daemon, fake_api):
    wait_for(lambda: len(fake_api.list("ResourceSlice")) == 4)
    sim(daemon, "xid", "--gpu", "2", "--xid", "13")
    wait_for(lambda: bool(taints(fake_api, "gpu-2")))
    (taint,) = taints(fake_api, "gpu-2")
    assert (taint["value"], taint["effect"]) == ("13", "None")
    assert (await health_of(daemon))["gpu-2"] == health_v1_pb2.HEALTHY
    allocation = Allocator(fake_api.list("ResourceSlice"), CLASSES).allocate(gpu_claim(4),
                                                                              "node-a")
    assert allocation.result is not None
    assert len(allocation.result["devices"]["results"]) == 4
    await asyncio.sleep(0)
