"""The usage sampler: one NVML pass per GPU per interval, off the event loop, into metrics.

Each pass reads the prepared claims from the checkpoint, asks NVML once per GPU that holds
any (its own figures and those of the claims' MIG devices), turns the answers into
:class:`~gpudra.driver.usage.DeviceUsage` rows, feeds the :class:`IdleTracker` and sets the
per-claim gauges, removing the label sets of claims that are gone.

What is approximate: a share of a GPU reports the whole GPU's SM % and memory (NVML has no
per-share figures); a MIG device's SM % is GPM's (Hopper and newer) from the second pass on,
and otherwise unknown: the gauge is left out and idle detection counts the device busy
while it holds memory and quiet while it holds none.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from prometheus_client import Gauge, Histogram

from gpudra.api.claims import ClaimRef, PreparedDevice
from gpudra.driver.checkpoint_model import ClaimRecord, DeviceRecord
from gpudra.driver.claims import ClaimToPrepare
from gpudra.driver.device_state import DeviceState
from gpudra.driver.nvml import GpuUsage, Nvml, NvmlError
from gpudra.driver.usage import DeviceUsage, IdleTracker

log = structlog.get_logger(__name__)

DEFAULT_INTERVAL_SECONDS = 10.0

DEVICE_LABELS = ("namespace", "claim", "pod", "device", "gpu_uuid", "mig_profile", "share_id")
CLAIM_LABELS = ("namespace", "claim", "pod")

SM_UTILIZATION = Gauge("gpudra_claim_sm_utilization_percent",
                       "SM utilisation of a prepared device, 0-100", DEVICE_LABELS)
MEMORY_USED = Gauge("gpudra_claim_memory_used_bytes",
                    "Memory used on a prepared device", DEVICE_LABELS)
MEMORY_TOTAL = Gauge("gpudra_claim_memory_total_bytes",
                     "Memory of a prepared device", DEVICE_LABELS)
POWER = Gauge("gpudra_claim_power_watts", "Power draw of a prepared full GPU", DEVICE_LABELS)
IDLE_SECONDS = Gauge("gpudra_claim_idle_seconds",
                     "Seconds all devices of a claim have been under the idle threshold "
                     "(0 while active)", CLAIM_LABELS)
SAMPLE_SECONDS = Histogram("gpudra_usage_sample_seconds", "Time of one usage sampling pass",
                           buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))


class ClaimPods:
    """The pods each prepared claim is reserved for, as prepare saw them.

    A :class:`~gpudra.kubeletplugin.claims.preparer.PrepareObserver`, told in the call's thread
    right after the device work, before the answer (the preparer's ``at_once``): a sample
    finds a prepared claim without its pods only in the brief window between the
    checkpoint commit and that. Claims prepared before a daemon restart have no pods here
    until the kubelet prepares them again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[str, ...]] = {}

    def prepared(self, ref: ClaimRef, devices: Sequence[PreparedDevice],
                 claim: ClaimToPrepare | None) -> None:
        if claim is not None:
            with self._lock:
                self._pods[ref.uid] = claim.pods

    def unprepared(self, ref: ClaimRef) -> None:
        with self._lock:
            self._pods.pop(ref.uid, None)

    def get(self, uid: str) -> tuple[str, ...]:
        with self._lock:
            return self._pods.get(uid, ())


@dataclass(frozen=True)
class _Held:
    """A device of a prepared claim, located on its GPU."""

    record: ClaimRecord
    device: DeviceRecord
    gpu_uuid: str
    mig_uuid: str | None
    gpu_instance_id: int | None


class UsageSampler:
    """Samples prepared devices every ``interval`` seconds in its own thread.

    ``latest`` holds the last pass's rows; ``on_sample`` callbacks get each pass's rows on
    the sampler thread (after the tracker and the gauges are updated).
    """

    def __init__(self, *, nvml: Nvml, state: DeviceState, tracker: IdleTracker,
                 pods: ClaimPods, interval: float = DEFAULT_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._state = state
        self.tracker = tracker
        self.pods = pods
        self.interval = interval
        self._clock = clock
        self.latest: tuple[DeviceUsage, ...] = ()
        self.on_sample: list[Callable[[Sequence[DeviceUsage]], None]] = []
        self._exported: set[tuple[str, ...]] = set()
        self._exported_claims: set[tuple[str, ...]] = set()
        self._failing: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- thread ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="usage-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the pass in progress (if any); the gauges keep their last values."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # a bad pass must not end sampling for good
                log.exception("usage sampling failed")
            self._stop.wait(self.interval)

    # --- one pass --------------------------------------------------------------------------

    def sample(self) -> list[DeviceUsage]:
        """One pass: read NVML for every GPU holding a prepared device; update everything."""
        started = time.perf_counter()
        claims = self._state.completed()
        by_gpu: dict[str, list[_Held]] = {}
        for record in claims.values():
            for device in record.devices:
                located = _locate(record, device)
                if located is not None:
                    by_gpu.setdefault(located.gpu_uuid, []).append(located)
        now = self._clock()
        rows: list[DeviceUsage] = []
        for gpu_uuid, held in by_gpu.items():
            usage = self._read(gpu_uuid, held)
            if usage is not None:
                rows.extend(self._row(h, usage, now) for h in held)
        self.tracker.observe(rows)
        self._export(rows)
        self.latest = tuple(rows)
        for callback in list(self.on_sample):
            try:
                callback(rows)
            except Exception:  # one bad subscriber must not silence the rest
                log.exception("usage subscriber failed")
        SAMPLE_SECONDS.observe(time.perf_counter() - started)
        return rows

    def _read(self, gpu_uuid: str, held: list[_Held]) -> GpuUsage | None:
        migs = {h.mig_uuid: h.gpu_instance_id for h in held if h.mig_uuid is not None}
        try:
            usage = self._nvml.gpu_usage(gpu_uuid, migs)
        except NvmlError as exc:
            if gpu_uuid not in self._failing:  # once per outage, not once per pass
                log.warning("cannot sample GPU usage", gpu=gpu_uuid, error=str(exc))
                self._failing.add(gpu_uuid)
            return None
        self._failing.discard(gpu_uuid)
        return usage

    def _row(self, held: _Held, usage: GpuUsage, now: float) -> DeviceUsage:
        record, device = held.record, held.device
        mig = usage.mig.get(held.mig_uuid) if held.mig_uuid is not None else None
        if mig is not None:
            exact = mig.sm_percent is not None
            sm = mig.sm_percent if mig.sm_percent is not None else (
                100.0 if mig.memory_used_bytes else 0.0)
            used, total, power = mig.memory_used_bytes, mig.memory_total_bytes, None
        else:
            exact = usage.sm_percent is not None
            sm = usage.sm_percent if usage.sm_percent is not None else 0.0
            used, total = usage.memory_used_bytes, usage.memory_total_bytes
            power = usage.power_watts if device.share_id is None else None
        return DeviceUsage(
            claim_uid=record.uid, namespace=record.namespace, claim=record.name,
            pods=self.pods.get(record.uid), device=device.device, gpu_uuid=held.gpu_uuid,
            sm_percent=sm, memory_used_bytes=used, memory_total_bytes=total, sampled_at=now,
            power_watts=power, mig_profile=self._mig_profile(device) if mig else None,
            mig_uuid=held.mig_uuid, share_id=device.share_id, sm_exact=exact)

    def _mig_profile(self, device: DeviceRecord) -> str | None:
        for published in self._state.index.devices.devices:
            if published.name == device.device:
                profile = published.attributes.get("profile")
                return profile if isinstance(profile, str) else None
        return None

    # --- metrics ---------------------------------------------------------------------------

    def _export(self, rows: Sequence[DeviceUsage]) -> None:
        exported: set[tuple[str, ...]] = set()
        claims: set[tuple[str, ...]] = set()
        for row in rows:
            labels = device_labels(row)
            exported.add(labels)
            if row.sm_exact:
                SM_UTILIZATION.labels(*labels).set(row.sm_percent)
            elif labels in self._exported:
                _remove(SM_UTILIZATION, labels)
            MEMORY_USED.labels(*labels).set(row.memory_used_bytes)
            MEMORY_TOTAL.labels(*labels).set(row.memory_total_bytes)
            if row.power_watts is not None:
                POWER.labels(*labels).set(row.power_watts)
            claim: tuple[str, ...] = (row.namespace, row.claim, ",".join(row.pods))
            if claim not in claims:
                claims.add(claim)
                state = self.tracker.state(row.claim_uid)
                IDLE_SECONDS.labels(*claim).set(
                    0.0 if state is None else state.idle_seconds(row.sampled_at))
        for gone in self._exported - exported:
            for gauge in (SM_UTILIZATION, MEMORY_USED, MEMORY_TOTAL, POWER):
                _remove(gauge, gone)
        for gone in self._exported_claims - claims:
            _remove(IDLE_SECONDS, gone)
        self._exported, self._exported_claims = exported, claims


def device_labels(row: DeviceUsage) -> tuple[str, ...]:
    """Label values in :data:`DEVICE_LABELS` order ("" where a label does not apply)."""
    return (row.namespace, row.claim, ",".join(row.pods), row.device, row.gpu_uuid,
            row.mig_profile or "", row.share_id or "")


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):  # never set (e.g. no power figure)
        gauge.remove(*labels)


def _locate(record: ClaimRecord, device: DeviceRecord) -> _Held | None:
    if device.kind == "mig":
        mig = device.mig
        parent = device.parent_uuid or (mig.parent_uuid if mig else None)
        mig_uuid = (mig.mig_uuid if mig else None) or device.uuid
        if parent is None or mig_uuid is None:
            return None
        return _Held(record, device, parent, mig_uuid, mig.gpu_instance_id if mig else None)
    gpu = device.uuid or device.parent_uuid
    return None if gpu is None else _Held(record, device, gpu, None, None)
