"""The DRAResourceHealth stream over a real unix socket, fed by the monitor over the sim."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import grpc
import pytest

from gpudra.api.proto import (
    HEALTH_V1_ADVERTISED,
    HEALTH_V1ALPHA1_ADVERTISED,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from gpudra.driver import sim
from gpudra.driver.device_model import build_devices
from gpudra.driver.devices import NodeDevices
from gpudra.driver.health import DeviceHealth, HealthPolicy
from gpudra.driver.health_monitor import HealthMonitor
from gpudra.driver.inventory import read_inventory, simulated_pcie_root
from gpudra.driver.nvml import Nvml
from gpudra.kubeletplugin.serving.health_service import HealthService, truncate
from gpudra.kubeletplugin.serving.server import PluginServer

from .conftest import DRIVER, Dirs, TestPreparer, eventually, health_server, watch

POOL = "node-a"
VERSIONS = {
    "v1": (health_v1_pb2, health_v1_pb2_grpc),
    "v1alpha1": (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
}


@dataclass
class Setup:
    server: PluginServer
    service: HealthService
    monitor: HealthMonitor
    devices: NodeDevices
    control: sim.SimControl

    def channel(self) -> Any:
        return grpc.aio.insecure_channel(f"unix:{self.server.dra_socket_path}")


@pytest.fixture
async def setup(simulate, sim_state, dirs: Dirs, preparer: TestPreparer) -> AsyncIterator[Setup]:
    simulate("l4-x4")
    nvml = Nvml()
    devices = build_devices(read_inventory(nvml, pcie_root=simulated_pcie_root))
    loop = asyncio.get_running_loop()
    service: HealthService | None = None

    def on_change() -> None:  # watcher thread → event loop, as the daemon wires it
        assert service is not None
        loop.call_soon_threadsafe(service.notify)

    monitor = HealthMonitor(nvml, [str(d.attributes["uuid"]) for d in devices.devices],
                            HealthPolicy(quiet_period=0.5), on_change, wait_ms=50,
                            probe_interval=0.1)
    service = HealthService(POOL, lambda: monitor.device_health(devices), resend_interval=60)
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, preparer,
                          health_servicer=service)
    monitor.start()
    await server.start()
    try:
        yield Setup(server, service, monitor, devices, sim.SimControl(sim_state))
    finally:
        await server.stop(grace=0)
        monitor.stop()


async def _next(call: Any) -> dict[str, tuple[str, str]]:
    """Device → (status name, message) of the next response, checking the fixed fields."""
    response = await asyncio.wait_for(call.read(), timeout=3)
    assert response is not grpc.aio.EOF
    out = {}
    for health in response.devices:
        assert health.device.pool_name == POOL
        assert health.health_check_timeout_seconds == 60
        assert health.last_updated_time > 1_600_000_000
        out[health.device.device_name] = (
            type(response).DESCRIPTOR.file.enum_types_by_name["HealthStatus"]
            .values_by_number[health.health].name, health.message)
    return out


async def _until(call: Any, predicate: Callable[[dict[str, tuple[str, str]]], bool]) -> dict[
        str, tuple[str, str]]:
    for _ in range(10):
        report = await _next(call)
        if predicate(report):
            return report
    raise AssertionError("the stream never reported the expected health")


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
async def test_stream_reports_an_xid_and_the_recovery(setup: Setup, version: str) -> None:
    pb, pb_grpc = VERSIONS[version]
    async with setup.channel() as channel:
        call = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            pb.NodeWatchResourcesRequest())
        first = await _next(call)
        assert first == dict.fromkeys(["gpu-0", "gpu-1", "gpu-2", "gpu-3"], ("HEALTHY", ""))

        await asyncio.to_thread(setup.control.raise_xid, 2, 79)
        report = await _until(call, lambda r: r["gpu-2"][0] == "UNHEALTHY")
        assert {name: status for name, (status, _) in report.items()} == {
            "gpu-0": "HEALTHY", "gpu-1": "HEALTHY", "gpu-2": "UNHEALTHY", "gpu-3": "HEALTHY"}
        assert report["gpu-2"][1].startswith("critical XID 79 on GPU-")

        # quiet_period=0.5 s: the taint clears and the stream says so without being asked
        report = await _until(call, lambda r: r["gpu-2"][0] == "HEALTHY")
        assert {status for status, _ in report.values()} == {"HEALTHY"}
        call.cancel()


async def test_application_xid_stays_healthy_with_a_message(setup: Setup) -> None:
    async with setup.channel() as channel:
        call = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest())
        await _next(call)
        await asyncio.to_thread(setup.control.raise_xid, 1, 13)
        report = await _until(call, lambda r: bool(r["gpu-1"][1]))
        assert report["gpu-1"][0] == "HEALTHY"
        assert "application XID 13" in report["gpu-1"][1]
        [device] = [d for d in setup.monitor.apply(setup.devices).devices if d.taints]
        assert [(t.key, t.value, t.effect) for t in device.taints] == [
            ("gpu.nvidia.com/xid", "13", "None")]
        call.cancel()


async def test_a_lost_gpu_is_unhealthy_until_it_answers(setup: Setup) -> None:
    async with setup.channel() as channel:
        call = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest())
        await _next(call)
        await asyncio.to_thread(setup.control.set_gpu_lost, 3, True)
        report = await _until(call, lambda r: r["gpu-3"][0] == "UNHEALTHY")
        assert "GPU_IS_LOST" in report["gpu-3"][1]
        await asyncio.to_thread(setup.control.set_gpu_lost, 3, False)
        await _until(call, lambda r: r["gpu-3"][0] == "HEALTHY")
        call.cancel()


async def test_registration_advertises_both_health_versions(setup: Setup) -> None:
    assert setup.server.supported_versions[-2:] == (HEALTH_V1_ADVERTISED,
                                                    HEALTH_V1ALPHA1_ADVERTISED)


async def test_streams_up_to_the_limit_all_get_changes_and_none_leaks(setup: Setup) -> None:
    """Each stream holds a server thread: up to ``max_streams`` are served, more refused."""
    limit = setup.service.max_streams
    async with setup.channel() as channel:
        calls = [
            VERSIONS[v][1].DRAResourceHealthStub(channel).NodeWatchResources(
                VERSIONS[v][0].NodeWatchResourcesRequest())
            for v in (["v1", "v1alpha1"] * limit)[:limit]
        ]
        for call in calls:
            await _next(call)
        assert setup.service.open_streams == limit
        setup.service.notify()
        for call in calls:
            assert len(await _next(call)) == 4

        extra = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(extra.read(), timeout=3)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert setup.service.open_streams == limit

        for call in calls:
            call.cancel()
        await _all_closed(setup.service)
        again = health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1alpha1_pb2.NodeWatchResourcesRequest())
        assert len(await _next(again)) == 4  # the freed places serve new streams
        again.cancel()
        await _all_closed(setup.service)


@pytest.mark.parametrize("leave", ["cancel", "close the channel"])
async def test_a_stream_whose_kubelet_leaves_gives_its_thread_back_at_once(
        setup: Setup, leave: str) -> None:
    """The resend interval is 60 s: a stream that noticed only when next writing would
    hold its server thread that long (and a restarting kubelet would pile them up)."""
    channel = setup.channel()
    call = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        health_v1_pb2.NodeWatchResourcesRequest())
    await _next(call)
    assert setup.service.open_streams == 1
    # The thread is inside the stream's generator only while it waits for the next change
    # (not while gRPC sends what it yielded): look until it is back there.
    assert await eventually(lambda: _threads_in_streams() == 1)
    if leave == "cancel":
        call.cancel()
    else:  # the kubelet process went away with its connection
        await channel.close()
    await _all_closed(setup.service)
    assert await eventually(lambda: _threads_in_streams() == 0)
    await channel.close()


async def test_the_stream_repeats_itself_periodically(dirs: Dirs, preparer: TestPreparer) -> None:
    """Without changes, a stream is re-sent every ``resend_interval`` (fresh timestamps)."""
    times = iter(range(1_700_000_000, 1_800_000_000))
    service = HealthService(POOL, lambda: [DeviceHealth("gpu-0", "Healthy", "", next(times))],
                            resend_interval=0.05, health_check_timeout=0)
    async with health_server(dirs, preparer, service) as (_, channel):
        call = watch(channel)
        sent = [await asyncio.wait_for(call.read(), timeout=3)]  # at once
        started = time.monotonic()
        for _ in range(3):  # and then without being asked
            sent.append(await asyncio.wait_for(call.read(), timeout=3))
        assert time.monotonic() - started >= 3 * 0.05  # not more often than asked
        stamps = [m.devices[0].last_updated_time for m in sent]
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
        call.cancel()
        await _all_closed(service)


async def _all_closed(service: HealthService) -> None:
    """Wait (briefly) until the server has ended every stream."""
    assert await eventually(lambda: service.open_streams == 0)


def _threads_in_streams() -> int:
    """Threads running a health stream right now (a server thread held by one)."""
    stream = HealthService.stream.__code__
    count = 0
    for frame in sys._current_frames().values():
        current: FrameType | None = frame
        while current is not None and current.f_code is not stream:
            current = current.f_back
        count += current is not None
    return count


def test_messages_are_cut_to_the_kubelet_limit() -> None:
    assert truncate("x" * 1024) == "x" * 1024
    assert truncate("x" * 2000) == "x" * 1021 + "..."
