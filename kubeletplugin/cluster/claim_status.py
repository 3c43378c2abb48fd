"""Device status on the ResourceClaim (``status.devices``), written off the prepare path.

After a prepare the driver says what is really on the hardware: one entry per allocated
device of *our* driver, with ``data`` (UUIDs, MIG profile and placement, compute mode and
sharing, CDI ids) and ``conditions`` (``Ready``, ``Healthy``, ``Idle``). Entries go out with
server-side apply under the driver's own field manager, so other drivers' entries of the
same claim are never touched (the list is a map keyed by driver, pool, device and shareID).

Nothing here may slow or fail a prepare: the preparer only *queues* a claim; one background
task applies the queued claims, retries failures with back-off and counts every write in
``gpudra_claim_status_writes_total{outcome}``. An unprepared claim's entries are removed by
applying an empty list, best effort (the claim is usually being deleted anyway).

A queued claim is written :data:`WRITE_DELAY` after it was first queued, not at once: the
write then does not compete with the kubelet's next calls for the CPU, the GIL and the
event loop that runs their GETs (measured when calls still ran on the loop: applying status
right after each call slowed a single unprepare; ``bench/RESULTS.md``, second session),
changes that arrive meanwhile go out in one write, and a claim unprepared before its first
write costs no write at all (outcome ``skipped``). Writes still waiting when the daemon
stops are dropped: a claim unprepared in its last half second may keep our entries (such a
claim is nearly always deleted with its pod).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import structlog
from prometheus_client import Counter

from gpudra.api.claims import ClaimRef, PreparedDevice
from gpudra.driver.checkpoint_model import ClaimRecord, DeviceRecord
from gpudra.driver.claims import ClaimError, ClaimToPrepare, resolve_configs
from gpudra.driver.devices import NodeDevices
from gpudra.driver.health import rfc3339
from gpudra.driver.mps import StatusSource
from gpudra.driver.usage import IdleTransition
from gpudra.kube.backoff import Backoff
from gpudra.kube.errors import ApiCallError, Invalid, NotFound
from gpudra.kube.log_once import FailureLog
from gpudra.kube.raw_api import RESOURCE_CLAIMS, RawApi
from gpudra.kubeletplugin.claims.claim_decoding import decode_claim
from gpudra.kubeletplugin.claims.preparer import PrepareObserver

log = structlog.get_logger(__name__)

STATUS_WRITES = Counter(
    "gpudra_claim_status_writes", "Server-side applies of claim status.devices, by outcome",
    ["outcome"])
"""Outcomes: ``ok``; ``retry`` (failed, will be retried); ``gone`` (the claim was deleted);
``rejected`` (the API server refused the content; not retried); ``given_up`` (removal of
an unprepared claim's entries abandoned); ``skipped`` (unprepared before anything was
written for it: no write needed)."""


@functools.cache
def _writes(outcome: str) -> Counter:
    """``STATUS_WRITES`` of one outcome, looked up once (``labels()`` locks and builds a
    key; an unprepare counts ``skipped`` on the kubelet's call path)."""
    return STATUS_WRITES.labels(outcome)


WRITE_DELAY: Final = 0.5
"""Seconds between a claim's first queued change and its write. A pod's containers take
longer than this to start, so the status is there when its user looks."""

REMOVE_ATTEMPTS: Final = 5
"""Tries to remove an unprepared claim's entries before giving up (the claim is most often
deleted right after, which removes them too)."""

Obj = dict[str, Any]
DeviceKey = tuple[str, str, str | None]
"""(pool, device, shareID): an entry of ours in ``status.devices``."""


@dataclass
class _Claim:
    ref: ClaimRef
    devices: dict[DeviceKey, PreparedDevice]
    spec: ClaimToPrepare | None
    data: dict[DeviceKey, Obj] | None = None  # built from the checkpoint on first write
    conditions: dict[DeviceKey, dict[str, Obj]] = field(default_factory=dict)
    removing: bool = False
    remove_attempts: int = 0
    written: bool = False
    """Entries of ours may be on the server (a write succeeded, or one has begun)."""


class ClaimStatusWriter:
    """Queues claim status changes and applies them in the background (:meth:`run`).

    All methods are for the event loop's thread; feed it from other threads with
    ``loop.call_soon_threadsafe``. ``records`` gives the checkpoint's claim records (a blocking
    file read, run in a worker thread) for the hardware details of its devices.
    """

    def __init__(self, api: RawApi, *, driver: str,
                 records: Callable[[], Mapping[str, ClaimRecord]], watch_health: bool = True,
                 backoff: Callable[[], Backoff] = lambda: Backoff(initial=0.5, cap=60.0),
                 clock: Callable[[], float] = time.time, delay: float = WRITE_DELAY,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 mps_daemon: StatusSource | None = None) -> None:
        self._api = api
        self._mps_daemon = mps_daemon  # where a device's MPS daemon runs (data)
        self._driver = driver
        self._records = records
        self._watch_health = watch_health  # without health checks, no Healthy to vouch for
        self._pass_records: Mapping[str, ClaimRecord] | None = None
        self._backoff = backoff
        self._clock = clock  # wall time, for the conditions' transition times
        self._monotonic = monotonic  # when writes are due
        self._sleep = sleep
        self._delay = delay
        self._claims: dict[str, _Claim] = {}
        self._due: dict[str, float] = {}  # uid → when to write it (monotonic)
        self._wake = asyncio.Event()
        self._sleeping_until: float | None = None
        """When the writer, waiting, wakes by itself (monotonic); None: not waiting for a time."""
        self._writing: str | None = None  # the claim whose write is under way
        self._unhealthy: dict[str, str] = {}
        self._failures = FailureLog(log)

    # --- inputs (the preparer, the health monitor, the idle tracker) ----------------------

    def prepared(self, ref: ClaimRef, devices: Sequence[PreparedDevice],
                 claim: ClaimToPrepare | None) -> None:
        """A claim was prepared (or found prepared): queue its entries, ``Ready`` true."""
        keys = {(d.pool, d.device, d.share_id): d for d in devices}
        entry = self._claims.get(ref.uid)
        if entry is not None and not entry.removing and entry.devices.keys() == keys.keys():
            return  # a kubelet retry: already queued or written
        # A changed allocation under the same uid: what was written may need replacing.
        entry = _Claim(ref, keys, claim, written=entry is not None and entry.written)
        self._claims[ref.uid] = entry
        now = self._clock()
        for key, device in keys.items():
            self._set(entry, key, "Ready", True, now=now, why=(
                "Prepared", f"prepared; CDI devices {', '.join(device.cdi_device_ids)}"))
            self._set_health(entry, key, now)
        self._queue(ref.uid)

    def unprepared(self, ref: ClaimRef) -> None:
        """A claim was unprepared: remove our entries (best effort)."""
        entry = self._claims.get(ref.uid)
        if entry is not None and not entry.written:
            # Prepared and unprepared before its first write: nothing on the server.
            _writes("skipped").inc()
            del self._claims[ref.uid]
            self._due.pop(ref.uid, None)
            return
        if entry is None:  # prepared by an earlier daemon: its entries may be there
            entry = _Claim(ref, {}, None, written=True)
        entry.removing, entry.remove_attempts = True, 0
        self._claims[ref.uid] = entry
        self._queue(ref.uid)

    def health_changed(self, unhealthy: Mapping[str, str]) -> None:
        """Device name → why it is unhealthy (e.g. its XID), for every tainted device;
        devices not named are healthy."""
        self._unhealthy = dict(unhealthy)
        now = self._clock()
        for uid, entry in self._claims.items():
            if entry.removing:
                continue
            if any([self._set_health(entry, key, now) for key in entry.devices]):
                self._queue(uid)

    def idle_changed(self, transition: IdleTransition) -> None:
        """The idle tracker decided a claim became idle or active again."""
        entry = self._claims.get(transition.claim_uid)
        if entry is None or entry.removing:
            return
        if transition.idle:
            since = transition.since if transition.since is not None else transition.at
            message = (f"idle since {rfc3339(since)}: {transition.sm_low:.0f}-"
                       f"{transition.sm_high:.0f} % SM")
        else:
            message = "in use again"
        reason = "BelowThreshold" if transition.idle else "Active"
        changed = [self._set(entry, key, "Idle", transition.idle, why=(reason, message),
                             now=transition.at) for key in entry.devices]
        if any(changed):
            self._queue(transition.claim_uid)

    # --- the background writer -------------------------------------------------------------

    async def run(self) -> None:
        """Apply queued claims when due, until cancelled; failures are retried with back-off."""
        backoff = self._backoff()
        while True:
            self._wake.clear()
            if not self._due:
                await self._wake.wait()
                continue
            soonest = min(self._due.values())
            now = self._monotonic()
            if soonest > now:
                self._sleeping_until = soonest
                try:
                    await self._nap(soonest - now)  # or woken early: something sooner
                finally:
                    self._sleeping_until = None
                continue
            self._pass_records = None  # the checkpoint is read at most once per pass
            retry_after: float | None = None
            failed = False
            now = self._monotonic()
            for uid in sorted(uid for uid, at in self._due.items() if at <= now):
                del self._due[uid]
                self._writing = uid
                try:
                    await self._write(uid)
                except ApiCallError as exc:
                    failed = True
                    retry_after = max(retry_after or 0.0, exc.retry_after or 0.0) or None
                finally:
                    self._writing = None
            if failed:
                await self._sleep(backoff.honouring(retry_after))
            else:
                backoff.reset()

    async def _nap(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if :meth:`_queue` wakes the writer."""
        woken = asyncio.ensure_future(self._wake.wait())
        napped = asyncio.ensure_future(self._sleep(seconds))
        try:
            await asyncio.wait((woken, napped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (woken, napped):
                waiter.cancel()
            await asyncio.gather(woken, napped, return_exceptions=True)

    def pending(self) -> set[str]:
        """Claims (uids) with a write still to do or under way."""
        return set(self._due) | ({self._writing} if self._writing is not None else set())

    async def _write(self, uid: str) -> None:
        entry = self._claims.get(uid)
        if entry is None:
            return
        # From here on the server may get our entries: an unprepare that comes while this
        # write reads the claim or sends it must queue their removal, not skip it.
        entry.written = True
        ref = entry.ref
        if not entry.removing and entry.data is None:
            if entry.spec is None:  # answered from the checkpoint: the config is in the claim
                entry.spec = await self._claim_spec(ref)
            if self._pass_records is None:
                self._pass_records = await asyncio.to_thread(self._records)
            entry.data = self._device_data(entry, self._pass_records.get(uid))
            record = self._pass_records.get(uid)
            if self._mps_daemon is not None and record is not None:
                for (_, _, share_id), item in entry.data.items():
                    where = self._mps_daemon(record, share_id, item.get("uuid"))
                    if where is not None:
                        item["mpsControlDaemon"] = where
        if self._claims.get(uid) is not entry:
            return  # replaced meanwhile (another allocation under the uid): its write follows
        body = self.apply_body(entry)
        removing = entry.removing  # may change while the write is in flight
        try:
            await self._api.apply(RESOURCE_CLAIMS, ref.name, body, namespace=ref.namespace,
                                  subresource="status", field_manager=self._driver, force=True)
        except NotFound:
            _writes("gone").inc()
            self._drop(uid, entry)
            return
        except Invalid as exc:  # retrying the same content cannot help
            _writes("rejected").inc()
            log.warning("claim status rejected", claim=str(ref), error=str(exc))
            if entry.removing:
                self._drop(uid, entry)
            return
        except ApiCallError as exc:
            if entry.removing:
                entry.remove_attempts += 1
                if entry.remove_attempts >= REMOVE_ATTEMPTS:
                    _writes("given_up").inc()
                    log.warning("claim status not removed", claim=str(ref), error=str(exc))
                    self._drop(uid, entry)
                    return
            _writes("retry").inc()
            self._failures.failed((exc.status, exc.reason), "claim status write failed",
                                  claim=str(ref), error=str(exc))
            self._queue(uid, wake=False)
            raise
        _writes("ok").inc()
        self._failures.recovered("claim status writes work again")
        if removing:
            self._drop(uid, entry)

    def _drop(self, uid: str, entry: _Claim) -> None:
        """Forget ``entry``, unless a newer one (the uid prepared again) has replaced it."""
        if self._claims.get(uid) is entry:
            del self._claims[uid]

    async def _claim_spec(self, ref: ClaimRef) -> ClaimToPrepare | None:
        """The claim's allocation and configs, for ``computeMode`` and ``sharing`` in
        ``data``; None (those fields left out) when the claim cannot be read or decoded."""
        try:
            raw = await self._api.get(RESOURCE_CLAIMS, ref.name, namespace=ref.namespace)
            return decode_claim(raw, namespace=ref.namespace, name=ref.name, uid=ref.uid,
                                driver=self._driver)
        except (ApiCallError, ClaimError) as exc:
            log.debug("claim config not read for its status", claim=str(ref), error=str(exc))
            return None

    def apply_body(self, entry: _Claim) -> Obj:
        """The apply configuration: all of our entries of the claim, none when removing."""
        devices: list[Obj] = []
        if not entry.removing:
            for key in sorted(entry.devices, key=lambda k: (k[0], k[1], k[2] or "")):
                pool, device, share_id = key
                item: Obj = {"driver": self._driver, "pool": pool, "device": device}
                if share_id:
                    item["shareID"] = share_id
                conditions = entry.conditions.get(key, {})
                item["conditions"] = [conditions[t] for t in sorted(conditions)]
                item["data"] = (entry.data or {}).get(key, {})
                devices.append(item)
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": entry.ref.name, "namespace": entry.ref.namespace},
                "status": {"devices": devices}}

    # --- helpers ---------------------------------------------------------------------------

    def _queue(self, uid: str, *, wake: bool = True) -> None:
        """Write the claim :data:`WRITE_DELAY` from now, or at once (``wake=False``: a retry,
        paced by the writer's back-off). The writer is woken only if it would otherwise
        wake too late: one wake-up per burst of prepares, not one per call."""
        at = self._monotonic() + (self._delay if wake else 0.0)
        self._due[uid] = min(self._due.get(uid, at), at)
        if wake and (self._sleeping_until is None or at < self._sleeping_until):
            self._wake.set()

    @staticmethod
    def _set(entry: _Claim, key: DeviceKey, kind: str, value: bool, *, why: tuple[str, str],
             now: float) -> bool:
        """Set one condition; True if it changed. The transition time moves only when the
        status flips, as for every Kubernetes condition."""
        reason, message = why
        conditions = entry.conditions.setdefault(key, {})
        old = conditions.get(kind)
        status = "True" if value else "False"
        if old is not None and (old["status"], old["reason"], old["message"]) == (
                status, reason, message):
            return False
        since = old["lastTransitionTime"] if old is not None and old["status"] == status \
            else rfc3339(now)
        conditions[kind] = {"type": kind, "status": status, "reason": reason,
                            "message": message[:1024], "lastTransitionTime": since}
        return True

    def _set_health(self, entry: _Claim, key: DeviceKey, now: float) -> bool:
        if not self._watch_health:
            return False
        why = self._unhealthy.get(key[1])
        if why is None:
            return self._set(entry, key, "Healthy", True, why=("NoErrors", "no health events"),
                             now=now)
        return self._set(entry, key, "Healthy", False, why=("Tainted", why), now=now)

    @staticmethod
    def _device_data(entry: _Claim, record: ClaimRecord | None) -> dict[DeviceKey, Obj]:
        """``data`` for each device, from the checkpoint record and the claim's config."""
        records: dict[DeviceKey, DeviceRecord] = {}
        if record is not None:
            records = {(d.pool, d.device, d.share_id): d for d in record.devices}
        configs: Mapping[str, Any] = {}
        if entry.spec is not None:
            kinds = {d.device: d.kind for d in records.values()}
            try:
                configs = resolve_configs(entry.spec, kinds)
            except ClaimError:  # prepare succeeded with it; nothing to add here
                configs = {}
        return {key: device_data(device, records.get(key), configs.get(key[1]))
                for key, device in entry.devices.items()}


def device_data(device: PreparedDevice, record: DeviceRecord | None, config: Any) -> Obj:
    """What is on the hardware for one device; only fields that are known."""
    data: Obj = {"cdiDeviceIDs": list(device.cdi_device_ids)}
    if record is not None:
        data["kind"] = str(record.kind)
        if record.uuid:
            data["uuid"] = record.uuid
        if record.parent_uuid and record.parent_uuid != record.uuid:
            data["parentUUID"] = record.parent_uuid
        if record.mig is not None:
            mig = record.mig
            data["mig"] = {"profileID": mig.profile_id,
                           "placement": {"start": mig.placement_start,
                                         "size": mig.placement_size},
                           "gpuInstanceID": mig.gpu_instance_id,
                           "computeInstanceID": mig.compute_instance_id}
            if mig.mig_uuid:
                data["uuid"] = mig.mig_uuid
        if record.vfio is not None:  # passed through: where the VM finds it
            data["kind"] = "vfio"
            data["pciBusID"] = record.vfio.functions[0].bus_id
            data["iommuGroup"] = record.vfio.iommu_group
    if config is not None:
        dumped = config.model_dump(by_alias=True, exclude_none=True, mode="json")
        for name in ("computeMode", "sharing", "profile"):
            if name in dumped:
                data[name] = dumped[name]
    return data


def unhealthy_devices(devices: NodeDevices) -> dict[str, str]:
    """Device name → a one-line reason (its taints, e.g. the XID), for tainted devices."""
    return {device.name: "; ".join(f"{t.key}={t.value}:{t.effect}" if t.value else
                                   f"{t.key}:{t.effect}" for t in device.taints)
            for device in devices.devices if device.taints}


class Observers:
    """Several :class:`~gpudra.kubeletplugin.claims.preparer.PrepareObserver` s as one."""

    def __init__(self, *observers: PrepareObserver) -> None:
        self._observers = observers

    def prepared(self, ref: ClaimRef, devices: Sequence[PreparedDevice],
                 claim: ClaimToPrepare | None) -> None:
        for observer in self._observers:
            observer.prepared(ref, devices, claim)

    def unprepared(self, ref: ClaimRef) -> None:
        for observer in self._observers:
            observer.unprepared(ref)


def idle_listener(loop: asyncio.AbstractEventLoop,
                  *consumers: Callable[[IdleTransition], None]) -> Callable[[IdleTransition], None]:
    """An :class:`~gpudra.driver.usage.IdleTracker` listener (called on the sampler's
    thread) that hands each transition to ``consumers`` on the loop's thread."""
    def listen(transition: IdleTransition) -> None:
        for consume in consumers:
            loop.call_soon_threadsafe(consume, transition)
    return listen
