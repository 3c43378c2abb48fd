"""The real slice publisher against the API stand-in as 1.34+ (v1), 1.33 (v1beta2) and 1.32
(v1beta1): it finds the version by discovery, publishes a complete pool the server takes
whole (nothing rejected, nothing dropped), leaves out what the release lacks with one
warning, reaches a steady state that writes nothing, and repairs a wipe."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import structlog

from gpudra.controller.publisher import SlicePublisher
from gpudra.controller.slice_features import supported
from gpudra.driver import sim
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.devices import NodeDevices, Taint
from gpudra.driver.gpu_shares import ALL
from gpudra.driver.inventory import NodeInventory, read_inventory, simulated_pcie_root
from gpudra.driver.nvml import open_nvml
from gpudra.kube.backoff import Backoff
from gpudra.kube.resource_versions import NEWER_FEATURES
from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi import FakeApiServer
from gpudra.testing.fakeapi.samples import node as node_object

DRIVER = "gpu.nvidia.com"
NODE = "node-1"
WARNING = "the API server's resource.k8s.io version lacks features some devices need; " \
          "publishing without them"
MODES = ["v1", "v1beta2", "v1beta1"]


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeInventory]:
    nvml = open_nvml(simulate="dgx-h100", sim_state=tmp_path_factory.mktemp("sim"))
    try:
        yield read_inventory(nvml, pcie_root=simulated_pcie_root)
    finally:
        nvml.shutdown()
        sim.uninstall()


@pytest.fixture(scope="module")
def everything(inventory: NodeInventory) -> NodeDevices:
    """Every feature at once: dynamic MIG (counters), shares (consumable capacity), and on
    gpu-1 an XID taint (NoSchedule), on gpu-2 an information-only one (None)."""
    devices = build_devices(inventory, ModelOptions(dynamic_mig=True, shareable=ALL))
    taints = {"gpu-1": Taint("gpu.nvidia.com/xid", "79", "NoSchedule"),
              "gpu-2": Taint("gpu.nvidia.com/xid", "13", "None")}
    return dataclasses.replace(devices, devices=tuple(
        dataclasses.replace(d, taints=(taints[d.name],)) if d.name in taints else d
        for d in devices.devices))


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def api(mode: str) -> Iterator[FakeApiServer]:
    with FakeApiServer(resource_api=mode) as server:
        server.put(node_object(NODE))
        yield server


@contextlib.asynccontextmanager
async def publishing(api: FakeApiServer, devices: NodeDevices,
                     resource_api: str = "auto") -> AsyncIterator[SlicePublisher]:
    async with ApiSession.for_url(api.url, resource_api=resource_api) as session:
        publisher = SlicePublisher(session, driver=DRIVER, node_name=NODE, resync_delay=0.02,
                                   backoff=Backoff(initial=0.05, cap=0.5))
        publisher.update(devices)
        task = asyncio.create_task(publisher.run())
        try:
            async with asyncio.timeout(30):
                yield publisher
            assert not task.done(), "the publisher stopped"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def settled(publisher: SlicePublisher) -> None:
    async with asyncio.timeout(20):
        while not (publisher.synced.is_set() and publisher.settled()):  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def published_devices(api: FakeApiServer) -> list[dict[str, Any]]:
    return [d for s in api.list("ResourceSlice") for d in s["spec"].get("devices") or []]


def slice_names(api: FakeApiServer) -> list[str]:
    return sorted(s["metadata"]["name"] for s in api.list("ResourceSlice"))


def rejected(api: FakeApiServer) -> list[str]:
    return [f"{r.verb} {r.path}: {r.status}" for r in api.requests if r.status >= 400]


async def test_the_pool_is_published_in_the_served_version_and_taken_whole(
        api: FakeApiServer, mode: str, everything: NodeDevices) -> None:
    with structlog.testing.capture_logs() as logs:
        async with publishing(api, everything) as publisher:
            await settled(publisher)
            writes = publisher.stats()["writes"]
            # A steady state: another round finds nothing to write.
            publisher.update(dataclasses.replace(everything))
            await settled(publisher)
            assert publisher.stats()["writes"] == writes
    # Every request went to the version the server prefers, and none was refused.
    paths = {r.path.split("/")[3] for r in api.requests if r.path.startswith("/apis/resource")}
    assert paths == {mode}
    assert rejected(api) == []
    assert api.pruned == []  # nothing the release does not know was sent
    assert api.pool_problems(DRIVER) == []
    names = {d["name"] for d in published_devices(api)}
    warnings = [e for e in logs if e["event"] == WARNING]
    if mode == "v1":
        assert names == {d.name for d in everything.devices}
        assert warnings == []
        return
    expected, _ = supported(everything, NEWER_FEATURES)
    assert names == {d.name for d in expected.devices}
    # What is left: the full GPUs but the one with the NoSchedule taint; no MIG placement,
    # no share (nothing would keep them apart from the full GPU), no counters, no taints.
    assert names == {f"gpu-{i}" for i in range(8)} - {"gpu-1"}
    for device in published_devices(api):
        assert not {"consumesCounters", "taints", "allowMultipleAllocations"} & set(device)
    assert not any(s["spec"].get("sharedCounters") for s in api.list("ResourceSlice"))
    # One warning, however many rounds built the slices.
    assert len(warnings) == 1, warnings
    assert "partitionable devices" in warnings[0]["left_out"]


@pytest.mark.parametrize("mode", ["v1beta2", "v1beta1"])
async def test_a_beta_server_stores_what_a_beta_client_reads(api: FakeApiServer, mode: str,
                                                             everything: NodeDevices) -> None:
    async with publishing(api, everything) as publisher:
        await settled(publisher)
    [gpu0] = [s for s in api.list("ResourceSlice") if s["metadata"]["name"].endswith("-gpu-0")]
    flat = gpu0["spec"]["devices"][0]
    device = api.shown_as("v1beta1", gpu0)["spec"]["devices"][0]
    assert device == {"name": "gpu-0", "basic": {"attributes": flat["attributes"],
                                                 "capacity": flat["capacity"]}}
    assert device["basic"]["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}


async def test_a_wipe_is_repaired_in_the_served_version(api: FakeApiServer, mode: str,
                                                        everything: NodeDevices) -> None:
    async with publishing(api, everything) as publisher:
        await settled(publisher)
        before = slice_names(api)
        for name in before:
            api.delete("ResourceSlice", name)
        async with asyncio.timeout(20):
            while slice_names(api) != before:  # noqa: ASYNC110 (the server's own thread)
                await asyncio.sleep(0.01)
        await settled(publisher)
    assert rejected(api) == [] and api.pruned == []


@pytest.mark.parametrize("pinned", MODES)
async def test_a_pinned_version_is_used_or_said_not_served(api: FakeApiServer, mode: str,
                                                           pinned: str,
                                                           everything: NodeDevices) -> None:
    served = MODES[MODES.index(mode):]
    said = f"--resource-api-version {pinned}: the API server does not serve " \
           f"resource.k8s.io/{pinned} (it serves: {', '.join(served)})"
    with structlog.testing.capture_logs() as logs:
        async with publishing(api, everything, resource_api=pinned) as publisher:
            if pinned in served:
                await settled(publisher)
                paths = {r.path.split("/")[3] for r in api.requests
                         if r.path.startswith("/apis/resource")}
                assert paths == {pinned}
                assert rejected(api) == [] and api.pruned == []
                return
            async with asyncio.timeout(20):
                while not any(said in str(e.get("error")) for e in logs):  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
    # Nothing was sent to a version the server does not serve.
    assert [r.path for r in api.requests if r.path.startswith("/apis/resource")] == []
    assert api.list("ResourceSlice") == []
