"""What preparing a claim does to a GPU, and how it is undone from the checkpoint alone.

MIG devices created at the scheduler's placement, compute modes, time slices and MPS
daemons. Every change is written into the claim record's ``restore`` (or its devices)
before or as it happens, so :meth:`ClaimHardware.undo` can put the GPU back after an
error, at unprepare, or after a crash. Locks and checkpoint phases are the caller's
(:class:`gpudra.driver.device_state.DeviceState`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import structlog

from gpudra.api.configs import (
    TIME_SLICE_VALUES,
    ConfigError,
    GpuConfig,
    MigDeviceConfig,
    MpsConfig,
)
from gpudra.driver import metrics, shares
from gpudra.driver.cdi import ContainerEdits
from gpudra.driver.checkpoint_model import (
    Checkpoint,
    ClaimRecord,
    DeviceRecord,
    MigRecord,
    MpsRestore,
    Restore,
    with_mig_mode_baseline,
)
from gpudra.driver.claims import ClaimError, ClaimToPrepare
from gpudra.driver.commands import CommandError, CommandRunner, set_time_slice
from gpudra.driver.faults import crash_point
from gpudra.driver.mps import MpsClaim, MpsManager, commands_for
from gpudra.driver.nvml import (
    COMPUTE_MODE_DEFAULT,
    COMPUTE_MODE_EXCLUSIVE_PROCESS,
    COMPUTE_MODE_PROHIBITED,
    GpuInstance,
    MigInstance,
    Nvml,
    NvmlError,
)
from gpudra.driver.prepare_plan import (
    DeviceStep,
    DynamicMigTarget,
    GpuTarget,
    PreparePlan,
    ShareTarget,
    StaticMigTarget,
    VfioTarget,
)
from gpudra.driver.shares import ShareEntry
from gpudra.driver.vfio import VfioPassthrough, VfioRequest

log = structlog.get_logger(__name__)

COMPUTE_MODES = {
    "Default": COMPUTE_MODE_DEFAULT,
    "ExclusiveProcess": COMPUTE_MODE_EXCLUSIVE_PROCESS,
    "Prohibited": COMPUTE_MODE_PROHIBITED,
}


def touches_hardware(plan: PreparePlan, cp: Checkpoint) -> bool:
    """Whether preparing changes anything on a GPU (MIG devices, modes, daemons).

    A share joining a GPU that already has shares changes nothing there unless it raises
    the MPS daemon's limits: it only gets a CDI spec, like a full GPU, and takes the same
    batched commit. Should the daemon have died meanwhile, apply restarts it; the GPU's
    other prepared shares own it, so a crash cannot orphan it.
    """
    for i, step in enumerate(plan.steps):
        share = step.share
        if share is not None:
            before = [*shares.shares_on_gpu(cp, share.gpu, plan.claim.uid),
                      *(s.share for s in plan.steps[:i]
                        if s.share is not None and s.share.gpu == share.gpu)]
            if not before or shares.mps_commands(share.gpu, [*before, share]) != \
                    shares.mps_commands(share.gpu, before):
                return True
        elif isinstance(step.target, DynamicMigTarget | ShareTarget | VfioTarget) or (
                step.config is not None and not step.allocated.admin_access):
            return True
    return False


def planned_device(step: DeviceStep) -> DeviceRecord:
    """The record of a device about to be prepared: what it is, before anything exists."""
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
        # Admin access observes a device another claim made: never ours to destroy.
        mig = MigRecord(parent_uuid=target.parent_uuid, gpu_instance_id=-1,
                        compute_instance_id=-1, profile_id=target.profile.profile_id,
                        placement_start=target.placement.start,
                        placement_size=target.placement.size, mig_uuid=None,
                        created=not step.allocated.admin_access)
    return DeviceRecord(
        # As allocated (``req/sub`` included): the kubelet's wire layer strips subrequests.
        request_names=[step.allocated.request], pool=step.allocated.pool,
        device=step.allocated.device, cdi_device_ids=[], share_id=step.allocated.share_id,
        kind="gpu" if isinstance(target, GpuTarget) else "mig", uuid=uuid,
        parent_uuid=parent, mig=mig, admin_access=step.allocated.admin_access,
    )


def _nvml_message(claim: ClaimToPrepare, step: DeviceStep, exc: NvmlError) -> str:
    device = step.allocated.device
    if exc.is_insufficient_resources and isinstance(step.target, DynamicMigTarget):
        t = step.target
        return (f"claim {claim.ref}: cannot create {t.profile.name} at placement "
                f"{t.placement.start}:{t.placement.size} on GPU {t.parent_uuid} for device "
                f"{device!r}: the placement is taken by a MIG device the scheduler does not "
                "know about (NVML: insufficient resources)")
    return f"claim {claim.ref}: device {device!r}: {exc}"


class ClaimHardware:
    """Applies and undoes claims' hardware changes through NVML and the host commands.

    A feature left off is refused in :meth:`preflight`: ``commands=None`` (time-slicing,
    gate ``TimeSlicingSettings``), ``mps=None`` (gate ``MPSSupport``),
    ``compute_modes=False`` (an explicit ``computeMode``, gate ``ComputeModeSettings``).
    """

    def __init__(
        self,
        *,
        nvml: Nvml,
        commands: CommandRunner | None,
        mps: MpsManager | None,
        compute_modes: bool,
        vfio: VfioPassthrough | None = None,
    ) -> None:
        self.nvml = nvml
        self.commands = commands
        self.mps = mps
        self.compute_modes = compute_modes
        self.vfio = vfio
        """Passthrough (``gpudra.driver.vfio``); ``None``: the node has no sysfs for it."""

    # --- prepare ---------------------------------------------------------------------------

    def preflight(self, plan: PreparePlan) -> None:
        """Everything about a claim that can be refused without touching anything."""
        claim = plan.claim
        mps_configs = []
        for step in plan.steps:
            config = step.config
            if step.share is not None:
                self._preflight_share(claim, step.share)
                continue
            if step.allocated.admin_access and isinstance(step.target, DynamicMigTarget):
                self._observed_mig(claim, step)  # refused now if there is nothing to observe
            if config is None or step.allocated.admin_access:
                continue
            device = step.allocated.device
            if config.compute_mode is not None and not self.compute_modes:
                raise ClaimError(f"claim {claim.ref}: device {device!r}: its config sets "
                                 f"computeMode {config.compute_mode}, which is not enabled on "
                                 "this node (feature gate ComputeModeSettings)")
            if config.sharing is None:
                continue
            if config.sharing.strategy == "MPS":
                if self.mps is None:
                    raise ClaimError(f"claim {claim.ref}: device {device!r} asks for MPS, which "
                                     "is not enabled on this node (feature gate MPSSupport)")
                mps_configs.append(config.sharing.mps_config)
            elif isinstance(config, GpuConfig) and self.commands is None:
                raise ClaimError(f"claim {claim.ref}: device {device!r} asks for "
                                 "time-slicing, which is not enabled on this node (feature gate "
                                 "TimeSlicingSettings)")
        if len({repr(c) for c in mps_configs}) > 1:
            raise ClaimError(f"claim {claim.ref}: all MPS devices of one claim share one MPS "
                             "daemon and must have the same mpsConfig")

    def _preflight_share(self, claim: ClaimToPrepare, share: ShareEntry) -> None:
        where = f"claim {claim.ref}: device {share.device!r} (share {share.share_id})"
        if share.strategy == "MPS" and self.mps is None:
            raise ClaimError(f"{where}: a share runs under MPS, which is not enabled on this "
                             "node (feature gate MPSSupport)")
        if share.strategy == "TimeSlicing" and self.commands is None:
            raise ClaimError(f"{where} asks for time-slicing, which is not enabled on this "
                             "node (feature gate TimeSlicingSettings)")
        reason = self.nvml.why_unavailable(share.gpu)
        if reason is not None:
            raise ClaimError(f"{where}: GPU {share.gpu} is unavailable ({reason})")

    def record_mig_state(
        self, plan: PreparePlan, cp: Checkpoint
    ) -> tuple[Checkpoint, Restore]:
        """Before a claim starts: each partitioned GPU's MIG mode (the baseline to restore)
        and the MIG devices already on it (never ours: crash recovery must not destroy
        them), as the checkpoint and the claim's initial ``restore``."""
        preexisting: dict[str, list[int]] = {}
        for step in plan.steps:
            if isinstance(step.target, DynamicMigTarget):
                parent = step.target.parent_uuid
                if parent in preexisting:
                    continue  # a second partition of the same GPU: already looked at
                mode = self.nvml.mig_mode(parent)
                cp = with_mig_mode_baseline(cp, parent, bool(mode and mode.current))
                preexisting[parent] = sorted(
                    i.gpu_instance_id for i in self.safe_gpu_instances(parent))
        joining = self._share_entries(plan, cp)
        return cp, Restore(preexisting_mig=preexisting,
                           shares={e.share_id: e.to_json() for e in joining})

    def _share_entries(self, plan: PreparePlan, cp: Checkpoint) -> list[ShareEntry]:
        """The claim's shares with their GPU's baseline: read before the first share of a
        GPU changes it, copied from the shares already there otherwise. Part of the claim's
        first record, so undo (now or after a crash) knows every share that was joining."""
        entries: list[ShareEntry] = []
        for step in plan.steps:
            share = step.share
            if share is None:
                continue
            if share.strategy == "MPS":
                there = [*shares.shares_on_gpu(cp, share.gpu, plan.claim.uid),
                         *(e for e in entries if e.gpu == share.gpu)]
                baseline = (there[0].baseline_compute_mode if there
                            else self.nvml.compute_mode(share.gpu))
                share = replace(share, baseline_compute_mode=baseline)
            entries.append(share)
        return entries

    def apply(
        self, plan: PreparePlan, progress: list[ClaimRecord],
        persist: Callable[[ClaimRecord], None], cp: Checkpoint | None = None,
    ) -> ClaimRecord:
        """Create MIG devices and apply settings, persisting each irreversible step.

        ``progress[-1]`` always holds what has really been done, so a caller that catches
        an exception undoes exactly that.
        """
        record = progress[-1]
        record = self._pass_through(plan, progress, persist, cp)
        devices = list(record.devices)
        restore = record.restore
        # MIG intents stay `created` with ids -1 until the device exists: undo (now or after
        # a crash) then looks them up by placement, skipping devices that predate the claim
        # (restore.preexisting_mig), so a placement held by someone else is never touched.
        for i, step in enumerate(plan.steps):
            if isinstance(step.target, DynamicMigTarget) and step.allocated.admin_access:
                observed = self._observed_mig(plan.claim, step)
                intent = devices[i].mig
                assert intent is not None
                devices[i] = devices[i].model_copy(update={"uuid": observed.uuid, "mig": (
                    intent.model_copy(update={
                        "gpu_instance_id": observed.gpu_instance_id,
                        "compute_instance_id": observed.compute_instance_id,
                        "mig_uuid": observed.uuid}))})
                record = record.model_copy(update={"devices": list(devices)})
                progress.append(record)
            elif isinstance(step.target, DynamicMigTarget):
                try:
                    instance = self._create_mig(plan.claim, step.target)
                except NvmlError as exc:  # named here, where we know which device failed
                    raise ClaimError(_nvml_message(plan.claim, step, exc)) from exc
                crash_point("prepare:after-mig-create")
                intent = devices[i].mig
                assert intent is not None
                created = intent.model_copy(update={
                    "gpu_instance_id": instance.gpu_instance_id,
                    "compute_instance_id": instance.compute_instance_id,
                    "mig_uuid": instance.uuid})
                devices[i] = devices[i].model_copy(update={"uuid": instance.uuid, "mig": created})
                record = record.model_copy(update={"devices": list(devices)})
                progress.append(record)
                persist(record)
                crash_point("prepare:after-mig-recorded")
        mps_uuids: list[str] = []
        mps_config: MpsConfig | None = None
        for i, step in enumerate(plan.steps):
            if step.allocated.admin_access or step.config is None or step.share is not None:
                continue  # nothing asked: touch nothing (no implicit time-slicing)
            try:
                # What to put back is recorded before anything is set: settings applied
                # before a failure must be restored too.
                restore = self._remember_settings(step, devices[i], restore)
                self._apply_settings(plan.claim, step, devices[i])
            except NvmlError as exc:
                raise ClaimError(_nvml_message(plan.claim, step, exc)) from exc
            finally:
                record = record.model_copy(update={"devices": list(devices), "restore": restore})
                progress.append(record)
            persist(record)
            sharing = step.config.sharing
            if sharing is not None and sharing.strategy == "MPS":
                mps_uuids.append(str(devices[i].uuid))
                mps_config = sharing.mps_config or mps_config
        if mps_uuids:
            assert self.mps is not None  # refused in preflight otherwise
            try:
                mps_commands = commands_for(mps_config, mps_uuids)
            except ConfigError as exc:  # a per-device limit keyed by an index out of range
                raise ClaimError(f"claim {plan.claim.ref}: {exc}") from exc
            # Record before starting, so a crash mid-start is rolled back (daemon stopped);
            # the commands too, so start-up can restart a daemon that died with its config.
            restore = restore.with_mps(MpsRestore(claim=plan.claim.uid, uuids=mps_uuids,
                                                  commands=list(mps_commands)))
            record = record.model_copy(update={"devices": list(devices), "restore": restore})
            progress.append(record)
            persist(record)
            self.mps.start(plan.claim.uid, mps_uuids, mps_commands)
        joined: list[ShareEntry] = []
        for share in shares.entries_of(record):
            self._apply_share(plan.claim, share, joined,
                              shares.shares_on_gpu(cp, share.gpu, plan.claim.uid) if cp else [])
            joined.append(share)
        crash_point("prepare:after-settings")
        if devices == record.devices and restore == record.restore:
            return record  # nothing done (a plain full GPU): the same record, not a copy
        return record.model_copy(update={"devices": devices, "restore": restore})

    def _pass_through(
        self, plan: PreparePlan, progress: list[ClaimRecord],
        persist: Callable[[ClaimRecord], None], cp: Checkpoint | None,
    ) -> ClaimRecord:
        """Bind the claim's vfio GPUs to ``vfio-pci``, each recorded (functions and their
        drivers) and persisted before its first driver change; refuse GPUs another claim
        passed through with its IOMMU group."""
        record = progress[-1]
        vfio = self.vfio
        if vfio is None:
            if any(isinstance(s.target, VfioTarget) for s in plan.steps):
                raise ClaimError(f"claim {plan.claim.ref}: VFIO passthrough is not available "
                                 "on this node (no PCI sysfs)")
            return record
        vfio.check_free(plan.claim, {s.parent_uuid for s in plan.steps
                                     if not s.allocated.admin_access}, cp)
        for i, step in enumerate(plan.steps):
            target = step.target
            if not isinstance(target, VfioTarget):
                continue
            if step.allocated.admin_access:
                raise ClaimError(f"claim {plan.claim.ref}: device {step.allocated.device!r}: "
                                 "adminAccess cannot observe a GPU passed through to a VM")
            planned = vfio.plan(plan.claim, VfioRequest(step.allocated.device, target.uuid,
                                                        target.bus_id),
                                cp, step.config is not None)
            devices = list(record.devices)
            devices[i] = devices[i].model_copy(update={"vfio": planned})
            record = record.model_copy(update={"devices": devices})
            progress.append(record)
            persist(record)
            vfio.bind(plan.claim, planned)
        return record

    def _apply_share(
        self, claim: ClaimToPrepare, share: ShareEntry, joined: list[ShareEntry],
        others: list[ShareEntry],
    ) -> None:
        """Join the shared GPU: the first share sets it up, later ones raise the daemon's
        limits when theirs are larger (recorded already: see :meth:`_share_entries`)."""
        before = [*others, *(e for e in joined if e.gpu == share.gpu)]
        first = not before
        where = f"claim {claim.ref}: device {share.device!r} (share {share.share_id})"
        try:
            if share.strategy == "TimeSlicing":
                if first:
                    assert self.commands is not None  # refused in preflight otherwise
                    set_time_slice(self.commands, share.gpu, share.time_slice)
                return
            assert self.mps is not None  # refused in preflight otherwise
            key = shares.daemon_key(share.gpu)
            commands = shares.mps_commands(share.gpu, [*before, share])
            if first:
                self.nvml.set_compute_mode(share.gpu, COMPUTE_MODE_EXCLUSIVE_PROCESS)
            if self.mps.running_pid(key) is None:
                self.mps.start(key, [share.gpu], commands)
            elif commands != shares.mps_commands(share.gpu, before):
                self.mps.send(key, commands)
        except CommandError as exc:
            raise ClaimError(f"{where}: setting up the shared GPU failed: {exc}") from exc
        except NvmlError as exc:
            raise ClaimError(f"{where}: {exc}") from exc

    def container_edits(self, uid: str, step: DeviceStep) -> ContainerEdits | None:
        """What a device's container needs beyond the device itself (MPS pipe, limits)."""
        share = step.share
        if share is not None:
            if share.strategy != "MPS" or self.mps is None:
                return None
            daemon = self.mps.daemon_for(shares.daemon_key(share.gpu))
            return daemon.container_edits().merge(
                ContainerEdits(env=shares.client_env(share)))
        sharing = step.config.sharing if step.config is not None else None
        if sharing is not None and sharing.strategy == "MPS" and self.mps is not None:
            return self.mps.daemon_for(uid).container_edits()
        return None

    def _observed_mig(self, claim: ClaimToPrepare, step: DeviceStep) -> MigInstance:
        """The live MIG device an admin-access claim observes. Admin access never creates,
        destroys or reconfigures hardware: a device made on demand that no claim has made
        yet is this claim's error, and nothing is changed."""
        target = step.target
        assert isinstance(target, DynamicMigTarget)
        try:  # a MIG device: a GPU instance with its compute instance (a bare GI is none)
            live = next((i for i in self.nvml.mig_instances(target.parent_uuid)
                         if i.profile_id == target.profile.profile_id
                         and i.placement.start == target.placement.start), None)
        except NvmlError as exc:
            raise ClaimError(_nvml_message(claim, step, exc)) from exc
        if live is None:
            raise ClaimError(
                f"claim {claim.ref}: device {step.allocated.device!r} is requested with "
                "adminAccess, which observes a device and never creates one, and this MIG "
                f"device does not exist (no claim holds it on GPU {target.parent_uuid}); "
                "nothing was changed")
        return live

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

    def _remember_settings(self, step: DeviceStep, device: DeviceRecord,
                           restore: Restore) -> Restore:
        """``restore`` with what :meth:`_apply_settings` will change on ``device``."""
        uuid = device.uuid
        assert uuid is not None
        if _compute_mode_of(step) is not None:
            restore = restore.with_compute_mode(uuid, self.nvml.compute_mode(uuid))
        if _time_slice_of(step) is not None:
            restore = restore.with_time_slice(uuid, TIME_SLICE_VALUES["Default"])
        return restore

    def _apply_settings(self, claim: ClaimToPrepare, step: DeviceStep,
                        device: DeviceRecord) -> None:
        """Compute mode and time slice for one device."""
        uuid = device.uuid
        assert uuid is not None
        mode_name = _compute_mode_of(step)
        if mode_name is not None:
            self.nvml.set_compute_mode(uuid, COMPUTE_MODES[mode_name])
        interval = _time_slice_of(step)
        if interval is not None:
            assert self.commands is not None  # refused in preflight otherwise
            try:
                set_time_slice(self.commands, uuid, TIME_SLICE_VALUES[interval])
            except CommandError as exc:
                raise ClaimError(f"claim {claim.ref}: device {step.allocated.device!r}: setting "
                                 f"time slice {interval} failed: {exc}") from exc

    # --- undo ------------------------------------------------------------------------------

    def undo(self, record: ClaimRecord, cp: Checkpoint) -> dict[str, str]:
        """Restore settings and destroy the MIG devices we created (the CDI spec is the
        caller's).

        A GPU that is gone (removed, replaced, or lost) has nothing to put back: its steps
        are skipped and it is returned (UUID → why), so the caller can say so; everything
        else is undone as usual.
        """
        if self.vfio is not None:
            self.vfio.release(record)  # first: the GPU must be back for anything below
        gone = self._gone_gpus(record)
        parent_of = {str(d.uuid): str(d.parent_uuid or d.uuid) for d in record.devices if d.uuid}
        for uuid, mode in record.restore.compute_mode.items():
            if parent_of.get(uuid, uuid) in gone:
                continue
            try:
                self.nvml.set_compute_mode(uuid, int(mode))
            except NvmlError as exc:
                if not exc.is_not_found:  # the MIG device may already be gone
                    raise
        if record.restore.mps is not None and self.mps is not None:
            self.mps.stop(record.uid)
        self._undo_shares(record, cp, gone)
        for uuid, value in record.restore.time_slice.items():
            if self.commands is not None and uuid not in gone:
                set_time_slice(self.commands, uuid, int(value))
        crash_point("unprepare:after-settings-restored")
        owned = _owned_elsewhere(cp, record.uid)
        parents: set[str] = set()
        preexisting = {parent: set(ids) for parent, ids in
                       record.restore.preexisting_mig.items()}
        for device in record.devices:
            mig = device.mig
            if mig is None or mig.profile_id < 0 or mig.parent_uuid in gone \
                    or device.admin_access:
                # static MIG is never ours to destroy; a gone GPU has nothing; an admin
                # claim only observed (its MIG mode is the creator's to put back)
                continue
            parents.add(mig.parent_uuid)  # MIG mode may have been turned on for it
            if mig.created:
                self._destroy(mig, owned, preexisting.get(mig.parent_uuid, set()))
        crash_point("unprepare:after-mig-destroy")
        for parent in parents:
            self.restore_mig_mode(parent, cp)
        return gone

    def _undo_shares(self, record: ClaimRecord, cp: Checkpoint, gone: dict[str, str]) -> None:
        """Leave the shared GPUs: the last share stops the daemon and puts the GPU back;
        otherwise the daemon's defaults shrink to the remaining shares'."""
        by_gpu: dict[str, list[ShareEntry]] = {}
        for entry in shares.entries_of(record):
            by_gpu.setdefault(entry.gpu, []).append(entry)
        for gpu, leaving in by_gpu.items():
            remaining = shares.shares_on_gpu(cp, gpu, record.uid)
            strategy = leaving[0].strategy
            key = shares.daemon_key(gpu)
            if remaining:
                commands = shares.mps_commands(gpu, remaining)
                if strategy == "MPS" and self.mps is not None \
                        and commands != shares.mps_commands(gpu, [*remaining, *leaving]) \
                        and self.mps.running_pid(key) is not None:
                    self.mps.send(key, commands)  # the ceiling shrinks with the largest share
                continue
            if strategy == "MPS" and self.mps is not None:
                self.mps.stop(key)  # idempotent: a crash before the start leaves nothing
            if gpu in gone:
                continue
            baseline = leaving[0].baseline_compute_mode
            if strategy == "MPS" and baseline is not None:
                self.nvml.set_compute_mode(gpu, baseline)
            if strategy == "TimeSlicing" and self.commands is not None:
                set_time_slice(self.commands, gpu, TIME_SLICE_VALUES["Default"])
            log.info("last share left the GPU; put it back", claim=record.ref, gpu=gpu)

    def _gone_gpus(self, record: ClaimRecord) -> dict[str, str]:
        """The GPUs undoing ``record`` would touch that are not there or do not answer.

        Asked only for GPUs with something to undo, so a plain full-GPU claim costs nothing.
        """
        touched = {str(d.parent_uuid or d.uuid) for d in record.devices
                   if (d.uuid or d.parent_uuid)
                   and (d.uuid in record.restore.compute_mode
                        or d.uuid in record.restore.time_slice
                        or (d.mig is not None and d.mig.profile_id >= 0))}
        touched |= {e.gpu for e in shares.entries_of(record)}
        return {gpu: reason for gpu in sorted(touched)
                if (reason := self.nvml.why_unavailable(gpu)) is not None}

    def _destroy(
        self, mig: MigRecord, owned: set[tuple[str, int, int]], preexisting: set[int]
    ) -> None:
        if (mig.parent_uuid, mig.profile_id, mig.placement_start) in owned:
            return  # another claim's; never ours to destroy
        gi, ci = mig.gpu_instance_id, mig.compute_instance_id
        started = time.perf_counter()
        if gi < 0:
            # Crashed between create and record: find it by what the name encodes, but
            # never a device that existed before this claim started. Among the GPU
            # instances, not the MIG devices: a kill before the compute instance was made
            # leaves a GPU instance that is no MIG device.
            live = self._find_live(mig.parent_uuid, mig.profile_id, mig.placement_start)
            if live is None or live.gpu_instance_id in preexisting:
                return
            gi = live.gpu_instance_id
            destroyed = self.nvml.destroy_gpu_instance(mig.parent_uuid, gi)
        else:
            destroyed = self.nvml.destroy_mig_device(mig.parent_uuid, gi, ci)
        if destroyed:
            metrics.MIG_OPERATIONS.labels("destroy", "ok").inc()
            metrics.MIG_OPERATION_SECONDS.labels("destroy").observe(time.perf_counter() - started)
            log.info("destroyed MIG device", gpu=mig.parent_uuid, gpu_instance=gi,
                     compute_instance=ci)

    def _find_live(self, parent: str, profile_id: int, start: int) -> GpuInstance | None:
        for instance in self.nvml.gpu_instances(parent):
            if instance.profile_id == profile_id and instance.placement.start == start:
                return instance
        return None

    def restore_mig_mode(self, parent: str, cp: Checkpoint) -> None:
        """Turn MIG off again when the last partition is gone and it was off before us."""
        if cp.mig_mode_baseline.get(parent, True):
            return
        if self.nvml.gpu_instances(parent):  # bare GPU instances count: MIG stays on for them
            return
        if self.nvml.running_processes(parent):
            return  # not idle: leave it; the next unprepare tries again
        try:
            self.nvml.set_mig_mode(parent, False)
        except NvmlError as exc:
            log.warning("could not disable MIG mode", gpu=parent, error=str(exc))
        else:
            log.info("disabled MIG mode", gpu=parent)

    def mps_claims(self, cp: Checkpoint) -> dict[str, MpsClaim]:
        """Prepared claims that run an MPS daemon, with what it takes to start it again."""
        claims = {}
        for record in cp.completed().values():
            mps = record.restore.mps
            if mps is not None:
                claims[record.uid] = MpsClaim(
                    ref=record.ref, uuids=tuple(mps.uuids),
                    commands=None if mps.commands is None else tuple(mps.commands))
        for gpu, entries in shares.mps_gpus(cp).items():
            claims[shares.daemon_key(gpu)] = MpsClaim(
                ref=f"shared GPU {gpu}", uuids=(gpu,),
                commands=tuple(shares.mps_commands(gpu, entries)))
        return claims

    def reassert_shares(self, cp: Checkpoint) -> None:
        """After a restart: give every shared GPU its prepared shares' settings again.

        An unprepare that crashed after the last share's GPU was put back (or after a
        leaving share shrank the daemon's limits) leaves claims still prepared; their GPU
        goes back to exclusive mode, and the daemon (adopted or restarted by then) gets
        the limits of the shares the checkpoint holds. Idempotent; per GPU, logged.
        """
        for gpu, entries in shares.mps_gpus(cp).items():
            if self.mps is None or self.nvml.why_unavailable(gpu) is not None:
                continue
            try:
                self.nvml.set_compute_mode(gpu, COMPUTE_MODE_EXCLUSIVE_PROCESS)
                key = shares.daemon_key(gpu)
                if self.mps.running_pid(key) is not None:
                    self.mps.send(key, shares.mps_commands(gpu, entries))
            except (NvmlError, CommandError) as exc:
                log.error("cannot restore a shared GPU's MPS settings", gpu=gpu,
                          error=str(exc))
        for record in cp.completed().values():
            for entry in shares.entries_of(record):
                if entry.strategy == "TimeSlicing" and self.commands is not None \
                        and self.nvml.why_unavailable(entry.gpu) is None:
                    try:
                        set_time_slice(self.commands, entry.gpu, entry.time_slice)
                    except CommandError as exc:
                        log.error("cannot restore a shared GPU's time slice", gpu=entry.gpu,
                                  error=str(exc))

    def safe_instances(self, parent: str) -> list[MigInstance]:
        """The GPU's MIG devices; none (with a warning) when NVML cannot list them."""
        try:
            return self.nvml.mig_instances(parent)
        except NvmlError as exc:
            log.warning("cannot list MIG devices", gpu=parent, error=str(exc))
            return []

    def safe_gpu_instances(self, parent: str) -> list[GpuInstance]:
        """The GPU's GPU instances, bare ones included; none (with a warning) when NVML
        cannot list them."""
        try:
            return self.nvml.gpu_instances(parent)
        except NvmlError as exc:
            log.warning("cannot list GPU instances", gpu=parent, error=str(exc))
            return []


def _compute_mode_of(step: DeviceStep) -> str | None:
    """The compute mode a device's config asks for (MPS and time-slicing imply one)."""
    config = step.config
    assert isinstance(config, GpuConfig | MigDeviceConfig)
    sharing = config.sharing
    if sharing is not None and sharing.strategy == "MPS":
        return "ExclusiveProcess"  # MPS clients share one context per GPU
    if sharing is not None and sharing.strategy == "TimeSlicing":
        return config.compute_mode or "Default"
    return config.compute_mode


def _time_slice_of(step: DeviceStep) -> str | None:
    """The time-slice interval a full GPU's config asks for, or ``None``."""
    config = step.config
    if not isinstance(config, GpuConfig) or config.sharing is None \
            or config.sharing.strategy != "TimeSlicing":
        return None
    slicing = config.sharing.time_slicing_config
    return "Default" if slicing is None else slicing.interval


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
