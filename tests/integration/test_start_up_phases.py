"""``gpudra node`` starts in two phases: the kubelet sockets answer first, the node's devices,
checkpoint and API client follow. Claim calls that arrive in between wait for them, and get
an error (not a hang) when they fail. ``gpudra node`` as a real process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import pytest

from gpudra.api.claims import ClaimRef
from gpudra.api.proto import health_v1_pb2, health_v1_pb2_grpc
from gpudra.kubeletplugin.serving.grpc_probe import answers_get_info
from gpudra.kubeletplugin.serving.sockets import dra_socket_path
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import DRIVER, Daemon, create_claim, node_daemon

DISCOVERY = 3.0
"""Seconds the discovery step is made to take (GPUDRA_DELAY_AT)."""


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    # No background kubelet: each test registers (or not) by itself.
    with node_daemon(fake_api, kubelet=False,
                     env={"GPUDRA_DELAY_AT": f"start:discovery={DISCOVERY:g}"}) as d:
        yield d


async def answering(daemon: Daemon, within: float) -> float:
    """Seconds from now until the registration socket answers ``GetInfo``."""
    sock = daemon.registrar / f"{DRIVER}-reg.sock"
    started = time.monotonic()
    while not (sock.exists() and await asyncio.to_thread(answers_get_info, sock, 0.5)):
        assert daemon.process is not None and daemon.process.poll() is None, daemon.output()
        assert time.monotonic() - started < within, daemon.output()
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_get_info_answers_before_device_discovery_ends(daemon):
    daemon.start(wait=False)
    await answering(daemon, within=DISCOVERY - 0.5)
    assert "node daemon running" not in daemon.output()
    # ... and goes on answering while the devices are discovered (off the event loop).
    started = time.monotonic()
    while not any(e["event"] == "discovering devices" for e in daemon.events()):
        assert time.monotonic() - started < DISCOVERY, daemon.output()
        await asyncio.sleep(0.01)
    assert await answering(daemon, within=0.5) < 0.5
    assert "node daemon running" not in daemon.output()
    daemon.wait_registered()


async def test_a_prepare_sent_during_discovery_waits_and_then_succeeds(daemon, fake_api):
    ref = create_claim(fake_api, "early", devices=["gpu-0"])
    never_prepared = ClaimRef("default", "gone", "00000000-0000-4000-8000-0000000000aa")
    daemon.start(wait=False)
    await answering(daemon, within=DISCOVERY - 0.5)
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        sent = time.monotonic()
        prepared, unprepared = await asyncio.gather(kubelet.prepare([ref]),
                                                    kubelet.unprepare([never_prepared]))
        waited = time.monotonic() - sent
        assert prepared[ref.uid]["error"] == ""
        assert [d["device_name"] for d in prepared[ref.uid]["devices"]] == ["gpu-0"]
        assert unprepared[never_prepared.uid]["error"] == ""
        assert waited > 1.0  # the calls waited for discovery, which had seconds left
        daemon.wait_registered()
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert daemon.stop() == 0


async def test_health_streams_opened_early_get_the_whole_device_list_first(daemon):
    daemon.start(wait=False)
    await answering(daemon, within=DISCOVERY - 0.5)
    socket = dra_socket_path(daemon.plugins, DRIVER)
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        call = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest())
        first = await asyncio.wait_for(call.read(), timeout=DISCOVERY + 10)
        names = {h.device.device_name for h in first.devices}
        # Not an empty list while the devices were unknown: every GPU of dgx-h100.
        assert {f"gpu-{i}" for i in range(8)} <= names
        assert {h.health for h in first.devices} == {health_v1_pb2.HEALTHY}
        call.cancel()


async def test_a_phase_two_failure_answers_waiting_calls_and_removes_the_sockets(daemon,
                                                                                   fake_api):
    # Discovery takes seconds, then fails: the call sent meanwhile gets the reason.
    ref = create_claim(fake_api, "waiting", devices=["gpu-0"])
    daemon.env["GPUDRA_FAIL_AT"] = "start:discovery"
    daemon.start(wait=False)
    await answering(daemon, within=DISCOVERY - 0.5)
    socket = dra_socket_path(daemon.plugins, DRIVER)
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet, \
            grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        # A kubelet also keeps a health stream open: it must not hold the exit up.
        stream = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest())
        sent = time.monotonic()
        answer = await kubelet.prepare([ref])
        assert time.monotonic() - sent < DISCOVERY + 10  # not the kubelet's 45 s timeout
        assert daemon.process is not None
        assert await asyncio.to_thread(daemon.process.wait, 20) == 1
        assert time.monotonic() - sent < DISCOVERY + 5  # not the 10 s shutdown grace
        assert await stream.read() is grpc.aio.EOF  # ended, never sent a list
    reason = "InjectedFault: injected fault at start:discovery (GPUDRA_FAIL_AT)"
    assert answer[ref.uid] == {
        "devices": [], "error": f"claim {ref}: the node daemon failed to start: {reason}"}
    assert daemon.fatal_errors() == [reason]  # one line, as for any start-up failure
    assert "Traceback" not in daemon.output()
    assert daemon.sockets() == []
