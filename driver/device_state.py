"""Preparing and unpreparing claims on the hardware: the side effects, made crash-safe.

Every claim goes through two checkpoint phases. ``PrepareStarted`` is saved before any
hardware is touched and names what is about to be created (a MIG device is recorded by
parent, profile and placement before it exists, and by its ids as soon as it does);
``PrepareCompleted`` is saved after the CDI spec is written. A crash anywhere in between
leaves a started record that :meth:`DeviceState.reconcile` (at start) or the next prepare
of the same claim rolls back. All work happens under the checkpoint's file lock, so two
daemon instances sharing the data directory (a rolling update) never interleave.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gpudra.api.configs import TIME_SLICE_VALUES, GpuConfig, MigDeviceConfig, MpsConfig
from gpudra.driver import cdi, metrics
from gpudra.driver.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    MigRecord,
    PreparedDevice,
    with_claim_completed,
    with_claim_started,
    with_mig_mode_baseline,
    without_claim,
)
from gpudra.driver.claims import ClaimError, ClaimToPrepare, PreparedResult
from gpudra.driver.commands import CommandError, CommandRunner, set_time_slice
from gpudra.driver.faults import crash_point, delay_point
from gpudra.driver.gpu_locks import GpuLocks, GpuLockTimeout
from gpudra.driver.mps import MpsManager
from gpudra.driver.nvml import (
    COMPUTE_MODE_DEFAULT,
    COMPUTE_MODE_EXCLUSIVE_PROCESS,
    COMPUTE_MODE_PROHIBITED,
    MigInstance,
    Nvml,
    NvmlError,
)
from gpudra.driver.prepare_plan import (
    DeviceStep,
    DynamicMigTarget,
    GpuTarget,
    NodeIndex,
    PreparePlan,
    StaticMigTarget,
    plan_claim,
)

log = structlog.get_logger(__name__)

COMPUTE_MODES = {
    "Default": COMPUTE_MODE_DEFAULT,
    "ExclusiveProcess": COMPUTE_MODE_EXCLUSIVE_PROCESS,
    "Prohibited": COMPUTE_MODE_PROHIBITED,
}



@dataclass
class ReconcileReport:
    """What start-up reconciliation found and fixed."""

    rolled_back_claims: list[str] = field(default_factory=list)
    destroyed_mig_devices: list[str] = field(default_factory=list)
    removed_cdi_specs: list[str] = field(default_factory=list)
    checkpoint_reset: str | None = None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _nvml_message(claim: ClaimToPrepare, step: DeviceStep, exc: NvmlError) -> str:
    device = step.allocated.device
    if exc.is_insufficient_resources and isinstance(step.target, DynamicMigTarget):
        t = step.target
        return (f"claim {claim.ref}: cannot create {t.profile.name} at placement "
                f"{t.placement.start}:{t.placement.size} on GPU {t.parent_uuid} for device "
                f"{device!r}: the placement is taken by a MIG device the scheduler does not "
                "know about (NVML: insufficient resources)")
    return f"claim {claim.ref}: device {device!r}: {exc}"


class DeviceState:
    """The node's prepared claims and the hardware state behind them."""

    def __init__(
        self,
        *,
        driver: str,
        nvml: Nvml,
        index: NodeIndex,
        store: CheckpointStore,
        cdi_root: Path,
        driver_root: cdi.DriverRoot,
        commands: CommandRunner | None = None,
        mps: MpsManager | None = None,
        lock_timeout: float = 30.0,
    ) -> None:
        self.driver = driver
        self.nvml = nvml
        self.index = index
        self.store = store
        self.cdi_root = cdi_root
        self.driver_root = driver_root
        self.commands = commands
        self.mps = mps
        self._lock_timeout = lock_timeout
        self.gpu_locks = GpuLocks(store.directory / "gpu-locks")

    # --- queries ---------------------------------------------------------------------------

    def prepared(self, uid: str) -> list[PreparedResult] | None:
        """The kubelet answer for a claim already prepared, or ``None``."""
        return self.prepared_many([uid]).get(uid)

    def prepared_many(self, uids: Iterable[str]) -> dict[str, list[PreparedResult]]:
        """Answers for those of ``uids`` already prepared (one checkpoint read)."""
        claims = self.store.load().claims
        found = {}
        for uid in uids:
            record = claims.get(uid)
            if record is not None and record.state == PREPARE_COMPLETED:
                found[uid] = [self._result(d) for d in record.devices]
        return found

    @staticmethod
    def _result(device: PreparedDevice) -> PreparedResult:
        return PreparedResult(
            request_names=tuple(device.request_names),
            pool=device.pool,
            device=device.device,
            cdi_device_ids=tuple(device.cdi_device_ids),
            share_id=device.share_id,
        )

    # --- prepare ---------------------------------------------------------------------------

    def prepare(self, claim: ClaimToPrepare) -> list[PreparedResult]:
        """Prepare one claim; idempotent. Raises :class:`ClaimError` and then changes nothing."""
        result = self.prepare_many([claim])[claim.uid]
        if isinstance(result, ClaimError):
            raise result
        return result

    def prepare_many(
        self, claims: Sequence[ClaimToPrepare]
    ) -> dict[str, list[PreparedResult] | ClaimError]:
        """Prepare a kubelet call's claims under one lock, each on its own (one failing
        changes nothing for it and does not stop the others).

        Claims that change nothing on a GPU are checkpointed together at the end: one
        durable write per call instead of one per claim. Until then their only side effect
        is their CDI spec, which reconcile removes if the process dies first.
        """
        out: dict[str, list[PreparedResult] | ClaimError] = {}
        try:
            # Different GPUs proceed in parallel (other kubelet calls, the other daemon
            # instance); anything on the same GPU waits here.
            with self.gpu_locks.hold(self._parents_of(claims), self._lock_timeout):
                self._prepare_held(claims, out)
        except GpuLockTimeout as exc:
            for claim in claims:
                out.setdefault(claim.uid, ClaimError(f"claim {claim.ref}: {exc}; will retry"))
        return out

    def _prepare_held(
        self, claims: Sequence[ClaimToPrepare],
        out: dict[str, list[PreparedResult] | ClaimError],
    ) -> None:
        with self.store.locked(self._lock_timeout):
            cp = self.store.load()
        deferred: list[str] = []
        try:
            for claim in claims:
                try:
                    out[claim.uid], cp, later = self._prepare_locked(claim, cp)
                except ClaimError as exc:
                    out[claim.uid] = exc
                    continue
                except (NvmlError, CommandError, cdi.CdiError, OSError) as exc:
                    # One claim's failure is that claim's error; it must not lose the
                    # results (and deferred checkpoint state) of the others.
                    out[claim.uid] = ClaimError(f"claim {claim.ref}: {exc}")
                    continue
                if later:
                    deferred.append(claim.uid)
        finally:
            if deferred:
                self._persist_many(cp, deferred)
        metrics.PREPARED_CLAIMS.set(len(cp.completed()))

    def _parents_of(self, claims: Iterable[ClaimToPrepare]) -> set[str]:
        """The physical GPUs a set of claims touches (unknown devices fail later, in plan)."""
        parents = set()
        for claim in claims:
            for device in claim.devices:
                target = self.index.targets.get(device.device)
                if target is not None:
                    parents.add(target.uuid if isinstance(target, GpuTarget)
                                else target.parent_uuid)
        return parents

    def _persist(self, cp: Checkpoint, uid: str, record: ClaimRecord | None) -> None:
        """Write one claim's record (or its removal) into the checkpoint on disk.

        Merged into a fresh read, never a blind overwrite with ``cp``: calls on other GPUs
        update their own claims concurrently. ``cp`` is authoritative for this claim and
        for the MIG-mode baselines of the GPUs this call holds.
        """
        with self.store.locked(self._lock_timeout):
            fresh = self.store.load()
            for gpu, enabled in cp.mig_mode_baseline.items():
                fresh = with_mig_mode_baseline(fresh, gpu, enabled)
            if record is None:
                fresh = without_claim(fresh, uid)
            else:
                fresh = dataclasses.replace(fresh, claims={**fresh.claims, uid: record})
            self.store.save(fresh)

    def _persist_many(self, cp: Checkpoint, uids: Sequence[str]) -> None:
        with self.store.locked(self._lock_timeout):
            fresh = self.store.load()
            claims = dict(fresh.claims)
            claims.update({uid: cp.claims[uid] for uid in uids})
            self.store.save(dataclasses.replace(fresh, claims=claims))

    def _prepare_locked(
        self, claim: ClaimToPrepare, cp: Checkpoint
    ) -> tuple[list[PreparedResult], Checkpoint, bool]:
        existing = cp.claims.get(claim.uid)
        if existing is not None and existing.state == PREPARE_COMPLETED:
            return [self._result(d) for d in existing.devices], cp, False
        if existing is not None:
            log.warning("rolling back an interrupted prepare", claim=claim.ref)
            self._undo(existing, cp)
            cp = without_claim(cp, claim.uid)
            self._persist(cp, claim.uid, None)
        plan = plan_claim(claim, self.index)
        self._check_conflicts(plan, cp)
        return self._execute(plan, cp)

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
            key = (step.allocated.pool, step.allocated.device)
            if key in held:
                other = owners[key]
                raise ClaimError(f"claim {claim.ref}: device {step.allocated.device!r} is already "
                                 f"prepared for claim {other.namespace}/{other.name}:{other.uid}")
            for holder, held_device in self._physical_holders(cp, claim.uid):
                if _physically_overlap(step, held_device):
                    raise ClaimError(
                        f"claim {claim.ref}: device {step.allocated.device!r} overlaps device "
                        f"{held_device.device!r} of claim {holder.namespace}/{holder.name}:"
                        f"{holder.uid} on GPU {step.parent_uuid}")

    @staticmethod
    def _physical_holders(
        cp: Checkpoint, exclude_uid: str
    ) -> Iterable[tuple[ClaimRecord, PreparedDevice]]:
        for record in cp.claims.values():
            if record.uid == exclude_uid:
                continue
            for device in record.devices:
                if not device.admin_access:
                    yield record, device

    def _execute(
        self, plan: PreparePlan, cp: Checkpoint
    ) -> tuple[list[PreparedResult], Checkpoint, bool]:
        """Do it; returns the results, the new checkpoint and whether saving it is left to
        the caller (claims that touch no hardware)."""
        claim = plan.claim
        self._preflight(plan)
        restore: dict[str, Any] = {}
        for step in plan.steps:
            if isinstance(step.target, DynamicMigTarget):
                parent = step.target.parent_uuid
                if parent in restore.get("preexistingMig", {}):
                    continue  # a second partition of the same GPU: already looked at
                mode = self.nvml.mig_mode(parent)
                cp = with_mig_mode_baseline(cp, parent, bool(mode and mode.current))
                # What already exists is never ours: crash recovery must not destroy it.
                restore.setdefault("preexistingMig", {})[parent] = sorted(
                    i.gpu_instance_id for i in self._safe_instances(parent))
        record = ClaimRecord(
            uid=claim.uid, namespace=claim.namespace, name=claim.name, state=PREPARE_STARTED,
            devices=[self._planned_device(step) for step in plan.steps],
            restore=restore, started_at=_now(),
        )
        cp = with_claim_started(cp, record)
        hardware = _touches_hardware(plan)
        if hardware:
            self._persist(cp, claim.uid, record)
        # else: the only side effect is the CDI spec, and a crash before PrepareCompleted
        # leaves a spec no completed claim owns, which reconcile removes; skipping this
        # durable write saves two fsyncs on the common full-GPU path.
        crash_point("prepare:after-started")
        if hardware:
            delay_point("prepare:hardware")  # slow GPUs, in concurrency tests
        progress = [record]
        try:
            record = self._apply(plan, progress, cp)
            cp = dataclasses.replace(cp, claims={**cp.claims, claim.uid: record})
            specs = [self._cdi_device(claim.uid, step, device)
                     for step, device in zip(plan.steps, record.devices, strict=True)]
            spec = cdi.build_claim_spec(driver=self.driver, claim_uid=claim.uid, devices=specs,
                                        common=self.driver_root.common_edits())
            cdi.write_spec(self.cdi_root, spec, claim_uid=claim.uid)
            crash_point("prepare:after-cdi-write")
        except (NvmlError, cdi.CdiError, ClaimError, CommandError, OSError) as exc:
            # Undo what was really done: the latest record, not the plan we started from.
            self._undo(progress[-1], cp)
            if hardware:
                self._persist(cp, claim.uid, None)
            if isinstance(exc, ClaimError):
                raise
            raise ClaimError(f"claim {claim.ref}: {exc}") from exc
        qualified = [
            dataclasses.replace(d, cdi_device_ids=[cdi.qualified_name(self.driver, claim.uid,
                                                                      d.device)])
            for d in record.devices
        ]
        cp = with_claim_completed(cp, claim.uid, qualified)
        if hardware:
            self._persist(cp, claim.uid, cp.claims[claim.uid])
        return [self._result(d) for d in qualified], cp, not hardware

    def _planned_device(self, step: DeviceStep) -> PreparedDevice:
        target = step.target
        mig: MigRecord | None = None
        uuid: str | None = None
        parent: str | None = None
        if isinstance(target, GpuTarget):
            uuid = target.uuid
        elif isinstance(target, StaticMigTarget):
            uuid, parent = target.uuid, target.parent_uuid
            mig = MigRecord(parent_uuid=target.parent_uuid,
                            gpu_instance_id=target.gpu_instance_id,
                            compute_instance_id=target.compute_instance_id,
                            profile_id=-1, placement_start=-1, placement_size=-1,
                            mig_uuid=target.uuid, created=False)
        else:
            parent = target.parent_uuid
            # Intent only: ids of -1 until the instance exists. Recovery finds it by placement.
            mig = MigRecord(parent_uuid=target.parent_uuid, gpu_instance_id=-1,
                            compute_instance_id=-1, profile_id=target.profile.profile_id,
                            placement_start=target.placement.start,
                            placement_size=target.placement.size, mig_uuid=None, created=True)
        return PreparedDevice(
            request_names=[step.allocated.base_request], pool=step.allocated.pool,
            device=step.allocated.device, cdi_device_ids=[], share_id=step.allocated.share_id,
            kind="gpu" if isinstance(target, GpuTarget) else "mig", uuid=uuid,
            parent_uuid=parent, mig=mig, admin_access=step.allocated.admin_access,
        )

    def _apply(
        self, plan: PreparePlan, progress: list[ClaimRecord], cp: Checkpoint
    ) -> ClaimRecord:
        """Create MIG devices and apply settings, checkpointing each irreversible step.

        ``progress[-1]`` always holds what has really been done, so a caller that catches
        an exception undoes exactly that.
        """
        record = progress[-1]
        devices = list(record.devices)
        restore: dict[str, Any] = dict(record.restore)
        # MIG intents stay `created` with ids -1 until the device exists: undo (now or after
        # a crash) then looks them up by placement, skipping devices that predate the claim
        # (restore["preexistingMig"]), so a placement held by someone else is never touched.
        for i, step in enumerate(plan.steps):
            if isinstance(step.target, DynamicMigTarget):
                try:
                    instance = self._create_mig(plan.claim, step.target)
                except NvmlError as exc:  # named here, where we know which device failed
                    raise ClaimError(_nvml_message(plan.claim, step, exc)) from exc
                crash_point("prepare:after-mig-create")
                intent = devices[i].mig
                assert intent is not None
                created = dataclasses.replace(
                    intent, gpu_instance_id=instance.gpu_instance_id,
                    compute_instance_id=instance.compute_instance_id, mig_uuid=instance.uuid)
                devices[i] = dataclasses.replace(devices[i], uuid=instance.uuid, mig=created)
                record = dataclasses.replace(record, devices=list(devices))
                progress.append(record)
                self._persist(cp, record.uid, record)
                crash_point("prepare:after-mig-recorded")
        mps_uuids: list[str] = []
        mps_config: MpsConfig | None = None
        for i, step in enumerate(plan.steps):
            if step.allocated.admin_access or step.config is None:
                continue  # nothing asked: touch nothing (no implicit time-slicing)
            try:
                restore = self._apply_settings(plan.claim, step, devices[i], restore)
            except NvmlError as exc:
                raise ClaimError(_nvml_message(plan.claim, step, exc)) from exc
            finally:  # settings applied before a failure must be restored too
                record = dataclasses.replace(record, devices=list(devices),
                                             restore=dict(restore))
                progress.append(record)
            self._persist(cp, record.uid, record)
            sharing = step.config.sharing
            if sharing is not None and sharing.strategy == "MPS":
                mps_uuids.append(str(devices[i].uuid))
                mps_config = sharing.mps_config or mps_config
        if mps_uuids:
            assert self.mps is not None  # checked in _preflight
            # Record before starting, so a crash mid-start is rolled back (daemon stopped).
            restore["mps"] = {"claim": plan.claim.uid, "uuids": mps_uuids}
            record = dataclasses.replace(record, devices=list(devices), restore=dict(restore))
            progress.append(record)
            self._persist(cp, record.uid, record)
            self.mps.start(plan.claim.uid, mps_uuids, mps_config)
        crash_point("prepare:after-settings")
        return dataclasses.replace(record, devices=devices, restore=restore)

    def _preflight(self, plan: PreparePlan) -> None:
        """Everything about a claim that can be refused without touching anything."""
        claim = plan.claim
        mps_configs = []
        for step in plan.steps:
            config = step.config
            if config is None or step.allocated.admin_access or config.sharing is None:
                continue
            if config.sharing.strategy == "MPS":
                if self.mps is None:
                    raise ClaimError(f"claim {claim.ref}: device {step.allocated.device!r} asks "
                                     "for MPS, which is not enabled on this node (feature gate "
                                     "MPSSupport)")
                mps_configs.append(config.sharing.mps_config)
            elif isinstance(config, GpuConfig) and self.commands is None:
                raise ClaimError(f"claim {claim.ref}: device {step.allocated.device!r} asks for "
                                 "time-slicing, which is not enabled on this node (feature gate "
                                 "TimeSlicingSettings)")
        if len({repr(c) for c in mps_configs}) > 1:
            raise ClaimError(f"claim {claim.ref}: all MPS devices of one claim share one MPS "
                             "daemon and must have the same mpsConfig")

    def _create_mig(self, claim: ClaimToPrepare, target: DynamicMigTarget) -> MigInstance:
        mode = self.nvml.mig_mode(target.parent_uuid)
        if mode is None:
            raise ClaimError(f"claim {claim.ref}: GPU {target.parent_uuid} cannot do MIG")
        if not mode.current:
            if not target.reset_less_toggle and self.nvml.running_processes(target.parent_uuid):
                raise ClaimError(
                    f"claim {claim.ref}: MIG mode is off on GPU {target.parent_uuid} and processes "
                    "are running on it; Ampere GPUs can only switch MIG mode when idle")
            self.nvml.set_mig_mode(target.parent_uuid, True)
            log.info("enabled MIG mode", gpu=target.parent_uuid, claim=claim.ref)
        started = time.perf_counter()
        try:
            instance = self.nvml.create_mig_device(target.parent_uuid, target.profile,
                                                   target.placement)
        except NvmlError:
            metrics.MIG_OPERATIONS.labels("create", "error").inc()
            raise
        metrics.MIG_OPERATIONS.labels("create", "ok").inc()
        metrics.MIG_OPERATION_SECONDS.labels("create").observe(time.perf_counter() - started)
        log.info("created MIG device", claim=claim.ref, gpu=target.parent_uuid,
                 profile=target.profile.name, placement=target.placement.start, uuid=instance.uuid)
        return instance

    def _apply_settings(
        self, claim: ClaimToPrepare, step: DeviceStep, device: PreparedDevice,
        restore: dict[str, Any],
    ) -> dict[str, Any]:
        """Compute mode and time slice for one device; remembers what to put back."""
        config = step.config
        assert isinstance(config, GpuConfig | MigDeviceConfig)
        uuid = device.uuid
        assert uuid is not None
        sharing = config.sharing
        mode_name = config.compute_mode
        if sharing is not None and sharing.strategy == "MPS":
            mode_name = "ExclusiveProcess"  # MPS clients share one context per GPU
        elif sharing is not None and sharing.strategy == "TimeSlicing":
            mode_name = mode_name or "Default"
        if mode_name is not None:
            previous = self.nvml.compute_mode(uuid)
            restore.setdefault("computeMode", {}).setdefault(uuid, previous)
            self.nvml.set_compute_mode(uuid, COMPUTE_MODES[mode_name])
        if isinstance(config, GpuConfig) and config.sharing is not None \
                and config.sharing.strategy == "TimeSlicing":
            interval = "Default"
            if config.sharing.time_slicing_config is not None:
                interval = config.sharing.time_slicing_config.interval
            assert self.commands is not None  # refused in _preflight otherwise
            restore.setdefault("timeSlice", {}).setdefault(uuid, TIME_SLICE_VALUES["Default"])
            try:
                set_time_slice(self.commands, uuid, TIME_SLICE_VALUES[interval])
            except CommandError as exc:
                raise ClaimError(f"claim {claim.ref}: device {step.allocated.device!r}: setting "
                                 f"time slice {interval} failed: {exc}") from exc
        return restore

    def _cdi_device(self, uid: str, step: DeviceStep, device: PreparedDevice) -> cdi.CdiDevice:
        target = step.target
        if isinstance(target, GpuTarget):
            edits = self.driver_root.gpu_edits(target.minor)
        elif isinstance(target, StaticMigTarget):
            edits = self.driver_root.mig_edits(target.parent_minor, target.gpu_instance_id,
                                               target.compute_instance_id)
        else:
            assert device.mig is not None
            edits = self.driver_root.mig_edits(target.parent_minor, device.mig.gpu_instance_id,
                                               device.mig.compute_instance_id)
        sharing = step.config.sharing if step.config is not None else None
        if sharing is not None and sharing.strategy == "MPS" and self.mps is not None:
            edits = edits.merge(self.mps.daemon_for(uid).container_edits())
        return cdi.CdiDevice(name=device.device, edits=edits)

    # --- unprepare -------------------------------------------------------------------------

    def unprepare(self, uid: str) -> None:
        """Undo a claim from the checkpoint alone; unknown claims are fine (idempotent)."""
        record = self.store.load().claims.get(uid)
        if record is None:
            cdi.remove_spec(self.cdi_root, self.driver, uid)
            return
        parents = {str(d.parent_uuid or d.uuid) for d in record.devices
                   if d.parent_uuid or d.uuid}
        ref = f"{record.namespace}/{record.name}:{uid}"
        try:
            with self.gpu_locks.hold(parents, self._lock_timeout):
                with self.store.locked(self._lock_timeout):
                    cp = self.store.load()
                current = cp.claims.get(uid)
                if current is None:  # the other daemon instance finished it meanwhile
                    cdi.remove_spec(self.cdi_root, self.driver, uid)
                    return
                self._undo(current, cp)
                cp = without_claim(cp, uid)
                self._persist(cp, uid, None)
        except GpuLockTimeout as exc:
            raise ClaimError(f"claim {ref}: {exc}; will retry") from exc
        except (NvmlError, CommandError, OSError) as exc:
            raise ClaimError(f"claim {ref}: unprepare failed, will retry: {exc}") from exc
        metrics.PREPARED_CLAIMS.set(len(cp.completed()))

    def _undo(self, record: ClaimRecord, cp: Checkpoint) -> None:
        """Restore settings, destroy MIG devices we created, remove the CDI spec."""
        for uuid, mode in (record.restore.get("computeMode") or {}).items():
            try:
                self.nvml.set_compute_mode(uuid, int(mode))
            except NvmlError as exc:
                if not exc.is_not_found:  # the MIG device may already be gone
                    raise
        if record.restore.get("mps") and self.mps is not None:
            self.mps.stop(record.uid)
        for uuid, value in (record.restore.get("timeSlice") or {}).items():
            if self.commands is not None:
                set_time_slice(self.commands, uuid, int(value))
        crash_point("unprepare:after-settings-restored")
        owned = self._owned_elsewhere(cp, record.uid)
        parents: set[str] = set()
        preexisting = {parent: set(ids) for parent, ids in
                       (record.restore.get("preexistingMig") or {}).items()}
        for device in record.devices:
            mig = device.mig
            if mig is None or mig.profile_id < 0:
                continue  # static MIG: never ours to destroy
            parents.add(mig.parent_uuid)  # MIG mode may have been turned on for it
            if mig.created:
                self._destroy(mig, owned, preexisting.get(mig.parent_uuid, set()))
        crash_point("unprepare:after-mig-destroy")
        for parent in parents:
            self._restore_mig_mode(parent, cp)
        cdi.remove_spec(self.cdi_root, self.driver, record.uid)
        crash_point("unprepare:after-cdi-remove")

    @staticmethod
    def _owned_elsewhere(cp: Checkpoint, uid: str) -> set[tuple[str, int, int]]:
        """(parent, profile, start) of MIG devices that other claims hold."""
        owned = set()
        for record in cp.claims.values():
            if record.uid == uid:
                continue
            for device in record.devices:
                if device.mig is not None and device.mig.created:
                    m = device.mig
                    owned.add((m.parent_uuid, m.profile_id, m.placement_start))
        return owned

    def _destroy(
        self, mig: MigRecord, owned: set[tuple[str, int, int]], preexisting: set[int]
    ) -> None:
        if (mig.parent_uuid, mig.profile_id, mig.placement_start) in owned:
            return  # another claim's; never ours to destroy
        gi, ci = mig.gpu_instance_id, mig.compute_instance_id
        if gi < 0:
            # Crashed between create and record: find it by what the name encodes, but
            # never a device that existed before this claim started.
            live = self._find_live(mig.parent_uuid, mig.profile_id, mig.placement_start)
            if live is None or live.gpu_instance_id in preexisting:
                return
            gi, ci = live.gpu_instance_id, live.compute_instance_id
        started = time.perf_counter()
        if self.nvml.destroy_mig_device(mig.parent_uuid, gi, ci):
            metrics.MIG_OPERATIONS.labels("destroy", "ok").inc()
            metrics.MIG_OPERATION_SECONDS.labels("destroy").observe(time.perf_counter() - started)
            log.info("destroyed MIG device", gpu=mig.parent_uuid, gpu_instance=gi,
                     compute_instance=ci)

    def _find_live(self, parent: str, profile_id: int, start: int) -> MigInstance | None:
        for instance in self.nvml.mig_instances(parent):
            if instance.profile_id == profile_id and instance.placement.start == start:
                return instance
        return None

    def _restore_mig_mode(self, parent: str, cp: Checkpoint) -> None:
        """Turn MIG off again when the last partition is gone and it was off before us."""
        if cp.mig_mode_baseline.get(parent, True):
            return
        if self.nvml.mig_instances(parent):
            return
        if self.nvml.running_processes(parent):
            return  # not idle: leave it; the next unprepare tries again
        try:
            self.nvml.set_mig_mode(parent, False)
        except NvmlError as exc:
            log.warning("could not disable MIG mode", gpu=parent, error=str(exc))
        else:
            log.info("disabled MIG mode", gpu=parent)

    # --- start-up reconciliation ---------------------------------------------------------

    def reconcile(self) -> ReconcileReport:
        """Converge after a crash: roll back half-prepared claims, destroy leaked MIG devices
        on GPUs this driver manages, remove CDI specs no prepared claim owns."""
        report = ReconcileReport()
        gpus = {t.uuid if isinstance(t, GpuTarget) else t.parent_uuid
                for t in self.index.targets.values()}
        # Every GPU, then the checkpoint: a running daemon instance may not be mid-prepare.
        with self.gpu_locks.hold(gpus, self._lock_timeout), \
                self.store.locked(self._lock_timeout):
            result = self.store.load_result()
            report.checkpoint_reset = result.reset_reason
            cp = result.checkpoint
            for record in list(cp.started().values()):
                self._undo(record, cp)
                cp = without_claim(cp, record.uid)
                report.rolled_back_claims.append(f"{record.namespace}/{record.name}:{record.uid}")
            self.store.save(cp)
            keep = {
                (d.mig.parent_uuid, d.mig.gpu_instance_id)
                for r in cp.completed().values() for d in r.devices
                if d.mig is not None and d.mig.created
            }
            for parent in cp.mig_mode_baseline:
                for instance in self._safe_instances(parent):
                    if (parent, instance.gpu_instance_id) in keep:
                        continue
                    self.nvml.destroy_mig_device(parent, instance.gpu_instance_id,
                                                 instance.compute_instance_id)
                    report.destroyed_mig_devices.append(instance.uuid)
                self._restore_mig_mode(parent, cp)
            for uid, path in cdi.list_claim_specs(self.cdi_root, self.driver).items():
                if uid not in cp.completed():
                    path.unlink(missing_ok=True)
                    report.removed_cdi_specs.append(path.name)
        return report

    def _safe_instances(self, parent: str) -> list[MigInstance]:
        try:
            return self.nvml.mig_instances(parent)
        except NvmlError as exc:
            log.warning("cannot list MIG devices", gpu=parent, error=str(exc))
            return []

    def owned_mig_uuids(self) -> set[str]:
        cp = self.store.load()
        return {d.mig.mig_uuid for r in cp.completed().values() for d in r.devices
                if d.mig is not None and d.mig.created and d.mig.mig_uuid}


def _touches_hardware(plan: PreparePlan) -> bool:
    """Whether preparing changes anything on a GPU (MIG devices, modes, daemons)."""
    return any(isinstance(s.target, DynamicMigTarget)
               or (s.config is not None and not s.allocated.admin_access) for s in plan.steps)


def _physically_overlap(step: DeviceStep, other: PreparedDevice) -> bool:
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

