"""Preparing and unpreparing claims, made crash-safe and idempotent.

Every claim goes through two checkpoint phases. ``PrepareStarted`` is saved before any
hardware is touched and names what is about to be created (a MIG device is recorded by
parent, profile and placement before it exists, and by its ids as soon as it does);
``PrepareCompleted`` is saved after the CDI spec is written. A crash anywhere in between
leaves a started record that :meth:`DeviceState.reconcile` (at start) or the next prepare
of the same claim rolls back. All work happens under the checkpoint's file lock, so two
daemon instances sharing the data directory (a rolling update) never interleave.

A kubelet call is one batch: its specs are written without an fsync each and the CDI
directory is synced once, before the one checkpoint commit that marks them prepared
(claims that change a GPU keep their own two-phase commits). Spec *contents* need no
fsync: a process crash keeps the page cache, and after a power cut the node has a new
boot id, so the checkpoint drops every claim and start-up removes every spec. Unprepare
undoes a call's claims under one hold of their GPUs and commits once.

What a claim does to a GPU, and its undo, is :mod:`gpudra.driver.claim_hardware`'s;
start-up reconciliation is :mod:`gpudra.driver.reconcile`'s; the node's state is built
whole, after reconciliation, by :mod:`gpudra.driver.node_factory`.
"""

from __future__ import annotations

import datetime
import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import structlog

from gpudra.api.claims import PreparedDevice
from gpudra.driver import cdi, metrics, shares
from gpudra.driver.checkpoint_codec import CheckpointError
from gpudra.driver.checkpoint_model import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    ClaimRecord,
    DeviceRecord,
    with_claim,
    with_claim_completed,
    with_claim_started,
    without_claim,
)
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.claim_commit import ClaimCommit
from gpudra.driver.claim_hardware import ClaimHardware, planned_device, touches_hardware
from gpudra.driver.claims import ClaimError, ClaimToPrepare
from gpudra.driver.commands import CommandError
from gpudra.driver.driver_root import DriverRoot, uses_video
from gpudra.driver.faults import crash_point, delay_point
from gpudra.driver.gpu_locks import GpuLocks, GpuLockTimeout
from gpudra.driver.held import HeldDevice, kept_mig_instances
from gpudra.driver.held import conflict as held_conflict
from gpudra.driver.inventory import PcieRootResolver, with_answering_gpus
from gpudra.driver.node_view import NodeView
from gpudra.driver.nvml import NvmlError
from gpudra.driver.prepare_plan import (
    DeviceStep,
    DynamicMigTarget,
    GpuTarget,
    NodeIndex,
    PreparePlan,
    ShareTarget,
    StaticMigTarget,
    VfioTarget,
    plan_claim,
)
from gpudra.driver.reconcile import ReconcileReport, clean_up_gpu, reconcile
from gpudra.driver.vfio import common_edits as vfio_common_edits

log = structlog.get_logger(__name__)

Prepared = tuple[PreparedDevice, ...]


def _now() -> str:
    return _utc_second(int(time.time()))


@functools.lru_cache(maxsize=2)
def _utc_second(second: int) -> str:
    """The UTC time to the second, formatted once per second (not once per claim)."""
    return datetime.datetime.fromtimestamp(second, datetime.UTC).isoformat()


class DeviceState:
    """The node's prepared claims and the hardware state behind them.

    Built whole, after start-up reconciliation, by
    :func:`gpudra.driver.node_factory.build_device_state`; nothing is set on it afterwards.
    Its devices are one immutable :class:`NodeView`, swapped by :meth:`refresh_gpus`.
    Feature gates that are off are refused per claim by ``hardware`` (see
    :class:`~gpudra.driver.claim_hardware.ClaimHardware`).
    """

    def __init__(
        self,
        *,
        driver: str,
        view: NodeView,
        store: CheckpointStore,
        hardware: ClaimHardware,
        gpu_locks: GpuLocks,
        cdi_root: Path,
        driver_root: DriverRoot,
        pcie_root: PcieRootResolver,
        held: tuple[HeldDevice, ...] = (),
        lock_timeout: float = 30.0,
    ) -> None:
        self.driver = driver
        self._view = view
        self.store = store
        self.hardware = hardware
        self.gpu_locks = gpu_locks
        self.cdi_root = cdi_root
        self.driver_root = driver_root
        self._pcie_root = pcie_root
        self.held = held
        """Hardware held for claims the node cannot name: never destroyed, never prepared."""
        self._lock_timeout = lock_timeout
        self._refreshing = threading.Lock()
        self.gpus_returned: Callable[[], None] | None = None
        """Called (from the unprepare's thread) when a VFIO unprepare gave GPUs back to
        ``nvidia``: the daemon refreshes and republishes (GPUs a VM held at start-up)."""

    # --- the devices -----------------------------------------------------------------------

    @property
    def view(self) -> NodeView:
        """The node's devices now; take it once and use that (another thread may swap it)."""
        return self._view

    @property
    def index(self) -> NodeIndex:
        return self._view.index

    def watched_gpus(self) -> list[str]:
        """Every physical GPU, also those that publish only static MIG and those that do not
        answer yet: what the health watcher watches."""
        return self._view.watched_gpus()

    def refresh_gpus(self) -> bool:
        """Publish GPUs that could not be read at start-up once they answer; True when the
        devices changed (the view is then swapped whole). Blocking NVML reads of those GPUs
        only: call it off the event loop, e.g. from the health watcher's thread when a lost
        GPU answers again."""
        with self._refreshing:  # one refresher at a time: none builds on a stale view
            view = self._view
            nvml = self.hardware.nvml
            answering = [g.uuid for g in view.inventory.unavailable
                         if g.uuid is not None and nvml.why_unavailable(g.uuid) is None]
            if not answering:
                return False
            try:
                # Claims on it may have been unprepared while it was gone: clean up first,
                # so what they left is not published as an admin's MIG layout.
                destroyed = self.clean_up_gpus(answering)
                updated = with_answering_gpus(nvml, view.inventory, pcie_root=self._pcie_root)
            except (NvmlError, GpuLockTimeout, CheckpointError, OSError) as exc:
                log.warning("cannot add GPUs that answer again; trying on the next change",
                            gpus=answering, error=str(exc))
                return False
            if destroyed:
                log.info("destroyed MIG devices no prepared claim owns", uuids=destroyed)
            if updated is view.inventory:
                return False
            # The GPUs already published are built exactly as before; MIG devices prepared
            # since start-up count as ours on the new ones.
            options = replace(view.options, owned_mig_uuids=frozenset(
                view.options.owned_mig_uuids) | self.owned_mig_uuids())
            self._view = NodeView.build(view.index.pool, updated, options)
        back = {g.probe.uuid for g in updated.gpus} - {g.probe.uuid for g in view.inventory.gpus}
        for uuid in sorted(back):
            log.info("GPU answers NVML again; publishing its devices", gpu=uuid)
        return True

    # --- queries ---------------------------------------------------------------------------

    def prepared(self, uid: str) -> Prepared | None:
        """The kubelet answer for a claim already prepared, or ``None``."""
        return self.prepared_many([uid]).get(uid)

    def prepared_many(self, uids: Iterable[str]) -> dict[str, Prepared]:
        """Answers for those of ``uids`` already prepared (one checkpoint read)."""
        claims = self.store.load().claims
        found = {}
        for uid in uids:
            record = claims.get(uid)
            if record is not None and record.state == PREPARE_COMPLETED:
                found[uid] = tuple(d.prepared() for d in record.devices)
        return found

    def owned_mig_uuids(self) -> set[str]:
        """MIG devices prepared claims hold: published as dynamic, not as static MIG."""
        return owned_mig_uuids(self.store.load())

    def passed_through(self) -> frozenset[str]:
        """GPUs claims hold on ``vfio-pci`` (or are moving there or back): NVML cannot see
        them on purpose. One checkpoint read (cached until the file changes)."""
        return frozenset(f.gpu_uuid for r in self.store.load().claims.values()
                         for d in r.devices if d.vfio is not None
                         for f in d.vfio.functions if f.gpu_uuid is not None)

    def records(self) -> Mapping[str, ClaimRecord]:
        """Every claim the checkpoint holds now, started or prepared, by uid."""
        return self.store.load().claims

    def completed(self) -> dict[str, ClaimRecord]:
        """The prepared claims (``PrepareCompleted``) now, by uid."""
        return self.store.load().completed()

    # --- prepare ---------------------------------------------------------------------------

    def prepare(self, claim: ClaimToPrepare) -> Prepared:
        """Prepare one claim; idempotent. Raises :class:`ClaimError` and then changes nothing."""
        result = self.prepare_many([claim])[claim.uid]
        if isinstance(result, ClaimError):
            raise result
        return result

    def prepare_many(
        self, claims: Sequence[ClaimToPrepare]
    ) -> dict[str, Prepared | ClaimError]:
        """Prepare a kubelet call's claims under one lock, each on its own (one failing
        changes nothing for it and does not stop the others).

        Claims that change nothing on a GPU are checkpointed together at the end: one
        durable write per call instead of one per claim. Until then their only side effect
        is their CDI spec, which reconcile removes if the process dies first.
        """
        view = self._view  # one index for the whole call
        try:
            # Different GPUs proceed in parallel (other kubelet calls, the other daemon
            # instance); anything on the same GPU waits here.
            with self.gpu_locks.hold(_parents_of(claims, view.index), self._lock_timeout), \
                    self.driver_root.one_look():
                return self._prepare_held(claims, view)
        except GpuLockTimeout as exc:
            return {claim.uid: ClaimError(f"claim {claim.ref}: {exc}; will retry")
                    for claim in claims}
        except OSError as exc:  # the node's own files (checkpoint, spec): e.g. a full disk
            # Each claim gets the error, not the whole kubelet call: the retry converges,
            # as after a crash at the same point.
            return {claim.uid: ClaimError(f"claim {claim.ref}: {_unwritable(exc)}")
                    for claim in claims}

    def _prepare_held(
        self, claims: Sequence[ClaimToPrepare], view: NodeView,
    ) -> dict[str, Prepared | ClaimError]:
        # A lockless read (a consistent state, see checkpoint_store): what it could miss is
        # another instance's commit in progress, and on these GPUs none can be, as we hold
        # them. Commits below merge into a fresh read under the lock.
        cp = self.store.load()
        results: dict[str, Prepared | ClaimError] = {}
        deferred: list[ClaimToPrepare] = []
        try:
            for claim in claims:
                try:
                    results[claim.uid], cp, later = self._prepare_locked(claim, cp, view)
                except ClaimError as exc:
                    results[claim.uid] = exc
                    continue
                except (NvmlError, CommandError, cdi.CdiError, OSError) as exc:
                    # One claim's failure is that claim's error; it must not lose the
                    # results (and deferred checkpoint state) of the others.
                    results[claim.uid] = ClaimError(f"claim {claim.ref}: {exc}")
                    continue
                if later:
                    deferred.append(claim)
        finally:
            if deferred:
                results.update(self._commit_deferred(cp, deferred))
        metrics.PREPARED_CLAIMS.set(cp.completed_count())
        return results

    def _commit_deferred(
        self, cp: Checkpoint, claims: Sequence[ClaimToPrepare],
    ) -> dict[str, ClaimError]:
        """Sync the call's specs, then mark its claims prepared in one checkpoint commit;
        the claims that failed instead (their specs removed)."""
        try:
            # Specs durable before the commit that hands them out; a crash in between
            # leaves specs no completed claim owns, which reconcile removes.
            cdi.sync_root(self.cdi_root)
            crash_point("prepare:after-cdi-sync")
        except cdi.CdiError as exc:
            for claim in claims:
                cdi.remove_spec(self.cdi_root, self.driver, claim.uid)
            return {claim.uid: ClaimError(f"claim {claim.ref}: {exc}") for claim in claims}
        batch = self._commit(cp)
        for claim in claims:
            batch.put(cp.claims[claim.uid])
        batch.commit()
        return {}

    def _commit(self, cp: Checkpoint) -> ClaimCommit:
        """A commit carrying ``cp``'s MIG-mode baselines: ``cp`` is authoritative for those
        of the GPUs this call holds (see :class:`ClaimCommit` for the merge)."""
        return ClaimCommit(self.store, lock_timeout=self._lock_timeout).baselines(
            cp.mig_mode_baseline)

    def _prepare_locked(
        self, claim: ClaimToPrepare, cp: Checkpoint, view: NodeView,
    ) -> tuple[Prepared, Checkpoint, bool]:
        existing = cp.claims.get(claim.uid)
        if existing is not None and existing.state == PREPARE_COMPLETED:
            return tuple(d.prepared() for d in existing.devices), cp, False
        if existing is not None:
            log.warning("rolling back an interrupted prepare", claim=claim.ref)
            self._undo(existing, cp)
            cp = without_claim(cp, claim.uid)
            self._commit(cp).remove(claim.uid).commit()
        plan = plan_claim(claim, view.index)
        self._check_conflicts(plan, cp)
        return self._execute(plan, cp, view)

    def _check_conflicts(self, plan: PreparePlan, cp: Checkpoint) -> None:
        """The last line of defence: never hand out what another prepared claim holds."""
        claim = plan.claim
        held = cp.devices_in_use(exclude_uid=claim.uid)
        owners = {
            (d.pool, d.device): r for r in cp.claims.values() if r.uid != claim.uid
            for d in r.devices
        }
        for step in plan.steps:
            if step.allocated.admin_access:
                continue
            unknown = held_conflict(self.held, step.target, admin_access=False)
            if unknown is not None:
                raise ClaimError(
                    f"claim {claim.ref}: device {step.allocated.device!r} is on hardware held "
                    f"for a claim this node cannot name ({unknown.what}: {unknown.reason}); "
                    "see README, Operations")
            key = (step.allocated.pool, step.allocated.device)
            if step.share is not None:  # shares of one device coexist: checked by capacity
                earlier = [s.share for s in plan.steps[:plan.steps.index(step)] if s.share]
                shares.check_against_prepared(claim, step.share, cp, _capacity(step), earlier)
            elif key in held:
                raise ClaimError(f"claim {claim.ref}: device {step.allocated.device!r} is already "
                                 f"prepared for claim {owners[key].ref}")
            for holder, held_device in _physical_holders(cp, claim.uid):
                if step.share is not None and held_device.share_id is not None:
                    continue
                if _physically_overlap(step, held_device):
                    raise ClaimError(
                        f"claim {claim.ref}: device {step.allocated.device!r} overlaps device "
                        f"{held_device.device!r} of claim {holder.ref} on GPU {step.parent_uuid}")

    def _execute(
        self, plan: PreparePlan, cp: Checkpoint, view: NodeView,
    ) -> tuple[Prepared, Checkpoint, bool]:
        """Do it; returns the results, the new checkpoint and whether saving it is left to
        the caller (claims that touch no hardware)."""
        claim = plan.claim
        self.hardware.preflight(plan)
        cp, restore = self.hardware.record_mig_state(plan, cp)
        record = ClaimRecord(
            uid=claim.uid, namespace=claim.namespace, name=claim.name, state=PREPARE_STARTED,
            devices=[planned_device(step) for step in plan.steps],
            restore=restore, started_at=_now(),
        )
        cp = with_claim_started(cp, record)
        hardware = touches_hardware(plan, cp)
        if hardware:
            self._commit(cp).put(record).commit()
        # else: the only side effect is the CDI spec, and a crash before PrepareCompleted
        # leaves a spec no completed claim owns, which reconcile removes; skipping this
        # durable write saves two fsyncs on the common full-GPU path.
        crash_point("prepare:after-started")
        if hardware:
            delay_point("prepare:hardware")  # slow GPUs, in concurrency tests
        progress = [record]
        started = cp
        try:
            record = self.hardware.apply(
                plan, progress, lambda done: self._commit(started).put(done).commit(), cp=cp)
            cp = with_claim(cp, record)
            specs = [self._cdi_device(claim.uid, step, device)
                     for step, device in zip(plan.steps, record.devices, strict=True)]
            published = view.by_name
            video = uses_video(published[s.allocated.device] for s in plan.steps
                               if s.allocated.device in published)
            # A VM's claim gets no driver files: its guest brings its own driver.
            common = (vfio_common_edits() if all(isinstance(s.target, VfioTarget)
                                                 for s in plan.steps)
                      else self.driver_root.common_edits(video=video))
            spec = cdi.build_claim_spec(driver=self.driver, claim_uid=claim.uid, devices=specs,
                                        common=common)
            cdi.write_spec(self.cdi_root, spec, claim_uid=claim.uid, durable=False)
            crash_point("prepare:after-cdi-write")
            if hardware:  # else the caller syncs once for the whole call
                cdi.sync_root(self.cdi_root)
                crash_point("prepare:after-cdi-sync")
        except (NvmlError, cdi.CdiError, ClaimError, CommandError, OSError) as exc:
            # Undo what was really done: the latest record, not the plan we started from.
            self._undo(progress[-1], cp)
            if hardware:
                self._commit(cp).remove(claim.uid).commit()
            if isinstance(exc, ClaimError):
                raise
            raise ClaimError(f"claim {claim.ref}: {exc}") from exc
        qualified = [
            d.model_copy(update={
                "cdi_device_ids": [cdi.qualified_name(
                    self.driver, claim.uid, shares.cdi_device_name(d.device, d.share_id))]})
            for d in record.devices
        ]
        cp = with_claim_completed(cp, claim.uid, qualified)
        if hardware:
            self._commit(cp).put(cp.claims[claim.uid]).commit()
        return tuple(d.prepared() for d in qualified), cp, not hardware

    def _cdi_device(self, uid: str, step: DeviceStep, device: DeviceRecord) -> cdi.CdiDevice:
        target = step.target
        if isinstance(target, VfioTarget):
            assert device.vfio is not None and self.hardware.vfio is not None  # bound by now
            edits = self.hardware.vfio.container_edits(device.vfio, self.driver_root.device_node)
        elif isinstance(target, GpuTarget):
            edits = self.driver_root.gpu_edits(target.minor)
        elif isinstance(target, StaticMigTarget):
            edits = self.driver_root.mig_edits(target.parent_minor, target.gpu_instance_id,
                                               target.compute_instance_id)
        else:
            assert device.mig is not None
            edits = self.driver_root.mig_edits(target.parent_minor, device.mig.gpu_instance_id,
                                               device.mig.compute_instance_id)
        extra = self.hardware.container_edits(uid, step)  # MPS pipe, a share's limits
        if extra is not None:
            edits = edits.merge(extra)
        return cdi.CdiDevice(name=shares.cdi_device_name(device.device, device.share_id),
                             edits=edits)

    # --- unprepare -------------------------------------------------------------------------

    def unprepare(self, uid: str) -> None:
        """Undo a claim from the checkpoint alone; unknown claims are fine (idempotent)."""
        error = self.unprepare_many([uid])[uid]
        if error is not None:
            raise error

    def unprepare_many(self, uids: Sequence[str]) -> dict[str, ClaimError | None]:
        """Undo a kubelet call's claims under one hold of their GPUs and commit once; each
        claim's failure is its own (``None``: done). Unknown claims are fine (idempotent)."""
        claims = self.store.load().claims
        records = {uid: claims[uid] for uid in uids if uid in claims}
        results = {uid: self._remove_spec(uid) for uid in uids if uid not in records}
        if not records:
            return results
        parents = {str(d.parent_uuid or d.uuid) for r in records.values() for d in r.devices
                   if d.parent_uuid or d.uuid}
        parents |= {str(f.gpu_uuid) for r in records.values() for d in r.devices
                    if d.vfio is not None for f in d.vfio.functions if f.gpu_uuid}
        try:
            with self.gpu_locks.hold(parents, self._lock_timeout):
                results.update(self._unprepare_held(records))
        except GpuLockTimeout as exc:
            results.update({uid: ClaimError(f"claim {record.ref}: {exc}; will retry")
                            for uid, record in records.items()})
        except OSError as exc:  # as in prepare_many
            results.update({uid: ClaimError(f"claim {record.ref}: {_unwritable(exc)}")
                            for uid, record in records.items()})
        if self.gpus_returned is not None and any(
                results.get(uid) is None and any(d.vfio for d in record.devices)
                for uid, record in records.items()):
            self.gpus_returned()
        return results

    def _unprepare_held(
        self, records: Mapping[str, ClaimRecord],
    ) -> dict[str, ClaimError | None]:
        cp = self.store.load()  # lockless: see _prepare_held
        results: dict[str, ClaimError | None] = {}
        batch = self._commit(cp)
        try:
            for uid, record in records.items():
                current = cp.claims.get(uid)
                if current is None:  # the other daemon instance finished it meanwhile
                    results[uid] = self._remove_spec(uid)
                    continue
                try:
                    self._undo(current, cp)
                except (NvmlError, CommandError, cdi.CdiError, OSError) as exc:
                    results[uid] = ClaimError(
                        f"claim {record.ref}: unprepare failed, will retry: {exc}")
                    continue
                # Later claims' undo must not count this one as still holding its GPU.
                cp = without_claim(cp, uid)
                batch.remove(uid)
                results[uid] = None
        finally:
            batch.commit()  # what was undone, even when a later claim's undo raised
        metrics.PREPARED_CLAIMS.set(cp.completed_count())
        return results

    def _remove_spec(self, uid: str) -> ClaimError | None:
        try:
            cdi.remove_spec(self.cdi_root, self.driver, uid)
        except cdi.CdiError as exc:
            return ClaimError(f"claim {uid}: unprepare failed, will retry: {exc}")
        return None

    def _undo(self, record: ClaimRecord, cp: Checkpoint) -> None:
        undo_claim(self.hardware, self.cdi_root, self.driver, record, cp)

    # --- start-up reconciliation -----------------------------------------------------------

    def reconcile(self) -> ReconcileReport:
        """Converge after a crash: roll back half-prepared claims, destroy leaked MIG devices
        on GPUs this driver manages, remove CDI specs no prepared claim owns."""
        return reconcile_node(self.store, self.hardware, self.gpu_locks, self._view.gpus,
                              cdi_root=self.cdi_root, driver=self.driver, held=self.held,
                              lock_timeout=self._lock_timeout)

    def clean_up_gpus(self, gpus: Iterable[str]) -> list[str]:
        """For GPUs that answer again after start-up: what start-up reconciliation does on
        each (leaked MIG devices destroyed, MIG mode put back); the MIG UUIDs destroyed."""
        wanted = sorted(set(gpus))
        with self.gpu_locks.hold(set(wanted), self._lock_timeout), \
                self.store.locked(self._lock_timeout):
            cp = self.store.load()
            held = kept_mig_instances(self.held)
            return [uuid for gpu in wanted
                    for uuid in clean_up_gpu(self.hardware, cp, gpu, held)]


def reconcile_node(
    store: CheckpointStore, hardware: ClaimHardware, gpu_locks: GpuLocks, gpus: Iterable[str],
    *, cdi_root: Path, driver: str, held: Sequence[HeldDevice], lock_timeout: float,
) -> ReconcileReport:
    """:func:`gpudra.driver.reconcile.reconcile` under every GPU's lock, then the
    checkpoint's: a running daemon instance may not be mid-prepare."""
    with gpu_locks.hold(set(gpus), lock_timeout), store.locked(lock_timeout):
        return reconcile(store, hardware,
                         undo=functools.partial(undo_claim, hardware, cdi_root, driver),
                         cdi_root=cdi_root, driver=driver, held=kept_mig_instances(held))


def undo_claim(hardware: ClaimHardware, cdi_root: Path, driver: str, record: ClaimRecord,
               cp: Checkpoint) -> None:
    """Put the hardware back, then remove the CDI spec."""
    gone = hardware.undo(record, cp)
    for gpu, reason in gone.items():
        # Nothing to put back on a GPU that is not there; the claim is released anyway.
        log.warning("GPU is gone: left as it is while releasing the claim", claim=record.ref,
                    gpu=gpu, reason=reason)
    cdi.remove_spec(cdi_root, driver, record.uid)
    crash_point("unprepare:after-cdi-remove")


def owned_mig_uuids(cp: Checkpoint) -> set[str]:
    """MIG devices prepared claims hold: published as dynamic, not as static MIG."""
    return {d.mig.mig_uuid for r in cp.completed().values() for d in r.devices
            if d.mig is not None and d.mig.created and d.mig.mig_uuid}


def _parents_of(claims: Iterable[ClaimToPrepare], index: NodeIndex) -> set[str]:
    """The physical GPUs a set of claims touches (unknown devices fail later, in plan)."""
    parents = set()
    for claim in claims:
        for device in claim.devices:
            target = index.targets.get(device.device)
            if target is not None:
                parents.add(target.uuid if isinstance(target, GpuTarget) else target.parent_uuid)
            if isinstance(target, VfioTarget):  # its IOMMU group goes with it
                parents.update(target.group_gpus)
    return parents


def _capacity(step: DeviceStep) -> dict[str, int]:
    return dict(step.target.capacity) if isinstance(step.target, ShareTarget) else {}


def _physical_holders(
    cp: Checkpoint, exclude_uid: str
) -> Iterable[tuple[ClaimRecord, DeviceRecord]]:
    for record in cp.claims.values():
        if record.uid == exclude_uid:
            continue
        for device in record.devices:
            if not device.admin_access:
                yield record, device


def _physically_overlap(step: DeviceStep, other: DeviceRecord) -> bool:
    """Whether a planned device and a prepared one share hardware on the same GPU."""
    target = step.target
    other_parent = other.parent_uuid or other.uuid
    if step.parent_uuid != other_parent:
        return False
    if isinstance(target, GpuTarget) or other.kind == "gpu":
        return True  # a full GPU shares hardware with everything on it
    if isinstance(target, DynamicMigTarget) and other.mig is not None and other.mig.created:
        start, size = other.mig.placement_start, other.mig.placement_size
        return target.placement.start < start + size and start < target.placement.start + \
            target.placement.size
    return False


def _unwritable(exc: OSError) -> str:
    """A failed write of the node's own files, as a claim's error (the file is named)."""
    return f"the node's state could not be written ({exc}); the kubelet's retry will finish it"
