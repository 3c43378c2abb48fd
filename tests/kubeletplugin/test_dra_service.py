"""NodePrepareResources / NodeUnprepareResources over real sockets, v1 and v1beta1."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
import pytest
import structlog

from gpudra.api.claims import ClaimRef
from gpudra.api.proto import DRA_V1BETA1_ADVERTISED, dra_v1_pb2, dra_v1_pb2_grpc
from gpudra.kubeletplugin.node.daemon import STARTING_POLL, _StartingPreparer
from gpudra.kubeletplugin.serving.dra_service import base_request_names
from gpudra.kubeletplugin.serving.interfaces import PrepareOutcome, always
from gpudra.kubeletplugin.serving.server import PluginServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.kubeletplugin.conftest import DRIVER, TestPreparer, claim, gpu


@pytest.fixture
async def old_kubelet(server, dirs):
    async with await KubeletEmulator.discover(
            dirs.registrar, services=(DRA_V1BETA1_ADVERTISED,)) as emulator:
        yield emulator


async def test_v1_prepare_returns_every_device(kubelet, preparer: TestPreparer):
    preparer.outcomes["uid-1"] = PrepareOutcome(devices=(gpu(1), gpu(2, share_id="share-a")))
    response = await kubelet.prepare([claim(1)])
    assert response == {"uid-1": {"error": "", "devices": [
        {"request_names": ["gpu"], "pool_name": "node-a", "device_name": "gpu-1",
         "cdi_device_ids": ["k8s.gpu.nvidia.com/claim=uid-1-gpu-1"], "share_id": None},
        {"request_names": ["gpu"], "pool_name": "node-a", "device_name": "gpu-2",
         "cdi_device_ids": ["k8s.gpu.nvidia.com/claim=uid-2-gpu-2"], "share_id": "share-a"},
    ]}}
    assert preparer.prepared == [[claim(1)]]


async def test_v1beta1_prepare_drops_the_share_id(old_kubelet, preparer: TestPreparer):
    preparer.outcomes["uid-1"] = PrepareOutcome(devices=(gpu(1, share_id="share-a"),))
    response = await old_kubelet.prepare([claim(1)])
    [device] = response["uid-1"]["devices"]
    assert device["device_name"] == "gpu-1" and device["share_id"] is None


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_subrequests_are_stripped_to_base_request_names(
        version, kubelet, old_kubelet, preparer: TestPreparer):
    emulator = kubelet if version == "v1" else old_kubelet
    preparer.outcomes["uid-1"] = PrepareOutcome(devices=(
        gpu(1, "big/a100", "big/h100", "small"),
        gpu(2, "plain"),
    ))
    devices = (await emulator.prepare([claim(1)]))["uid-1"]["devices"]
    assert [d["request_names"] for d in devices] == [["big", "small"], ["plain"]]


def test_base_request_names():
    assert base_request_names(["a/x", "a/y", "b", "c/z"]) == ["a", "b", "c"]
    assert base_request_names([]) == []


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_per_claim_errors_and_missing_answers(
        version, kubelet, old_kubelet, preparer: TestPreparer):
    emulator = kubelet if version == "v1" else old_kubelet
    preparer.outcomes["uid-2"] = PrepareOutcome(devices=(gpu(2),), error="MIG placement taken")
    preparer.omit = {"uid-3"}
    preparer.extra = {"uid-9": PrepareOutcome()}  # never asked for: must not reach the kubelet
    response = await emulator.prepare([claim(1), claim(2), claim(3)])
    assert response["uid-1"]["error"] == ""
    assert response["uid-2"] == {"error": "MIG placement taken", "devices": []}
    assert response["uid-3"] == {
        "error": "claim ns/claim-3:uid-3: the driver returned no result for it", "devices": []}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_unprepare(version, kubelet, old_kubelet, preparer: TestPreparer):
    emulator = kubelet if version == "v1" else old_kubelet
    preparer.unprepare_errors["uid-2"] = "device busy"
    preparer.omit = {"uid-3"}
    response = await emulator.unprepare([claim(1), claim(2), claim(3)])
    assert response == {
        "uid-1": {"error": ""},
        "uid-2": {"error": "device busy"},
        "uid-3": {"error": "claim ns/claim-3:uid-3: the driver returned no result for it"},
    }
    assert preparer.unprepared == [[claim(1), claim(2), claim(3)]]


async def test_an_empty_request_does_not_call_the_driver(kubelet, preparer: TestPreparer):
    assert await kubelet.prepare([]) == {}
    assert await kubelet.unprepare([]) == {}
    assert preparer.prepared == preparer.unprepared == []


@pytest.mark.parametrize("method", ["prepare", "unprepare"])
async def test_a_claim_listed_twice_is_refused_and_not_touched(
        method, kubelet, preparer: TestPreparer):
    response = await getattr(kubelet, method)([claim(1), claim(2), claim(1)])
    assert response["uid-1"]["error"] == "claim ns/claim-1:uid-1 listed twice in one request"
    assert response["uid-2"]["error"] == ""
    calls = preparer.prepared if method == "prepare" else preparer.unprepared
    assert calls == [[claim(2)]]


async def test_a_claim_with_an_empty_field_is_an_error_for_that_claim(
        kubelet, preparer: TestPreparer):
    bad = ClaimRef(namespace="ns", name="", uid="uid-7")
    response = await kubelet.prepare([bad, claim(1)])
    assert response["uid-7"]["error"] == "claim ns/:uid-7: name must not be empty"
    assert preparer.prepared == [[claim(1)]]


@pytest.mark.parametrize("method", ["prepare", "unprepare"])
async def test_a_failing_driver_is_internal_and_the_server_keeps_serving(
        method, kubelet, preparer: TestPreparer):
    preparer.error = RuntimeError("NVML exploded")
    with structlog.testing.capture_logs() as logs, pytest.raises(grpc.aio.AioRpcError) as failure:
        await getattr(kubelet, method)([claim(1), claim(2)])
    assert failure.value.code() == grpc.StatusCode.INTERNAL
    assert "RuntimeError: NVML exploded" in failure.value.details()
    [failed] = [entry for entry in logs if entry["event"] == "driver failed"]
    assert failed["claims"] == ["ns/claim-1:uid-1", "ns/claim-2:uid-2"]
    assert failed["log_level"] == "error" and failed["exc_info"]

    preparer.error = None
    response = await getattr(kubelet, method)([claim(1)])
    assert response["uid-1"]["error"] == ""


async def test_calls_and_claims_are_logged(kubelet, preparer: TestPreparer):
    preparer.outcomes["uid-2"] = PrepareOutcome(error="no such device")
    with structlog.testing.capture_logs() as logs:
        await kubelet.prepare([claim(1), claim(2)])
        await call_line(logs)
    by_event = {(entry["event"], entry.get("claim")): entry for entry in logs}
    done = by_event[("call done", None)]
    assert done["method"] == "v1.NodePrepareResources"
    assert done["claims"] == 2 and done["failed"] == 1 and done["duration_s"] >= 0
    assert done["prepared"] == {"ns/claim-1:uid-1": ["gpu-0"]}  # the failed one is apart
    failed = by_event[("claim failed", "ns/claim-2:uid-2")]
    assert failed["error"] == "no such device" and failed["log_level"] == "warning"
    assert failed["request_id"] == done["request_id"]
    assert len(logs) == 2  # one line per call, one per failed claim

    with structlog.testing.capture_logs() as logs:
        await kubelet.unprepare([claim(1)])
        await call_line(logs)
    [done] = logs
    assert done["event"] == "call done" and done["unprepared"] == ["ns/claim-1:uid-1"]


async def call_line(logs: list[dict[str, Any]]) -> None:
    """Wait for the call's line: it is written once the call ended, after the answer."""
    deadline = time.monotonic() + 5.0
    while not any(entry["event"] == "call done" for entry in logs):
        assert time.monotonic() < deadline, f"no call line in {logs}"
        await asyncio.sleep(0.005)


async def test_the_call_line_is_written_after_the_answer(kubelet, preparer: TestPreparer):
    # While the line cannot be written, the kubelet still gets its answer: the line does
    # not delay it. It is written afterwards, with the handler's own duration.
    preparer.outcomes["uid-1"] = PrepareOutcome(devices=(gpu(1),))
    writable = threading.Event()
    lines: list[dict[str, Any]] = []

    def held_back(_logger: Any, _method: str, entry: dict[str, Any]) -> dict[str, Any]:
        if entry["event"] == "call done":
            writable.wait(10)
        lines.append(entry)
        raise structlog.DropEvent

    processors = structlog.get_config()["processors"]
    saved = list(processors)
    processors[:] = [held_back]  # in place, as capture_logs does: loggers may be cached
    try:
        for method in ("prepare", "unprepare"):
            await asyncio.wait_for(getattr(kubelet, method)([claim(1)]), 5)
            assert not lines  # answered, and its line not written yet
            writable.set()
            await call_line(lines)
            [line] = lines
            assert line["method"] == f"v1.Node{method.capitalize()}Resources"
            assert 0 <= line["duration_s"] < 5
            writable.clear()
            lines.clear()
    finally:
        writable.set()
        processors[:] = saved


async def test_the_wire_messages_are_what_the_kubelet_decodes(server, preparer: TestPreparer):
    # Below the emulator: share_id is really unset (not "") when there is no share.
    preparer.outcomes["uid-1"] = PrepareOutcome(devices=(gpu(1),))
    async with grpc.aio.insecure_channel(f"unix:{server.dra_socket_path}") as channel:
        response = await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="ns", name="claim-1", uid="uid-1")]),
            timeout=5)
    [device] = response.claims["uid-1"].devices
    assert not device.HasField("share_id")


class WorksOn(TestPreparer):
    """Claim 1's prepare works on after the kubelet gave up, until the server says so
    (``wanted``; bounded), as a MIG create that outlives its call's deadline."""

    def prepare(self, claims: Sequence[ClaimRef], *,
                wanted: Callable[[], bool] = always) -> Mapping[str, PrepareOutcome]:
        for _ in range(1000 if claims[0].uid == "uid-1" else 0):
            if not wanted():
                break
            time.sleep(0.01)
        return super().prepare(claims, wanted=wanted)


async def test_a_call_the_kubelet_gives_up_on_finishes_and_says_so(dirs):
    # A call thread cannot be cancelled: the work ends (the kubelet's retry finds it in
    # the checkpoint), and the line says the kubelet did not wait for the answer.
    preparer = WorksOn()
    async with PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, preparer), \
            await KubeletEmulator.discover(dirs.registrar, call_timeout=0.2) as impatient:
        with structlog.testing.capture_logs() as logs:
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await impatient.prepare([claim(1)])
            assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            for _ in range(1000):
                if any(entry["event"] == "call done" for entry in logs):
                    break
                await asyncio.sleep(0.01)
        [late] = [entry for entry in logs
                  if entry["event"] == "the kubelet stopped waiting before the answer"]
        assert late["claims"] == ["ns/claim-1:uid-1"] and late["log_level"] == "warning"
        assert preparer.prepared == [[claim(1)]]
        assert (await impatient.prepare([claim(2)]))["uid-2"]["error"] == ""


async def test_a_prepare_the_kubelet_gave_up_on_during_start_up_never_runs(dirs):
    # The kubelet's prepare hits its deadline while the daemon still starts, the pod goes
    # and the kubelet unprepares the claim: the stale prepare must not run after that, or
    # the claim stays prepared with nobody to undo it.
    starting = _StartingPreparer()
    inner = TestPreparer()
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, starting)
    await server.start()
    try:
        async with await KubeletEmulator.discover(dirs.registrar, call_timeout=0.6) as kubelet:
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await kubelet.prepare([claim(1)])
            assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            unprepare = asyncio.create_task(kubelet.unprepare([claim(1)]))
            await asyncio.sleep(0.2)  # the server, too, has seen the first call's deadline pass
            starting.ready(inner)
            assert (await unprepare) == {"uid-1": {"error": ""}}
            await asyncio.sleep(STARTING_POLL * 2)
        assert inner.unprepared == [[claim(1)]]
        assert inner.prepared == []
    finally:
        await server.stop(grace=0)
