"""Registration over real sockets: the kubelet's handshake, version lists, failures."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import grpc
import pytest

from gpudra.api.proto import (
    DRA_V1_ADVERTISED,
    DRA_V1BETA1_ADVERTISED,
    HEALTH_V1_ADVERTISED,
    HEALTH_V1ALPHA1_ADVERTISED,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from gpudra.kubeletplugin.serving.server import PluginServer
from gpudra.testing.kubelet_emulator import KUBELET_SERVICES, KubeletEmulator, RegistrationError
from tests.kubeletplugin.conftest import DRIVER, Dirs, TestPreparer, claim


async def test_the_kubelet_registers_the_plugin(server, kubelet):
    [instance] = kubelet.instances
    assert instance.driver == DRIVER
    assert instance.endpoint == str(server.dra_socket_path)
    assert instance.service == DRA_V1_ADVERTISED
    assert server.registration.registered.is_set()
    assert server.registration.error is None


async def test_supported_versions_list_v1_first_and_no_health_by_default(server, kubelet):
    info = await kubelet.get_info()
    assert list(info.supported_versions) == [DRA_V1_ADVERTISED, DRA_V1BETA1_ADVERTISED]
    assert info.type == "DRAPlugin" and info.name == DRIVER


async def test_health_is_advertised_and_served_when_enabled(dirs: Dirs, preparer):
    health = FakeHealth()
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, preparer,
                          health_servicer=health)
    async with server, await KubeletEmulator.discover(dirs.registrar) as kubelet:
        info = await kubelet.get_info()
        assert list(info.supported_versions) == [
            DRA_V1_ADVERTISED, DRA_V1BETA1_ADVERTISED,
            HEALTH_V1_ADVERTISED, HEALTH_V1ALPHA1_ADVERTISED,
        ]
        assert server.supported_versions == tuple(info.supported_versions)
        channel = kubelet.instance().channel
        for pb2, pb2_grpc in ((health_v1_pb2, health_v1_pb2_grpc),
                              (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc)):
            stream = pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                pb2.NodeWatchResourcesRequest(), timeout=5)
            first = await stream.read()
            stream.cancel()
            assert first.devices[0].device.device_name == "gpu-0"


async def test_a_v1beta1_only_kubelet_picks_v1beta1(server, dirs):
    async with await KubeletEmulator.discover(
            dirs.registrar, services=(DRA_V1BETA1_ADVERTISED,)) as kubelet:
        assert kubelet.instance().service == DRA_V1BETA1_ADVERTISED
        response = await kubelet.prepare([claim(1)])
        assert response["uid-1"]["error"] == ""


async def test_a_refused_registration_is_recorded_and_answered_with_an_error(server, dirs):
    with pytest.raises(RegistrationError, match="none of services"):
        await KubeletEmulator.discover(dirs.registrar, services=("v1alpha3.NodeService",))
    assert not server.registration.registered.is_set()
    assert "none of services" in (server.registration.error or "")

    async with grpc.aio.insecure_channel(f"unix:{server.registration_socket_path}") as channel:
        stub = registration_pb2_grpc.RegistrationStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await stub.NotifyRegistrationStatus(
                registration_pb2.RegistrationStatus(plugin_registered=False, error="boom"),
                timeout=5)
    assert failure.value.code() == grpc.StatusCode.UNKNOWN
    assert failure.value.details() == "failed registration process: boom"

    # The kubelet retries from scratch; a later success sets the flag again.
    async with await KubeletEmulator.discover(dirs.registrar):
        await asyncio.wait_for(server.registration.registered.wait(), 1)
    assert server.registration.error is None


async def test_a_refusal_after_a_registration_leaves_it_confirmed(server, kubelet):
    """What the publisher waits for: confirmed once, never taken back by a later refusal
    (a restarted kubelet), while ``registered`` follows the kubelet's last word."""
    state = server.registration
    assert state.registered.is_set() and state.confirmed.is_set()
    async with grpc.aio.insecure_channel(f"unix:{server.registration_socket_path}") as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await registration_pb2_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                registration_pb2.RegistrationStatus(plugin_registered=False, error="restart"),
                timeout=5)
    assert not state.registered.is_set()
    assert state.confirmed.is_set()
    assert state.error == "restart"


async def test_a_refused_first_registration_confirms_nothing(server, dirs):
    with pytest.raises(RegistrationError):
        await KubeletEmulator.discover(dirs.registrar, services=("v1alpha3.NodeService",))
    assert not server.registration.confirmed.is_set()


async def test_a_watching_kubelet_registers_plugins_as_they_come_and_after_a_restart(
        dirs: Dirs, preparer):
    kubelet = KubeletEmulator(dirs.registrar)
    watching = asyncio.create_task(kubelet.watch())
    try:
        dirs.registrar.mkdir(parents=True)
        await asyncio.sleep(0.05)  # watching an empty directory
        assert kubelet.instances == []
        first = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, preparer)
        await first.start()
        try:
            await asyncio.wait_for(first.registration.confirmed.wait(), 5)
            await until(lambda: len(kubelet.instances) == 1)
            [instance] = kubelet.instances
        finally:
            await first.stop(grace=0)
        # The plugin restarts on the same socket path: a new socket, registered again.
        second = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, preparer)
        await second.start()
        try:
            await asyncio.wait_for(second.registration.confirmed.wait(), 5)
            await until(lambda: len(kubelet.instances) == 1
                        and kubelet.instances[0] is not instance)
            [again] = kubelet.instances
            assert again is not instance and again.endpoint == instance.endpoint
            assert (await kubelet.prepare([claim(1)]))["uid-1"]["error"] == ""
        finally:
            await second.stop(grace=0)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await kubelet.close()


async def test_a_watching_kubelet_retries_a_refused_plugin(server, dirs):
    kubelet = KubeletEmulator(dirs.registrar, services=("v1alpha3.NodeService",))
    watching = asyncio.create_task(kubelet.watch(retry=0.05))
    try:
        await until(lambda: server.registration_socket_path in kubelet.failures)
        assert "none of services" in kubelet.failures[server.registration_socket_path]
        assert "none of services" in (server.registration.error or "")
        kubelet.services = KUBELET_SERVICES  # the kubelet is upgraded; the retry succeeds
        await asyncio.wait_for(server.registration.confirmed.wait(), 5)
        await until(lambda: kubelet.failures == {} and len(kubelet.instances) == 1)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await kubelet.close()


async def test_the_emulator_refuses_an_endpoint_registered_twice(server, kubelet):
    with pytest.raises(RegistrationError, match="already registered"):
        await kubelet.register(server.registration_socket_path)
    assert len(kubelet.instances) == 1


async def test_the_emulator_ignores_hidden_files(server, dirs):
    (dirs.registrar / ".backup-reg.sock").write_text("not a socket")
    async with await KubeletEmulator.discover(dirs.registrar) as kubelet:
        assert [i.registration_socket for i in kubelet.instances] == [
            server.registration_socket_path]


async def test_get_info_answers_while_a_slow_prepare_is_in_flight(
        server, kubelet, preparer: TestPreparer):
    preparer.gate = threading.Event()
    prepare = asyncio.create_task(kubelet.prepare([claim(1)]))
    assert await asyncio.to_thread(preparer.entered.wait, 2)

    info = await asyncio.wait_for(kubelet.get_info(), 1)
    assert info.endpoint == str(server.dra_socket_path)
    assert not prepare.done()

    preparer.gate.set()
    assert (await prepare)["uid-1"]["error"] == ""


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


class FakeHealth:
    """A health servicer that reports one healthy device on both API versions."""

    max_streams = 2

    def add_to_server(self, server: Any) -> None:
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(_Health(health_v1_pb2), server)
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            _Health(health_v1alpha1_pb2), server)


class _Health:
    def __init__(self, pb2: ModuleType) -> None:
        self._pb2 = pb2

    def NodeWatchResources(self, request: Any, context: Any) -> Any:
        pb2 = self._pb2
        ended = threading.Event()
        context.add_callback(ended.set)
        yield pb2.NodeWatchResourcesResponse(devices=[pb2.DeviceHealth(
            device=pb2.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"),
            health=pb2.HealthStatus.HEALTHY,
        )])
        ended.wait(30)  # a stream stays open until the kubelet goes away
