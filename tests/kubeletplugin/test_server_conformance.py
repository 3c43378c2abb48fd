"""The server the daemon uses (:class:`PluginServer`: grpcio's ``grpc.server`` on two unix
sockets), over real gRPC: what the kubelet relies on.

Unary calls of every service (DRA v1, v1beta1, registration), health streams (order,
cancel, the limit), stop with grace (calls in flight answer, new ones are refused, the stop
is bounded), cancellation (a call cancelled before it ran runs no handler and cannot undo a
later call; one cancelled while running sees it), the statuses handler errors give, and the
sockets' modes whatever the umask.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpudra.api.claims import ClaimRef
from gpudra.api.proto import (
    DRA_V1_ADVERTISED,
    DRA_V1BETA1_ADVERTISED,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    health_v1_pb2,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from gpudra.driver import files
from gpudra.driver.health import DeviceHealth
from gpudra.kubeletplugin.serving import sockets
from gpudra.kubeletplugin.serving.health_service import HealthService
from gpudra.kubeletplugin.serving.interfaces import PrepareOutcome, always
from gpudra.kubeletplugin.serving.server import CALL_THREADS, PluginServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.kubeletplugin.conftest import DRIVER, Dirs, claim, eventually, gpu, watch

WAIT = 10.0
"""Seconds any wait here gives up after: a broken server fails the test, never hangs it."""


class Held:
    """A ClaimPreparer that records each call when it starts and holds the calls of the
    claims in :attr:`hold` until :meth:`release_all` or :meth:`let_go` names them (or,
    with :attr:`until_unwanted`,
    until ``wanted`` turns False); records what ``wanted`` said then."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.wanted_after_hold: list[bool] = []
        self.hold: set[str] = set()
        self.release = threading.Event()
        self.until_unwanted = False
        self.error: Exception | None = None
        self._released: set[str] = set()
        self._changed = threading.Condition()

    def prepare(self, claims: Sequence[ClaimRef], *,
                wanted: Callable[[], bool] = always) -> Mapping[str, PrepareOutcome]:
        self._run("prepare", claims, wanted)
        return {c.uid: PrepareOutcome(devices=(gpu(0),)) for c in claims}

    def unprepare(self, claims: Sequence[ClaimRef], *,
                  wanted: Callable[[], bool] = always) -> Mapping[str, str | None]:
        self._run("unprepare", claims, wanted)
        return {c.uid: None for c in claims}

    def _run(self, kind: str, claims: Sequence[ClaimRef], wanted: Callable[[], bool]) -> None:
        with self._changed:
            self.calls.append((kind, [c.uid for c in claims]))
            self._changed.notify_all()
        uids = {c.uid for c in claims}
        if self.hold & uids:
            if self.until_unwanted:  # until the server says nobody waits for the answer
                for _ in range(int(WAIT / 0.005)):
                    if not wanted():
                        break
                    time.sleep(0.005)
            else:
                with self._changed:
                    self._changed.wait_for(
                        lambda: self.release.is_set() or uids <= self._released, WAIT)
            self.wanted_after_hold.append(wanted())
        if self.error is not None:
            raise self.error

    def release_all(self) -> None:
        with self._changed:
            self.release.set()
            self._changed.notify_all()

    def let_go(self, *uids: str) -> None:
        """Release the held calls of these claims only."""
        with self._changed:
            self._released.update(uids)
            self._changed.notify_all()

    def started(self, count: int) -> bool:
        """Whether ``count`` calls have started (waits up to :data:`WAIT` seconds)."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.calls) >= count, WAIT)

    async def wait_started(self, count: int) -> None:
        assert await asyncio.to_thread(self.started, count), self.calls


@pytest.fixture
def held() -> Held:
    return Held()


@pytest.fixture
def preparer(held: Held) -> Held:
    """conftest's ``server`` and ``kubelet`` fixtures serve this preparer."""
    return held


@pytest.fixture
async def served(server: PluginServer, held: Held) -> AsyncIterator[PluginServer]:
    try:
        yield server
    finally:
        held.release_all()  # before conftest's stop, which waits for the calls' work


def dra_stub(channel: grpc.aio.Channel) -> Any:
    return dra_v1_pb2_grpc.DRAPluginStub(channel)


def prepare_request(*refs: ClaimRef) -> dra_v1_pb2.NodePrepareResourcesRequest:
    return dra_v1_pb2.NodePrepareResourcesRequest(claims=[
        dra_v1_pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs])


def unprepare_request(*refs: ClaimRef) -> dra_v1_pb2.NodeUnprepareResourcesRequest:
    return dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[
        dra_v1_pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs])


# --- unary calls -----------------------------------------------------------------------


@pytest.mark.parametrize("version", [DRA_V1_ADVERTISED, DRA_V1BETA1_ADVERTISED])
async def test_prepare_and_unprepare_of_either_dra_version_are_answered(
        served: PluginServer, dirs: Dirs, held: Held, version: str) -> None:
    async with await KubeletEmulator.discover(dirs.registrar, services=(version,)) as kubelet:
        assert kubelet.instance().service == version
        prepared = await kubelet.prepare([claim(1), claim(2)])
        assert set(prepared) == {"uid-1", "uid-2"}
        assert all(answer["error"] == "" for answer in prepared.values())
        assert await kubelet.unprepare([claim(1)]) == {"uid-1": {"error": ""}}
    assert held.calls == [("prepare", ["uid-1", "uid-2"]), ("unprepare", ["uid-1"])]


async def test_registration_answers_get_info_and_takes_the_kubelets_word(
        served: PluginServer) -> None:
    async with grpc.aio.insecure_channel(f"unix:{served.registration_socket_path}") as channel:
        stub = registration_pb2_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(registration_pb2.InfoRequest(), timeout=WAIT)
        assert (info.name, info.endpoint) == (DRIVER, str(served.dra_socket_path))
        assert list(info.supported_versions) == list(served.supported_versions)
        await stub.NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=True), timeout=WAIT)
    await asyncio.wait_for(served.registration.registered.wait(), WAIT)


async def test_many_concurrent_calls_are_all_answered(kubelet: KubeletEmulator,
                                                      held: Held) -> None:
    answers = await asyncio.gather(*(kubelet.prepare([claim(n)]) for n in range(40)))
    assert [set(answer) for answer in answers] == [{f"uid-{n}"} for n in range(40)]
    assert len(held.calls) == 40


async def test_a_full_pool_of_claim_calls_leaves_registration_and_health_served(
        dirs: Dirs, held: Held) -> None:
    # Registration has its own server; the DRA pool keeps max_streams threads for streams.
    health = HealthService("node-a", lambda: [DeviceHealth("gpu-0", "Healthy", "", 1.0)])
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, held,
                          health_servicer=health)
    await server.start()
    try:
        async with await KubeletEmulator.discover(dirs.registrar) as kubelet:
            held.hold = {f"uid-{n}" for n in range(CALL_THREADS)}
            calls = [asyncio.create_task(kubelet.prepare([claim(n)]))
                     for n in range(CALL_THREADS)]
            await held.wait_started(CALL_THREADS)
            assert (await kubelet.get_info()).name == DRIVER
            async with grpc.aio.insecure_channel(f"unix:{server.dra_socket_path}") as channel:
                stream = watch(channel)
                assert len((await asyncio.wait_for(stream.read(), WAIT)).devices) == 1
                stream.cancel()
            held.release_all()
            assert len(await asyncio.gather(*calls)) == CALL_THREADS
    finally:
        held.release_all()
        health.close()
        await server.stop(grace=0)


# --- health streams --------------------------------------------------------------------


class Changing:
    """A health source whose one device's message is the number of the change."""

    def __init__(self) -> None:
        self.number = 0

    def __call__(self) -> list[DeviceHealth]:
        return [DeviceHealth("gpu-0", "Healthy", str(self.number), 1.0)]


@pytest.fixture
async def health_served(dirs: Dirs, held: Held) -> AsyncIterator[tuple[PluginServer,
                                                                       HealthService]]:
    service = HealthService("node-a", max_streams=2)
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, held,
                          health_servicer=service)
    await server.start()
    try:
        yield server, service
    finally:
        service.close()
        await server.stop(grace=0)


async def test_a_health_stream_sends_every_change_in_order(
        health_served: tuple[PluginServer, HealthService]) -> None:
    server, service = health_served
    source = Changing()
    async with grpc.aio.insecure_channel(f"unix:{server.dra_socket_path}") as channel:
        stream = watch(channel)
        service.set_source(source)  # a stream opened before the devices are known waits
        messages = [(await asyncio.wait_for(stream.read(), WAIT)).devices[0].message]
        for number in range(1, 6):
            source.number = number
            service.notify()
            # Each notify is sent before the next is made: the stream cannot merge them.
            messages.append((await asyncio.wait_for(stream.read(), WAIT)).devices[0].message)
        assert messages == [str(n) for n in range(6)]
        stream.cancel()


async def test_a_cancelled_stream_ends_and_its_place_serves_a_new_one(
        health_served: tuple[PluginServer, HealthService]) -> None:
    server, service = health_served
    service.set_source(Changing())
    async with grpc.aio.insecure_channel(f"unix:{server.dra_socket_path}") as channel:
        streams = [watch(channel) for _ in range(service.max_streams)]
        for stream in streams:
            await asyncio.wait_for(stream.read(), WAIT)
        refused = watch(channel)
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await asyncio.wait_for(refused.read(), WAIT)
        assert failure.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        streams[0].cancel()
        assert await eventually(lambda: service.open_streams == service.max_streams - 1,
                                within=WAIT)
        again = health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1alpha1_pb2.NodeWatchResourcesRequest())
        response = await asyncio.wait_for(again.read(), WAIT)
        assert isinstance(response, health_v1alpha1_pb2.NodeWatchResourcesResponse)
        for stream in (*streams[1:], again):
            stream.cancel()
        assert await eventually(lambda: service.open_streams == 0, within=WAIT)


async def test_closing_the_health_service_ends_its_streams_with_ok(
        health_served: tuple[PluginServer, HealthService]) -> None:
    server, service = health_served
    service.set_source(Changing())
    async with grpc.aio.insecure_channel(f"unix:{server.dra_socket_path}") as channel:
        stream = watch(channel)
        assert isinstance(await asyncio.wait_for(stream.read(), WAIT),
                          health_v1_pb2.NodeWatchResourcesResponse)
        service.close()
        assert await asyncio.wait_for(stream.read(), WAIT) is grpc.aio.EOF
        assert await stream.code() == grpc.StatusCode.OK


# --- stop with grace -------------------------------------------------------------------


async def test_stop_lets_a_call_in_flight_answer_and_refuses_new_ones(
        served: PluginServer, kubelet: KubeletEmulator, held: Held) -> None:
    held.hold = {"uid-1"}
    prepare = asyncio.create_task(kubelet.prepare([claim(1)]))
    await held.wait_started(1)

    stop = asyncio.create_task(served.stop(grace=WAIT))
    # De-registered first: the registration socket goes before any DRA call is cut.
    assert await eventually(lambda: not served.registration_socket_path.exists(), within=WAIT)
    assert not stop.done()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.prepare([claim(2)])
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    held.release_all()

    assert (await prepare)["uid-1"]["error"] == ""
    await asyncio.wait_for(stop, WAIT)
    assert served.calls_finished
    assert not served.dra_socket_path.exists()
    assert [kind for kind, _ in held.calls] == ["prepare"]  # the refused call never ran


@pytest.mark.parametrize(("work_wait", "finished"), [(WAIT, True), (0.05, False)])
async def test_stop_after_the_grace_cancels_the_call_and_waits_a_bounded_time_for_its_work(
        dirs: Dirs, work_wait: float, finished: bool) -> None:
    # gRPC cancels the call when the grace ends, but its thread goes on (a MIG create half
    # done): stop waits `work_wait` for it, and says whether it ended.
    held = Held()
    held.hold = {"uid-1"}
    # Ends once it sees the cancellation, or works on until released after the stop.
    held.until_unwanted = finished
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, held)
    await server.start()
    try:
        async with await KubeletEmulator.discover(dirs.registrar) as kubelet:
            prepare = asyncio.create_task(kubelet.prepare([claim(1)]))
            await held.wait_started(1)
            stop = asyncio.create_task(server.stop(grace=0.05, work_wait=work_wait))
            with pytest.raises(grpc.aio.AioRpcError) as cancelled:
                await prepare
            assert cancelled.value.code() in {grpc.StatusCode.CANCELLED,
                                              grpc.StatusCode.UNAVAILABLE}
            await asyncio.wait_for(stop, WAIT)
            assert server.calls_finished is finished
            assert not server.dra_socket_path.exists()
    finally:
        held.release_all()
    # The handler learnt that nobody waits for its answer any more.
    assert await eventually(lambda: held.wanted_after_hold == [False], within=WAIT)


# --- cancellation ----------------------------------------------------------------------


async def test_a_call_cancelled_before_it_ran_runs_no_handler_and_undoes_no_later_call(
        served: PluginServer, kubelet: KubeletEmulator, held: Held) -> None:
    # Every pool thread busy: the kubelet's unprepare of claim 99 waits for one, the
    # kubelet cancels it, then prepares the claim again. The stale unprepare must never
    # run after that prepare, or the claim's devices are gone under a running pod.
    held.hold = {f"uid-{n}" for n in range(CALL_THREADS)}
    busy = [asyncio.create_task(kubelet.prepare([claim(n)])) for n in range(CALL_THREADS)]
    await held.wait_started(CALL_THREADS)
    async with grpc.aio.insecure_channel(f"unix:{served.dra_socket_path}") as channel:
        await channel.channel_ready()  # connected: the calls go out in the order made
        stale = dra_stub(channel).NodeUnprepareResources(unprepare_request(claim(99)),
                                                         timeout=WAIT)
        # The prepare goes on the same connection after it: gRPC hands both to the pool
        # in that order, and one thread is let go, so it takes the stale call first.
        again = dra_stub(channel).NodePrepareResources(prepare_request(claim(99)),
                                                       timeout=WAIT)
        stale.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stale
        held.let_go("uid-0")
        assert (await again).claims["uid-99"].error == ""
        held.release_all()
        await asyncio.gather(*busy)
    assert ("unprepare", ["uid-99"]) not in held.calls
    assert held.calls[-1] == ("prepare", ["uid-99"])


async def test_a_running_call_the_kubelet_cancels_sees_it(
        served: PluginServer, held: Held) -> None:
    held.hold = {"uid-1"}
    held.until_unwanted = True
    async with grpc.aio.insecure_channel(f"unix:{served.dra_socket_path}") as channel:
        call = dra_stub(channel).NodeUnprepareResources(unprepare_request(claim(1)),
                                                        timeout=WAIT)
        await held.wait_started(1)
        call.cancel()
        # `wanted` turns False (else the handler would wait WAIT and record True): the
        # preparer starts no device work for an answer nobody reads.
        assert await eventually(lambda: held.wanted_after_hold != [], within=2 * WAIT)
    assert held.wanted_after_hold == [False]


# --- statuses --------------------------------------------------------------------------


async def test_a_failing_driver_is_internal_naming_the_call_and_the_error(
        kubelet: KubeletEmulator, held: Held) -> None:
    held.error = RuntimeError("NVML is gone")
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await kubelet.prepare([claim(1)])
    assert failure.value.code() == grpc.StatusCode.INTERNAL
    assert "v1.NodePrepareResources" in failure.value.details()
    assert "RuntimeError: NVML is gone" in failure.value.details()
    held.error = None
    assert (await kubelet.prepare([claim(2)]))["uid-2"]["error"] == ""  # still serving


async def test_a_refused_registration_is_answered_with_unknown(served: PluginServer) -> None:
    async with grpc.aio.insecure_channel(f"unix:{served.registration_socket_path}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await registration_pb2_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                registration_pb2.RegistrationStatus(plugin_registered=False, error="no"),
                timeout=WAIT)
    assert failure.value.code() == grpc.StatusCode.UNKNOWN
    assert served.registration.error == "no" or await eventually(
        lambda: served.registration.error == "no", within=WAIT)


@pytest.mark.parametrize("socket", ["dra", "registration"])
async def test_an_unknown_method_is_unimplemented(served: PluginServer, socket: str) -> None:
    path = served.dra_socket_path if socket == "dra" else served.registration_socket_path
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/Nope")(
                b"", timeout=WAIT)
    assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_request_that_does_not_decode_is_internal_and_runs_no_handler(
        served: PluginServer, held: Held) -> None:
    method = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
    async with grpc.aio.insecure_channel(f"unix:{served.dra_socket_path}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await channel.unary_unary(method)(b"\xff\xff\xff", timeout=WAIT)
    assert failure.value.code() == grpc.StatusCode.INTERNAL
    assert held.calls == []


# --- socket and directory modes ----------------------------------------------------------


@pytest.fixture
def open_umask() -> Iterator[None]:
    """umask 000, as a careless init system may leave it; restored afterwards."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: os.PathLike[str]) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.usefixtures("open_umask")
async def test_sockets_and_the_directories_made_for_them_have_explicit_modes(
        dirs: Dirs, held: Held) -> None:
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, held)
    await server.start()
    try:
        assert mode(server.dra_socket_path) == sockets.SOCKET_MODE == 0o600
        assert mode(server.registration_socket_path) == 0o600
        for directory in (server.plugin_data_dir, dirs.plugins, dirs.registrar):
            assert mode(directory) == files.DIR_MODE == 0o750, directory
        async with await KubeletEmulator.discover(dirs.registrar) as kubelet:
            assert (await kubelet.prepare([claim(1)]))["uid-1"]["error"] == ""
    finally:
        await server.stop(grace=0)


@pytest.mark.usefixtures("open_umask")
async def test_an_open_plugin_dir_is_closed_and_the_kubelets_dir_left_alone(
        dirs: Dirs, held: Held) -> None:
    # An older build under umask 000 left the driver's directory 0777; the registrar dir
    # is the kubelet's, and its mode is the kubelet's business.
    data_dir = sockets.plugin_data_dir(dirs.plugins, DRIVER)
    data_dir.mkdir(parents=True)
    dirs.registrar.mkdir()
    data_dir.chmod(0o777)
    dirs.registrar.chmod(0o755)
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, held)
    await server.start()
    try:
        assert mode(data_dir) == 0o750
        assert mode(dirs.registrar) == 0o755
        assert mode(server.registration_socket_path) == 0o600
    finally:
        await server.stop(grace=0)


@pytest.mark.usefixtures("open_umask")
def test_binding_makes_a_socket_0600_under_umask_000_and_restores_the_umask(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        with sockets.binding(path):
            sock.bind(str(path))
            assert mode(path) & 0o177 == 0  # never more open, not even before the chmod
        assert mode(path) == 0o600
    assert os.umask(0) == 0  # restored (the fixture's 000)


def test_our_code_uses_grpcs_public_api_and_settings_only() -> None:
    # grpcio-tools' generated modules (api/proto/gen) are grpc's own business.
    root = Path(__file__).resolve().parents[2]
    layers = ("api", "driver", "kube", "controller", "kubeletplugin", "scheduling",
              "testing", "cli", "bench")
    found = [
        f"{path.relative_to(root)}: {word}"
        for layer in layers for path in sorted((root / layer).rglob("*.py"))
        if "gen" not in path.relative_to(root).parts
        for word in ("grpc._", "GRPC_EXPERIMENTS") if word in path.read_text()
    ]
    assert found == []
