"""A checkpoint the daemon cannot read is never a reason to destroy or reuse hardware
(issue 27, item 2; item 9's checkpoint cases). ``gpudra node`` as a real process on a
simulated DGX H100, the kubelet emulator over gRPC, claims over real HTTP.

Each case prepares claims (a full GPU in exclusive compute mode, a dynamic MIG device),
kills the daemon, damages the checkpoint, restarts it, and checks: the claims are rebuilt
from what survives (their CDI specs, the hardware, the API server's claims), or what cannot
be attributed is held (tainted, an Event, a metric, a ``/readyz`` line), nothing is
destroyed; then unprepare puts the hardware back to where it started.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpudra.api.claims import ClaimRef
from gpudra.cli.node_cmd import FATAL_EVENT
from gpudra.driver import mps_process
from gpudra.driver.checkpoint_codec import checksum
from gpudra.driver.checkpoint_store import FILE_NAME
from gpudra.driver.nvml import COMPUTE_MODE_DEFAULT, open_nvml
from gpudra.driver.sim import SimControl
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import DRIVER, Daemon, claim_object, free_port, http_get

GV = "resource.nvidia.com/v1beta1"
EXCLUSIVE = {"opaque": {"driver": DRIVER, "parameters": {
    "apiVersion": GV, "kind": "GpuConfig", "computeMode": "ExclusiveProcess"}}}
MIG_DEVICE = "gpu-1-mig-1g10gb-19-6"
HELD_TAINT = "gpu.nvidia.com/held-unknown"


def _wrong_shape(data: bytes) -> bytes:
    body = {"nodeBootId": 7, "claims": ["not", "an", "object"]}
    return json.dumps({"kind": "GpudraCheckpoint", "version": 2, "checksum": checksum(body),
                       "data": body}).encode()


def _bad_checksum(data: bytes) -> bytes:
    doc = json.loads(data)
    digest = doc["checksum"]
    doc["checksum"] = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    return json.dumps(doc).encode()


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda data: b"",
    "truncated": lambda data: data[: len(data) // 2],
    "random-bytes": lambda data: random.Random(27).randbytes(max(len(data), 64)),
    "wrong-shape": _wrong_shape,
    "bad-checksum": _bad_checksum,
}


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    port = free_port()
    d = Daemon(fake_api.url, extra_args=["--http-address", f"127.0.0.1:{port}"])
    d.env["TEST_HTTP_PORT"] = str(port)  # read back by the helpers below
    try:
        yield d
    finally:
        if d.process is not None and d.process.poll() is None:
            d.stop()
        shutil.rmtree(d.base, ignore_errors=True)


def port_of(daemon: Daemon) -> int:
    return int(daemon.env["TEST_HTTP_PORT"])


def create_claim(api: FakeApiServer, name: str, **kwargs: Any) -> ClaimRef:
    obj = claim_object(name, **kwargs)
    obj.setdefault("status", {})["reservedFor"] = [
        {"resource": "pods", "name": f"{name}-pod", "uid": f"pod-{name}"}]
    stored = api.put(obj)
    meta = stored["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def hardware(daemon: Daemon) -> list[dict[str, Any]]:
    """What a claim can change on each GPU: compute mode, MIG mode, MIG devices."""
    return [{"compute_mode": g["compute_mode"], "mig_mode": g["mig_mode"],
             "gpu_instances": g["gpu_instances"]}
            for g in SimControl(daemon.sim_state).snapshot()["gpus"]]


def checkpoint(daemon: Daemon) -> Path:
    return daemon.plugins / DRIVER / FILE_NAME


def specs(daemon: Daemon) -> list[str]:
    return sorted(p.name for p in daemon.cdi_root.glob("*.json"))


def this_run(daemon: Daemon) -> list[dict[str, Any]]:
    """The JSON log lines of the daemon process started last (the log is appended to)."""
    lines = []
    for line in daemon.output()[daemon.log_mark:].splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def recovery_line(daemon: Daemon) -> dict[str, Any]:
    """This run's one ``checkpoint unreadable`` line."""
    [line] = [e for e in this_run(daemon)
              if e.get("event", "").startswith("checkpoint unreadable")]
    return line


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def taints(api: FakeApiServer, device: str) -> list[dict[str, Any]]:
    for s in api.list("ResourceSlice"):
        for d in s["spec"].get("devices", []):
            if d["name"] == device:
                return list(d.get("taints", []))
    return []


def published(api: FakeApiServer, device: str) -> bool:
    return any(d["name"] == device for s in api.list("ResourceSlice")
               for d in s["spec"].get("devices", []))


def metric(daemon: Daemon, name: str) -> float | None:
    _, body = http_get(port_of(daemon), "/metrics")
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


async def prepare(daemon: Daemon, *refs: ClaimRef) -> dict[str, Any]:
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        return dict(await kubelet.prepare(list(refs)))


async def unprepare(daemon: Daemon, *refs: ClaimRef) -> dict[str, Any]:
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        return dict(await kubelet.unprepare(list(refs)))


async def prepared_then_killed(daemon: Daemon, api: FakeApiServer,
                               ) -> tuple[ClaimRef, ClaimRef, dict[str, Any], Any]:
    """Claims ``full`` (gpu-0, exclusive compute mode) and ``mig`` (a dynamic MIG device)
    prepared, then SIGKILL: the baseline hardware, the first answers, the hardware after."""
    daemon.start()
    wait_for(lambda: published(api, MIG_DEVICE))  # what recovery reads back: dynamic MIG
    baseline = hardware(daemon)
    full = create_claim(api, "full", devices=["gpu-0"], configs=[EXCLUSIVE])
    mig = create_claim(api, "mig", devices=[MIG_DEVICE], request="mig")
    answers = await prepare(daemon, full, mig)
    assert answers[full.uid]["error"] == "" and answers[mig.uid]["error"] == "", answers
    held = hardware(daemon)
    assert held[0]["compute_mode"] != baseline[0]["compute_mode"]
    assert len(held[1]["gpu_instances"]) == 1
    daemon.stop(signal.SIGKILL)
    return full, mig, answers, (baseline, held)


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
async def test_corrupt_checkpoint_is_rebuilt_and_nothing_is_destroyed(daemon, fake_api, corrupt):
    full, mig, answers, (baseline, held) = await prepared_then_killed(daemon, fake_api)
    before = specs(daemon)
    path = checkpoint(daemon)
    path.write_bytes(corrupt(path.read_bytes()))

    daemon.start()
    # Nothing destroyed or reset: the specs, the MIG device and the compute mode are there.
    assert specs(daemon) == before
    assert hardware(daemon) == held
    line = recovery_line(daemon)
    assert line["rebuilt_claims"] == 2 and line["held_unknown"] == 0

    # The rebuilt claims answer as before; another claim cannot take the GPU they hold.
    again = await prepare(daemon, full, mig)
    assert again == answers
    other = create_claim(fake_api, "other", devices=["gpu-0"])
    refused = (await prepare(daemon, other))[other.uid]["error"]
    assert "claim default/full" in refused, refused
    assert hardware(daemon) == held

    # Unprepare undoes what the claims did: the hardware is back where it started.
    done = await unprepare(daemon, full, mig)
    assert done == {full.uid: {"error": ""}, mig.uid: {"error": ""}}, done
    assert hardware(daemon) == baseline
    assert specs(daemon) == []
    assert daemon.stop() == 0


async def test_what_cannot_be_attributed_is_held_tainted_and_said_loudly(daemon, fake_api):
    """The specs are gone too and the API server no longer knows the claims: the compute
    mode and the MIG device belong to nobody the daemon can name. They are held: tainted
    NoSchedule, an Event, a metric, a /readyz line; never destroyed, not even across a
    restart or by an unprepare of a claim the daemon does not know."""
    full, mig, _, (baseline, held) = await prepared_then_killed(daemon, fake_api)
    checkpoint(daemon).write_bytes(b"")
    for spec in daemon.cdi_root.glob("*.json"):
        spec.unlink()
    fake_api.delete("ResourceClaim", "full", "default")
    fake_api.delete("ResourceClaim", "mig", "default")

    daemon.start()
    assert hardware(daemon) == held
    line = recovery_line(daemon)
    assert line["held_unknown"] == 2, line
    wait_for(lambda: taints(fake_api, "gpu-0"))
    assert [(t["key"], t["effect"]) for t in taints(fake_api, "gpu-0")] == [
        (HELD_TAINT, "NoSchedule")]
    assert [(t["key"], t["effect"]) for t in taints(fake_api, MIG_DEVICE)] == [
        (HELD_TAINT, "NoSchedule")]
    assert published(fake_api, "gpu-2") and taints(fake_api, "gpu-2") == []
    events = wait_for(lambda: [e for e in fake_api.list("events.events.k8s.io", "default")
                               if e.get("reason") == "HardwareHeldUnknown"])
    assert len(events) == 1 and "gpu-0" in events[0]["note"], events
    assert metric(daemon, "gpudra_held_unknown_devices") == 2
    status, body = http_get(port_of(daemon), "/readyz")
    assert "held" in body and "gpu-0" in body, (status, body)

    # A new claim for the held GPU gets a clear error and changes nothing.
    other = create_claim(fake_api, "other", devices=["gpu-0"])
    refused = (await prepare(daemon, other))[other.uid]["error"]
    assert "claim default/other" in refused and "held" in refused, refused
    # The kubelet unpreparing the forgotten claims changes nothing on the hardware.
    assert (await unprepare(daemon, full, mig))[full.uid]["error"] == ""
    assert hardware(daemon) == held
    assert specs(daemon) == []

    # Held across a clean restart (the checkpoint is readable now): still nothing destroyed.
    assert daemon.stop() == 0
    daemon.start()
    assert hardware(daemon) == held
    wait_for(lambda: taints(fake_api, "gpu-0"))
    assert metric(daemon, "gpudra_held_unknown_devices") == 2
    # And across another corrupt checkpoint: the same two, not four.
    daemon.stop(signal.SIGKILL)
    checkpoint(daemon).write_bytes(b"{")
    daemon.start()
    line = recovery_line(daemon)
    assert line["held_unknown"] == 2, line
    assert daemon.stop() == 0
    assert hardware(daemon) != baseline  # the operator decides, not the daemon

    # The operator puts the hardware back (nvidia-smi): the next start releases it.
    nvml = open_nvml(simulate="dgx-h100", sim_state=daemon.sim_state)
    try:
        control = SimControl(daemon.sim_state)
        nvml.set_compute_mode(control.gpu_uuid(0), COMPUTE_MODE_DEFAULT)
        [gi] = held[1]["gpu_instances"]
        assert nvml.destroy_mig_device(control.gpu_uuid(1), gi["id"],
                                       gi["compute_instances"][0]["id"])
    finally:
        nvml.shutdown()
    daemon.start()
    wait_for(lambda: published(fake_api, "gpu-0") and not taints(fake_api, "gpu-0"))
    assert metric(daemon, "gpudra_held_unknown_devices") == 0
    assert "held" not in http_get(port_of(daemon), "/readyz")[1]
    ref = create_claim(fake_api, "after", devices=["gpu-0"])
    assert (await prepare(daemon, ref))[ref.uid]["error"] == ""
    assert daemon.stop() == 0


async def test_nothing_to_rebuild_and_nothing_held_starts_empty(daemon, fake_api):
    daemon.start()
    baseline = hardware(daemon)
    daemon.stop(signal.SIGKILL)
    checkpoint(daemon).parent.mkdir(parents=True, exist_ok=True)
    checkpoint(daemon).write_bytes(b"{")
    daemon.start()
    line = recovery_line(daemon)
    assert line["rebuilt_claims"] == 0 and line["held_unknown"] == 0
    assert hardware(daemon) == baseline
    _, body = http_get(port_of(daemon), "/readyz")
    assert "held" not in body
    ref = create_claim(fake_api, "fresh", devices=["gpu-0"], configs=[EXCLUSIVE])
    assert (await prepare(daemon, ref))[ref.uid]["error"] == ""
    assert daemon.stop() == 0


def test_a_checkpoint_that_is_a_directory_is_one_line_naming_it(daemon):
    """Item 9: one line naming the file and what to do, no traceback, on every start."""
    daemon.kubelet = False
    path = checkpoint(daemon)
    path.mkdir(parents=True)
    for _ in range(2):
        daemon.start(wait=False)
        assert daemon.process is not None
        assert daemon.process.wait(30) == 1
        output = daemon.output()[daemon.log_mark:]
        assert "Traceback" not in output, output
        [error] = [e["error"] for e in daemon.events() if e.get("event") == FATAL_EVENT][-1:]
        assert str(path) in error and "is a directory" in error and "move it aside" in error, \
            error
    assert path.is_dir()  # the operator's to look at


async def test_a_checkpoint_nested_100k_deep_is_one_line_and_rebuilt(daemon, fake_api):
    """Item 9: deep nesting is corruption like any other: one line naming the file (no
    RecursionError traceback), claims rebuilt from what survives."""
    full, mig, _, (baseline, held) = await prepared_then_killed(daemon, fake_api)
    path = checkpoint(daemon)
    path.write_text("[" * 100_000 + "]" * 100_000)
    daemon.start()
    output = daemon.output()[daemon.log_mark:]
    assert "Traceback" not in output and "RecursionError" not in output, output[-2000:]
    line = recovery_line(daemon)
    assert line["error"].startswith(f"checkpoint {path} is corrupt: "), line
    assert line["rebuilt_claims"] == 2
    assert hardware(daemon) == held
    assert await unprepare(daemon, full, mig) == {full.uid: {"error": ""}, mig.uid: {"error": ""}}
    assert hardware(daemon) == baseline
    assert daemon.stop() == 0


SHARES = {"share-a": ("5a5a5a5a-0000-4000-8000-00000000000a", "20Gi", "33"),
          "share-b": ("5b5b5b5b-0000-4000-8000-00000000000b", "40Gi", "66")}


def share_claim(api: FakeApiServer, name: str) -> ClaimRef:
    share_id, memory, multiprocessors = SHARES[name]
    ref = create_claim(api, name, devices=["gpu-2-shared"])
    obj = api.get("ResourceClaim", name, "default")
    assert obj is not None
    obj["status"]["allocation"]["devices"]["results"][0].update(
        shareID=share_id, consumedCapacity={
            "memory": memory, "multiprocessors": multiprocessors, "shares": "1"})
    api.put(obj)
    return ref


@pytest.mark.parametrize("corrupt", ["empty", "bad-checksum"])
async def test_shares_of_a_gpu_are_rebuilt_and_their_mps_daemon_kept(fake_api, corrupt):
    """Two MPS shares of one GPU: after the restart on a corrupt checkpoint their daemon is
    the same process, the GPU stays in exclusive mode; the last share's unprepare stops the
    daemon and puts the GPU back."""
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    daemon = Daemon(fake_api.url, extra_args=["--shareable-gpus", "all"])
    try:
        daemon.start()
        wait_for(lambda: published(fake_api, "gpu-2-shared"))
        baseline = hardware(daemon)
        a, b = share_claim(fake_api, "share-a"), share_claim(fake_api, "share-b")
        answers = await prepare(daemon, a, b)
        assert answers[a.uid]["error"] == "" and answers[b.uid]["error"] == "", answers
        [directory] = (daemon.plugins / DRIVER / "mps").iterdir()
        pid = mps_process.read_pid(directory / "control.pid")
        assert pid is not None and mps_process.alive(pid)
        held = hardware(daemon)
        daemon.stop(signal.SIGKILL)
        path = checkpoint(daemon)
        path.write_bytes(CORRUPTIONS[corrupt](path.read_bytes()))

        daemon.start()
        line = recovery_line(daemon)
        assert (line["rebuilt_claims"], line["held_unknown"]) == (2, 0), line
        assert mps_process.alive(pid) and hardware(daemon) == held
        assert await prepare(daemon, a, b) == answers

        assert (await unprepare(daemon, b))[b.uid]["error"] == ""
        assert mps_process.alive(pid) and hardware(daemon) == held  # share-a still uses it
        assert (await unprepare(daemon, a))[a.uid]["error"] == ""
        assert not mps_process.alive(pid)
        assert hardware(daemon) == baseline and specs(daemon) == []
        assert daemon.stop() == 0
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
        for pid in sim_daemons(daemon.plugins):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(daemon.base, ignore_errors=True)


async def test_a_prepare_cut_short_is_rolled_back_from_the_api_servers_claim(daemon, fake_api):
    """Killed after the compute mode was set and before the CDI spec: no spec survives, the
    API server says the claim is allocated here and reserved, the GPU is in exclusive mode.
    The claim is rebuilt as started and rolled back (mode back to Default); the kubelet's
    retry then prepares it."""
    daemon.start()
    wait_for(lambda: published(fake_api, "gpu-0"))
    baseline = hardware(daemon)
    full = create_claim(fake_api, "full", devices=["gpu-0"], configs=[EXCLUSIVE])
    daemon.stop()
    daemon.env["GPUDRA_CRASH_AT"] = "prepare:after-settings"
    daemon.start()
    with pytest.raises(grpc.aio.AioRpcError):  # the daemon dies inside the call
        await prepare(daemon, full)
    assert daemon.process is not None and daemon.process.wait(10) != 0
    daemon.stop_kubelet()
    assert hardware(daemon)[0]["compute_mode"] != baseline[0]["compute_mode"]
    assert specs(daemon) == []
    checkpoint(daemon).write_bytes(b"\x00garbage")

    del daemon.env["GPUDRA_CRASH_AT"]
    daemon.start()
    line = recovery_line(daemon)
    assert (line["rebuilt_claims"], line["rolled_back_claims"], line["held_unknown"]) == (
        0, 1, 0), line
    assert hardware(daemon) == baseline  # rolled back at start-up
    assert (await prepare(daemon, full))[full.uid]["error"] == ""
    assert hardware(daemon)[0]["compute_mode"] != baseline[0]["compute_mode"]
    assert (await unprepare(daemon, full))[full.uid]["error"] == ""
    assert hardware(daemon) == baseline
    assert daemon.stop() == 0


async def test_without_the_api_server_the_specs_and_hardware_still_rebuild(daemon, fake_api):
    """The API server refuses the lists at start-up: the claims are rebuilt from their CDI
    specs and the hardware alone, and unprepare still puts the hardware back."""
    full, mig, _, (baseline, held) = await prepared_then_killed(daemon, fake_api)
    checkpoint(daemon).write_bytes(b"")
    fake_api.fail_next(1, status=403, verb="list", resource="resourceclaims")
    fake_api.fail_next(1, status=403, verb="list", resource="resourceslices")
    daemon.start()
    line = recovery_line(daemon)
    assert not line["api_claims_read"] and not line["slices_read"], line
    assert (line["rebuilt_claims"], line["held_unknown"]) == (2, 0), line
    assert hardware(daemon) == held
    assert await unprepare(daemon, full, mig) == {full.uid: {"error": ""}, mig.uid: {"error": ""}}
    assert hardware(daemon) == baseline
    assert daemon.stop() == 0
