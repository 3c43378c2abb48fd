"""Real grpc.aio calls over a unix socket through the generated stubs, and v1/v1beta1 wire
compatibility of the DRA messages."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from gpudra.api.proto import (
    DRA_PLUGIN_TYPE,
    DRA_V1_ADVERTISED,
    DRA_V1BETA1_ADVERTISED,
    HEALTH_V1_ADVERTISED,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)

CALL_TIMEOUT = 5.0


@contextlib.asynccontextmanager
async def serving(
    socket: Path, register: Callable[[grpc.aio.Server], None]
) -> AsyncIterator[grpc.aio.Channel]:
    """A grpc.aio server on ``socket`` and a channel to it; both stopped on exit."""
    server = grpc.aio.server()
    register(server)
    assert server.add_insecure_port(f"unix://{socket}") != 0
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            yield channel
    finally:
        await server.stop(grace=None)
    # one stat of a local path; not worth a thread
    assert not socket.exists(), "gRPC should remove its unix socket on stop"  # noqa: ASYNC240


def _dra_servicer(pb2: ModuleType, pb2_grpc: ModuleType, with_share_id: bool) -> Any:
    class Servicer(pb2_grpc.DRAPluginServicer):  # type: ignore[misc,name-defined]
        async def NodePrepareResources(self, request: Any, context: Any) -> Any:
            response = pb2.NodePrepareResourcesResponse()
            for claim in request.claims:
                if claim.name == "broken":
                    response.claims[claim.uid].error = f"cannot prepare {claim.namespace}/broken"
                    continue
                device = response.claims[claim.uid].devices.add(
                    request_names=["gpu"],
                    pool_name="node-a",
                    device_name="gpu-0",
                    cdi_device_ids=[f"k8s.gpu.nvidia.com/claim={claim.uid}-gpu-0"],
                )
                if with_share_id:
                    device.share_id = f"share-{claim.uid}"
            return response

        async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            response = pb2.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                response.claims[claim.uid].error = "" if claim.name != "broken" else "busy"
            return response

    return Servicer()


@pytest.mark.parametrize(
    ("pb2", "pb2_grpc", "with_share_id"),
    [(dra_v1_pb2, dra_v1_pb2_grpc, True), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc, False)],
    ids=["v1", "v1beta1"],
)
async def test_dra_prepare_and_unprepare(
    tmp_path: Path, pb2: ModuleType, pb2_grpc: ModuleType, with_share_id: bool
) -> None:
    servicer = _dra_servicer(pb2, pb2_grpc, with_share_id)
    claims = [
        pb2.Claim(namespace="ml", uid="uid-1", name="train"),
        pb2.Claim(namespace="ml", uid="uid-2", name="broken"),
    ]

    def register(server: grpc.aio.Server) -> None:
        pb2_grpc.add_DRAPluginServicer_to_server(servicer, server)

    async with serving(tmp_path / "dra.sock", register) as channel:
        stub = pb2_grpc.DRAPluginStub(channel)
        prepared = await stub.NodePrepareResources(
            pb2.NodePrepareResourcesRequest(claims=claims), timeout=CALL_TIMEOUT
        )
        unprepared = await stub.NodeUnprepareResources(
            pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=CALL_TIMEOUT
        )

    assert set(prepared.claims) == {"uid-1", "uid-2"}
    ok = prepared.claims["uid-1"]
    assert ok.error == ""
    [device] = ok.devices
    assert (list(device.request_names), device.pool_name, device.device_name) == (
        ["gpu"],
        "node-a",
        "gpu-0",
    )
    assert list(device.cdi_device_ids) == ["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"]
    if with_share_id:
        assert device.HasField("share_id")
        assert device.share_id == "share-uid-1"
    assert prepared.claims["uid-2"].error == "cannot prepare ml/broken"
    assert list(prepared.claims["uid-2"].devices) == []
    assert {uid: r.error for uid, r in unprepared.claims.items()} == {"uid-1": "", "uid-2": "busy"}


@pytest.mark.parametrize(
    ("pb2", "pb2_grpc"),
    [(health_v1alpha1_pb2, health_v1alpha1_pb2_grpc), (health_v1_pb2, health_v1_pb2_grpc)],
    ids=["v1alpha1", "v1"],
)
async def test_health_stream_delivers_every_response(
    tmp_path: Path, pb2: ModuleType, pb2_grpc: ModuleType
) -> None:
    def snapshot(health: int, updated: int, message: str) -> Any:
        return pb2.NodeWatchResourcesResponse(
            devices=[
                pb2.DeviceHealth(
                    device=pb2.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"),
                    health=health,
                    last_updated_time=updated,
                    health_check_timeout_seconds=30,
                    message=message,
                )
            ]
        )

    sent = [
        snapshot(pb2.HEALTHY, 1_700_000_000, ""),
        snapshot(pb2.UNHEALTHY, 1_700_000_005, "XID 79: GPU has fallen off the bus"),
    ]

    class Servicer(pb2_grpc.DRAResourceHealthServicer):  # type: ignore[misc,name-defined]
        async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
            for response in sent:
                yield response

    def register(server: grpc.aio.Server) -> None:
        pb2_grpc.add_DRAResourceHealthServicer_to_server(Servicer(), server)

    async with serving(tmp_path / "dra.sock", register) as channel:
        stub = pb2_grpc.DRAResourceHealthStub(channel)
        call = stub.NodeWatchResources(pb2.NodeWatchResourcesRequest(), timeout=CALL_TIMEOUT)
        received = [response async for response in call]
        assert await call.code() == grpc.StatusCode.OK

    assert received == sent
    assert received[1].devices[0].health == pb2.UNHEALTHY
    assert received[1].devices[0].message == "XID 79: GPU has fallen off the bus"


async def test_registration_get_info_and_status(tmp_path: Path) -> None:
    statuses: list[Any] = []
    endpoint = "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock"

    class Servicer(registration_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
        async def GetInfo(self, request: Any, context: Any) -> Any:
            return registration_pb2.PluginInfo(
                type=DRA_PLUGIN_TYPE,
                name="gpu.nvidia.com",
                endpoint=endpoint,
                supported_versions=[
                    DRA_V1_ADVERTISED,
                    DRA_V1BETA1_ADVERTISED,
                    HEALTH_V1_ADVERTISED,
                ],
            )

        async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
            statuses.append(request)
            return registration_pb2.RegistrationStatusResponse()

    def register(server: grpc.aio.Server) -> None:
        registration_pb2_grpc.add_RegistrationServicer_to_server(Servicer(), server)

    async with serving(tmp_path / "reg.sock", register) as channel:
        stub = registration_pb2_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(registration_pb2.InfoRequest(), timeout=CALL_TIMEOUT)
        await stub.NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=True), timeout=CALL_TIMEOUT
        )

    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", "gpu.nvidia.com", endpoint)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
    ]
    assert [(s.plugin_registered, s.error) for s in statuses] == [(True, "")]


def test_v1_device_with_share_id_survives_a_v1beta1_hop() -> None:
    v1 = dra_v1_pb2.Device(
        request_names=["gpu"],
        pool_name="node-a",
        device_name="gpu-0",
        cdi_device_ids=["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"],
        share_id="7f3c",
    )
    wire = v1.SerializeToString()

    beta = dra_v1beta1_pb2.Device.FromString(wire)  # field 5 is unknown here: kept, not fatal
    assert (list(beta.request_names), beta.pool_name, beta.device_name) == (
        ["gpu"],
        "node-a",
        "gpu-0",
    )
    assert list(beta.cdi_device_ids) == ["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"]
    assert beta.SerializeToString() == wire

    back = dra_v1_pb2.Device.FromString(beta.SerializeToString())
    assert back == v1
    assert back.share_id == "7f3c"


def test_prepare_responses_are_wire_compatible_both_ways() -> None:
    beta = dra_v1beta1_pb2.NodePrepareResourcesResponse()
    beta.claims["uid-1"].devices.add(pool_name="node-a", device_name="gpu-0")
    beta.claims["uid-2"].error = "no such device"

    as_v1 = dra_v1_pb2.NodePrepareResourcesResponse.FromString(beta.SerializeToString())
    [device] = as_v1.claims["uid-1"].devices
    assert (device.pool_name, device.device_name) == ("node-a", "gpu-0")
    assert not device.HasField("share_id")
    assert as_v1.claims["uid-2"].error == "no such device"

    as_v1.claims["uid-1"].devices[0].share_id = "s-1"
    again = dra_v1beta1_pb2.NodePrepareResourcesResponse.FromString(as_v1.SerializeToString())
    assert again.claims["uid-1"].devices[0].device_name == "gpu-0"
    assert (
        dra_v1_pb2.NodePrepareResourcesResponse.FromString(again.SerializeToString())
        .claims["uid-1"]
        .devices[0]
        .share_id
        == "s-1"
    )
