"""Claim device status (``status.devices``) through real HTTP to the test API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from gpudra.api.claims import ClaimRef, PreparedDevice
from gpudra.driver.checkpoint_model import ClaimRecord, DeviceRecord, MigRecord
from gpudra.driver.devices import Device, NodeDevices, Taint
from gpudra.driver.usage import DeviceUsage, IdleTransition
from gpudra.kube.backoff import Backoff
from gpudra.kube.raw_api import RESOURCE_CLAIMS, RawApi
from gpudra.kube.session import ApiSession
from gpudra.kubeletplugin.cluster.claim_status import ClaimStatusWriter, unhealthy_devices
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.fake_time import FakeTime, settle
from tests.fakeapi.fixtures import api_session, fake_api  # noqa: F401

DRIVER = "gpu.nvidia.com"
OTHER = "net.example.com"
POOL = "node-a"
MIG_UUID = "MIG-0f6a5c1e-3c55-5d1b-9a0e-1f2d3c4b5a69"


def put_claim(fake_api: FakeApiServer, name: str = "c1") -> ClaimRef:  # noqa: F811
    results = [{"request": "gpu", "driver": DRIVER, "pool": POOL, "device": "gpu-0"},
               {"request": "gpu", "driver": DRIVER, "pool": POOL, "device": "gpu-1-mig-1g10gb-0"},
               {"request": "nic", "driver": OTHER, "pool": POOL, "device": "eth0"}]
    stored = fake_api.put({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
            {"name": "nic", "exactly": {"deviceClassName": "nic"}}]}},
        "status": {"allocation": {"devices": {"results": results}},
                   "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "pod-uid"}]},
    })
    return ClaimRef("ns", name, stored["metadata"]["uid"])


DEVICES = (
    PreparedDevice(("gpu",), POOL, "gpu-0", ("k8s.gpu.nvidia.com/claim=u-gpu-0",)),
    PreparedDevice(("gpu",), POOL, "gpu-1-mig-1g10gb-0", ("k8s.gpu.nvidia.com/claim=u-mig",)),
)


def record(uid: str) -> ClaimRecord:
    return ClaimRecord(uid=uid, namespace="ns", name="c1", state="PrepareCompleted", devices=[
        DeviceRecord(request_names=["gpu"], pool=POOL, device="gpu-0", kind="gpu",
                     cdi_device_ids=list(DEVICES[0].cdi_device_ids), uuid="GPU-aaaa"),
        DeviceRecord(request_names=["gpu"], pool=POOL, device="gpu-1-mig-1g10gb-0", kind="mig",
                     cdi_device_ids=list(DEVICES[1].cdi_device_ids), parent_uuid="GPU-bbbb",
                     mig=MigRecord(parent_uuid="GPU-bbbb", gpu_instance_id=3,
                                   compute_instance_id=0, profile_id=19, placement_start=6,
                                   placement_size=1, mig_uuid=MIG_UUID, created=True))])


class EveryClaim(Mapping[str, ClaimRecord]):
    """The checkpoint as the writer reads it: these two devices for whichever claim."""

    def __getitem__(self, uid: str) -> ClaimRecord:
        return record(uid)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def new_writer(session: ApiSession, clock: FakeTime | None = None,
               **options: Any) -> ClaimStatusWriter:
    clock = clock or FakeTime()
    return ClaimStatusWriter(RawApi(session), driver=DRIVER, records=EveryClaim,
                             backoff=lambda: Backoff(initial=0.01, cap=0.05),
                             monotonic=clock.monotonic, sleep=clock.sleep, **options)


@contextlib.asynccontextmanager
async def running(writer: ClaimStatusWriter) -> AsyncIterator[ClaimStatusWriter]:
    """The writer with its background task, cancelled on the way out."""
    task = asyncio.create_task(writer.run())
    try:
        yield writer
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest_asyncio.fixture
def clock() -> FakeTime:
    """The writer's time: it moves only when a test advances it."""
    return FakeTime()


@pytest_asyncio.fixture
async def writer(api_session: ApiSession,  # noqa: F811
                 clock: FakeTime) -> AsyncIterator[ClaimStatusWriter]:
    """A writer that writes a claim as soon as it changes."""
    async with running(new_writer(api_session, clock, delay=0.0)) as started:
        yield started


@pytest_asyncio.fixture
async def slow_writer(api_session: ApiSession,  # noqa: F811
                      clock: FakeTime) -> AsyncIterator[ClaimStatusWriter]:
    """A writer with the daemon's delay between a claim's first change and its write."""
    async with running(new_writer(api_session, clock, delay=0.3)) as started:
        yield started


def writes(outcome: str) -> float:
    return REGISTRY.get_sample_value("gpudra_claim_status_writes_total",
                                     {"outcome": outcome}) or 0.0


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """Poll: the writer runs as a task on this loop and the server in its own thread."""
    async with asyncio.timeout(seconds):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def status_devices(fake_api: FakeApiServer, name: str = "c1") -> list[dict]:  # noqa: F811
    claim = fake_api.get("ResourceClaim", name, "ns") or {}
    return (claim.get("status") or {}).get("devices") or []


def patches(fake_api: FakeApiServer) -> int:  # noqa: F811
    return sum(n for (verb, resource), n in fake_api.calls.items()
               if verb == "patch" and resource.startswith("resourceclaims"))


def conditions(entry: dict) -> dict[str, dict]:
    return {c["type"]: c for c in entry["conditions"]}


async def test_prepared_devices_get_entries_under_our_field_manager(
        writer: ClaimStatusWriter, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    ok = writes("ok")
    writer.prepared(ref, DEVICES, None)
    await until(lambda: len(status_devices(fake_api)) == 2)
    entries = {e["device"]: e for e in status_devices(fake_api)}
    assert {e["driver"] for e in entries.values()} == {DRIVER}
    gpu, mig = entries["gpu-0"], entries["gpu-1-mig-1g10gb-0"]
    assert gpu["data"] == {"cdiDeviceIDs": ["k8s.gpu.nvidia.com/claim=u-gpu-0"], "kind": "gpu",
                           "uuid": "GPU-aaaa"}
    assert mig["data"]["uuid"] == MIG_UUID
    assert mig["data"]["parentUUID"] == "GPU-bbbb"
    assert mig["data"]["mig"] == {"profileID": 19, "placement": {"start": 6, "size": 1},
                                  "gpuInstanceID": 3, "computeInstanceID": 0}
    assert conditions(gpu)["Ready"]["status"] == "True"
    assert conditions(gpu)["Healthy"]["status"] == "True"
    claim = fake_api.get("ResourceClaim", "c1", "ns") or {}
    managers = {(m["manager"], m["operation"], m.get("subresource"))
                for m in claim["metadata"]["managedFields"]}
    assert (DRIVER, "Apply", "status") in managers
    await until(lambda: writes("ok") == ok + 1)  # counted once the answer is read
    assert patches(fake_api) == 1


async def test_a_kubelet_retry_writes_nothing_new(
        writer: ClaimStatusWriter, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    writer.prepared(ref, DEVICES, None)
    await until(lambda: not writer.pending() and len(status_devices(fake_api)) == 2)
    writer.prepared(ref, DEVICES, None)
    assert not writer.pending()  # nothing queued: the same devices are written already
    await settle()
    assert patches(fake_api) == 1


async def test_a_failing_write_is_retried_with_back_off_and_counted(
        writer: ClaimStatusWriter, fake_api: FakeApiServer, clock: FakeTime):  # noqa: F811
    ref = put_claim(fake_api)
    retries = writes("retry")
    fake_api.fail_next(3, status=503, verb="patch", resource="resourceclaims/status",
                      retry_after=None)
    writer.prepared(ref, DEVICES, None)  # returns at once: only queued
    assert status_devices(fake_api) == []
    for attempt in range(1, 4):
        await clock.until_sleeping()  # backing off after the attempt's failure
        assert patches(fake_api) == attempt and status_devices(fake_api) == []
        await clock.advance_to_next()
    await until(lambda: len(status_devices(fake_api)) == 2)
    assert writes("retry") == retries + 3
    assert patches(fake_api) == 4
    first, second, third = clock.slept
    assert 0.008 <= first <= 0.012 and 0.016 <= second <= 0.024 and third <= 0.05  # doubling


async def test_a_taint_makes_the_device_unhealthy_and_recovery_healthy_again(
        writer: ClaimStatusWriter, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    writer.prepared(ref, DEVICES, None)
    await until(lambda: len(status_devices(fake_api)) == 2)
    tainted = NodeDevices(devices=(
        Device("gpu-0", "gpu-0", {}, {}, taints=(
            Taint("gpu.nvidia.com/xid", "79", "NoExecute"),)),
        Device("gpu-1-mig-1g10gb-0", "gpu-1", {}, {})))
    writer.health_changed(unhealthy_devices(tainted))

    def healthy(device: str) -> str:
        entry = next(e for e in status_devices(fake_api) if e["device"] == device)
        return conditions(entry)["Healthy"]["status"]

    await until(lambda: healthy("gpu-0") == "False")
    entry = next(e for e in status_devices(fake_api) if e["device"] == "gpu-0")
    assert conditions(entry)["Healthy"]["message"] == "gpu.nvidia.com/xid=79:NoExecute"
    assert conditions(entry)["Healthy"]["reason"] == "Tainted"
    assert healthy("gpu-1-mig-1g10gb-0") == "True"
    writer.health_changed({})
    await until(lambda: healthy("gpu-0") == "True")


def transition(ref: ClaimRef, *, idle: bool) -> IdleTransition:
    sample = DeviceUsage(claim_uid=ref.uid, namespace=ref.namespace, claim=ref.name,
                         pods=("trainer-0",), device="gpu-0", gpu_uuid="GPU-aaaa",
                         sm_percent=1.0, memory_used_bytes=2**30,
                         memory_total_bytes=80 * 2**30, sampled_at=1800.0)
    return IdleTransition(claim_uid=ref.uid, namespace=ref.namespace, claim=ref.name,
                          pods=("trainer-0",), idle=idle, at=1800.0, since=0.0, sm_low=0.0,
                          sm_high=2.0, devices=(sample,))


async def test_idle_transitions_set_the_idle_condition(
        writer: ClaimStatusWriter, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    writer.prepared(ref, DEVICES, None)
    await until(lambda: len(status_devices(fake_api)) == 2)

    def idle() -> set[str]:
        return {conditions(e).get("Idle", {}).get("status", "-") for e in status_devices(fake_api)}

    writer.idle_changed(transition(ref, idle=True))
    await until(lambda: idle() == {"True"})
    entry = status_devices(fake_api)[0]
    assert conditions(entry)["Idle"]["reason"] == "BelowThreshold"
    assert conditions(entry)["Idle"]["lastTransitionTime"] == "1970-01-01T00:30:00Z"
    writer.idle_changed(transition(ref, idle=False))
    await until(lambda: idle() == {"False"})


async def test_unprepare_removes_our_entries(
        writer: ClaimStatusWriter, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    writer.prepared(ref, DEVICES, None)
    await until(lambda: len(status_devices(fake_api)) == 2)
    writer.unprepared(ref)
    await until(lambda: status_devices(fake_api) == [] and not writer.pending())


async def test_a_deleted_claim_is_dropped_not_retried(
        writer: ClaimStatusWriter, fake_api: FakeApiServer, clock: FakeTime):  # noqa: F811
    gone = writes("gone")
    writer.prepared(ClaimRef("ns", "missing", "uid-x"), DEVICES, None)
    await until(lambda: writes("gone") == gone + 1 and not writer.pending())
    await settle()
    assert patches(fake_api) == 1 and clock.sleeping() == []  # no back-off, no retry


async def test_content_the_server_rejects_is_not_retried(
        writer: ClaimStatusWriter, fake_api: FakeApiServer, clock: FakeTime):  # noqa: F811
    ref = put_claim(fake_api)
    rejected = writes("rejected")
    stray = PreparedDevice(("gpu",), POOL, "gpu-7", ("k8s.gpu.nvidia.com/claim=u-gpu-7",))
    writer.prepared(ref, (stray,), None)  # not allocated in the claim: Invalid
    await until(lambda: writes("rejected") == rejected + 1 and not writer.pending())
    await settle()
    assert patches(fake_api) == 1 and clock.sleeping() == []  # no back-off, no retry
    assert status_devices(fake_api) == []


async def test_another_drivers_entries_are_left_alone(
        writer: ClaimStatusWriter, fake_api: FakeApiServer,  # noqa: F811
        api_session: ApiSession):  # noqa: F811
    ref = put_claim(fake_api)
    theirs = {"driver": OTHER, "pool": POOL, "device": "eth0",
              "networkData": {"interfaceName": "eth0", "ips": ["10.0.0.7/24"]}}
    await RawApi(api_session).apply(
        RESOURCE_CLAIMS, "c1", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                "status": {"devices": [theirs]}},
        namespace="ns", subresource="status", field_manager=OTHER)
    writer.prepared(ref, DEVICES, None)
    await until(lambda: len(status_devices(fake_api)) == 3)
    assert theirs in status_devices(fake_api)
    writer.unprepared(ref)
    await until(lambda: status_devices(fake_api) == [theirs])
    claim = fake_api.get("ResourceClaim", "c1", "ns") or {}
    ours = [m for m in claim["metadata"]["managedFields"] if m["manager"] == DRIVER]
    assert ours == []  # nothing left owned by us


async def test_a_claim_answered_from_the_checkpoint_reads_its_config_for_the_data(
        writer: ClaimStatusWriter, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    fake_api.modify("ResourceClaim", "c1", {"status": {"allocation": {"devices": {"config": [
        {"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing",
                        "timeSlicingConfig": {"interval": "Long"}}}}}]}}}}, "ns")
    writer.prepared(ref, DEVICES, None)  # e.g. after a daemon restart: no decoded claim
    await until(lambda: len(status_devices(fake_api)) == 2)
    entries = {e["device"]: e for e in status_devices(fake_api)}
    assert entries["gpu-0"]["data"]["sharing"] == {
        "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    assert "sharing" not in entries["gpu-1-mig-1g10gb-0"]["data"]  # a GpuConfig: GPUs only


async def test_without_health_checks_there_is_no_healthy_condition(
        fake_api: FakeApiServer, api_session: ApiSession):  # noqa: F811
    async with running(new_writer(api_session, delay=0.0, watch_health=False)) as writer:
        ref = put_claim(fake_api)
        writer.prepared(ref, DEVICES, None)
        await until(lambda: len(status_devices(fake_api)) == 2)
        assert {c for e in status_devices(fake_api) for c in conditions(e)} == {"Ready"}


async def test_a_claim_unprepared_before_its_first_write_costs_no_write(
        slow_writer: ClaimStatusWriter, fake_api: FakeApiServer,  # noqa: F811
        clock: FakeTime):
    ref = put_claim(fake_api)
    skipped = writes("skipped")
    slow_writer.prepared(ref, DEVICES, None)
    assert slow_writer.pending() == {ref.uid}
    await clock.until_sleeping()
    slow_writer.unprepared(ref)
    assert slow_writer.pending() == set()
    await clock.advance(0.4)  # past when the write was due
    assert patches(fake_api) == 0 and status_devices(fake_api) == []
    assert writes("skipped") == skipped + 1


async def test_claims_queued_while_the_writer_waits_are_each_written_when_due(
        slow_writer: ClaimStatusWriter, fake_api: FakeApiServer,  # noqa: F811
        clock: FakeTime):
    # The writer sleeps until the first claim is due; later ones do not wake it early but
    # must still go out on time: right after the first (the unprepared one: never).
    first, second, dropped = (put_claim(fake_api, name) for name in ("c1", "c2", "c3"))
    slow_writer.prepared(first, DEVICES, None)
    await clock.until_sleeping()
    await clock.advance(0.1)
    slow_writer.prepared(second, DEVICES, None)
    slow_writer.prepared(dropped, DEVICES, None)
    slow_writer.unprepared(dropped)
    await settle()
    assert clock.slept == [pytest.approx(0.3)]  # not woken early by the later claims
    await clock.advance(0.2)  # the first is due
    await until(lambda: len(status_devices(fake_api, "c1")) == 2)
    await clock.until_sleeping()
    assert status_devices(fake_api, "c2") == []  # not due yet
    await clock.advance(0.1)  # 0.3 after the second was queued
    await until(lambda: len(status_devices(fake_api, "c2")) == 2 and not slow_writer.pending())
    assert patches(fake_api) == 2


async def test_changes_within_the_delay_go_out_in_one_write(
        slow_writer: ClaimStatusWriter, fake_api: FakeApiServer,  # noqa: F811
        clock: FakeTime):
    ref = put_claim(fake_api)
    slow_writer.prepared(ref, DEVICES, None)
    await clock.until_sleeping()
    await clock.advance(0.1)
    slow_writer.health_changed({"gpu-0": "gpu.nvidia.com/xid=79:NoExecute"})
    await settle()
    assert patches(fake_api) == 0  # not yet due
    await clock.advance(0.2)
    await until(lambda: len(status_devices(fake_api)) == 2 and not slow_writer.pending())
    assert patches(fake_api) == 1
    healthy = {e["device"]: conditions(e)["Healthy"]["status"] for e in status_devices(fake_api)}
    assert healthy == {"gpu-0": "False", "gpu-1-mig-1g10gb-0": "True"}


async def test_unprepare_while_the_first_write_is_in_flight_still_removes_the_entries(
        writer: ClaimStatusWriter, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    fake_api.delay(0.3, verb="patch", resource="resourceclaims/status", count=1)
    writer.prepared(ref, DEVICES, None)
    await until(lambda: patches(fake_api) == 1)  # the apply is being answered
    writer.unprepared(ref)
    await until(lambda: patches(fake_api) == 2 and not writer.pending())
    assert status_devices(fake_api) == []


async def test_a_claim_prepared_by_an_earlier_daemon_has_its_entries_removed(
        writer: ClaimStatusWriter, fake_api: FakeApiServer,  # noqa: F811
        api_session: ApiSession):  # noqa: F811
    ref = put_claim(fake_api)
    writer.prepared(ref, DEVICES, None)
    await until(lambda: len(status_devices(fake_api)) == 2 and not writer.pending())
    async with running(new_writer(api_session, delay=0.0)) as restarted:
        restarted.unprepared(ref)  # never saw it prepared
        await until(lambda: status_devices(fake_api) == [] and not restarted.pending())


async def test_unprepare_while_the_first_write_reads_the_claim_leaves_no_entries(
        writer: ClaimStatusWriter, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    fake_api.delay(0.3, verb="get", resource="resourceclaims", count=1)
    writer.prepared(ref, DEVICES, None)  # answered from the checkpoint: the write GETs it
    await until(lambda: fake_api.calls["get", "resourceclaims"] == 1)  # waiting for it
    writer.unprepared(ref)
    await until(lambda: not writer.pending())  # the write, and anything it queued, is done
    assert status_devices(fake_api) == []


async def test_a_claim_prepared_again_while_its_write_reads_it_gets_the_new_devices(
        writer: ClaimStatusWriter, fake_api: FakeApiServer):  # noqa: F811
    ref = put_claim(fake_api)
    fake_api.delay(0.3, verb="get", resource="resourceclaims", count=1)
    writer.prepared(ref, DEVICES[:1], None)
    await until(lambda: fake_api.calls["get", "resourceclaims"] == 1)  # the write reads it
    writer.prepared(ref, DEVICES, None)  # another allocation under the same uid
    await until(lambda: len(status_devices(fake_api)) == 2 and not writer.pending())
    assert {e["device"] for e in status_devices(fake_api)} == {d.device for d in DEVICES}
