"""What the node holds, rebuilt from what survives a checkpoint it cannot read (pure).

A checkpoint that is empty, cut short, garbage, of the wrong shape or with a bad checksum
says nothing about the hardware: the claims it held still have pods using their GPUs. So
state the daemon cannot read is never a reason to destroy or reuse hardware. What survives
it, and what each tells:

- **the CDI specs the daemon wrote**, one per claim: the claim's UID, its devices (names
  ``<claimUID>-<device>``, a share's ``<device>-<shareID>``) and, for an MPS share, its
  limits (the client environment);
- **the hardware**: each GPU's compute mode, MIG mode and MIG devices, and the MPS control
  daemons that run;
- **the API server's ResourceClaims** allocated to this node: namespace, name, the request
  each device was allocated for, admin access, a share's consumed capacity; and whether
  the claim is reserved for a pod.
- **the ResourceSlices the daemon published**: which GPUs it ran as dynamic MIG (an admin's
  static MIG layout is not ours to destroy, and publishes no counters).

:func:`rebuild` turns them into checkpoint records and a **held** set. A claim with a spec
is rebuilt as prepared: unprepare then undoes what it did (its MIG devices destroyed,
compute mode back to ``Default``, its share left). A claim the API server says is allocated
here and reserved, with no spec, never finished preparing: it is rebuilt as started, so
start-up rolls it back as after any crash, and the kubelet's retry prepares it again. Any
other change on the hardware — a MIG device, a compute mode no claim explains — is
**held**: published with a ``NoSchedule`` taint, never destroyed, never handed to another
claim, until the operator looks (README, "Operations"). Only when nothing is rebuilt and
nothing is held does the node start empty.

Assumptions, written down because they cannot be read back: a GPU's compute mode before a
claim was ``Default``; a dynamic MIG GPU had MIG mode off before its first claim. Not put
back by a rebuilt claim's unprepare, for the same reason: a time slice it set, the compute
mode of a static MIG device, and a full GPU's MPS daemon's limits (restarted with defaults
should it die); without the API server, the request names in its answer.

Nothing here reads a file, NVML or the network: :mod:`gpudra.driver.recovery_step`
gathers the inputs (:mod:`gpudra.driver.survivors` parses them) and applies the result;
what is held is :mod:`gpudra.driver.held`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpudra.driver import shares
from gpudra.driver.cdi import spec_kind
from gpudra.driver.checkpoint_model import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    ClaimRecord,
    DeviceRecord,
    MigRecord,
    Restore,
)
from gpudra.driver.held import HeldDevice, parent_of
from gpudra.driver.nvml import COMPUTE_MODE_DEFAULT, MigInstance
from gpudra.driver.prepare_plan import (
    DynamicMigTarget,
    GpuTarget,
    ShareTarget,
    StaticMigTarget,
    Target,
)
from gpudra.driver.survivors import (
    AllocatedResult,
    ApiClaim,
    ClaimSpec,
    GpuHardware,
    SpecDevice,
    Survivors,
)

_PINNED = re.compile(r"^CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=(\d{1,9})M$")
_THREADS = re.compile(r"^CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=(\d{1,3})$")


@dataclass(frozen=True)
class Recovery:
    checkpoint: Checkpoint
    held: tuple[HeldDevice, ...]
    rebuilt: tuple[str, ...]
    """Refs of the claims rebuilt as prepared."""
    restarted: tuple[str, ...]
    """Refs of the claims rebuilt as started (rolled back at start-up, prepared again)."""

    @property
    def empty(self) -> bool:
        return not (self.rebuilt or self.restarted or self.held)


def rebuild(survivors: Survivors, *, targets: Mapping[str, Target], pool: str, driver: str,
            boot_id: str) -> Recovery:
    """The checkpoint records and the held set that ``survivors`` support.

    ``targets`` resolves published device names as if every live MIG device were the
    daemon's (so a dynamic MIG device's name finds its parent and placement); whether a GPU
    really was dynamic comes from ``survivors.published_mig`` (see :func:`_dynamic`).
    """
    gpus = {g.uuid: g for g in survivors.gpus}
    api = survivors.claims or {}
    claims: dict[str, ClaimRecord] = {}
    held: list[HeldDevice] = []
    claimed: set[tuple[str, int]] = set()  # (parent, GPU instance id) a record holds
    explained: set[str] = set()  # GPUs whose compute mode a record puts back
    baselines: dict[str, bool] = {}
    dynamic = _dynamic(survivors, targets)
    for spec in sorted(survivors.specs, key=lambda s: s.uid):
        record, device_held = _from_spec(spec, api.get(spec.uid), survivors, targets, gpus,
                                         pool=pool, driver=driver, dynamic=dynamic)
        held.extend(device_held)
        claims[record.uid] = record
        _note(record, claimed, explained, baselines, gpus)
    for claim in sorted(api.values(), key=lambda c: c.uid):
        if claim.uid in claims or not claim.reserved:
            continue
        unfinished = _unfinished(claim, targets, gpus, claimed, pool=pool, dynamic=dynamic)
        if unfinished is not None:
            claims[unfinished.uid] = unfinished
            _note(unfinished, claimed, explained, baselines, gpus)
    held.extend(_unattributed(survivors, claimed, explained))
    # A GPU with a held MIG device keeps no baseline: MIG mode stays as it is.
    for h in held:
        if h.gpu is not None:
            baselines.pop(h.gpu, None)
    cp = Checkpoint(boot_id=boot_id, claims=claims, mig_mode_baseline=baselines)
    rebuilt = tuple(r.ref for r in claims.values() if r.state == PREPARE_COMPLETED)
    restarted = tuple(r.ref for r in claims.values() if r.state == PREPARE_STARTED)
    return Recovery(cp, tuple(held), rebuilt, restarted)


def _resolve(name: str, targets: Mapping[str, Target]) -> tuple[str, Target, str | None] | None:
    """A spec's device name → (published device, target, share ID)."""
    target = targets.get(name)
    if target is not None:
        return name, target, None
    device, sep, share_id = name.partition("-shared-")
    if sep and isinstance(targets.get(f"{device}-shared"), ShareTarget) and share_id:
        return f"{device}-shared", targets[f"{device}-shared"], share_id
    return None


def _from_spec(spec: ClaimSpec, claim: ApiClaim | None, survivors: Survivors,
               targets: Mapping[str, Target], gpus: Mapping[str, GpuHardware], *, pool: str,
               driver: str, dynamic: frozenset[str]) -> tuple[ClaimRecord, list[HeldDevice]]:
    uid = spec.uid
    results = {(r.device, r.share_id): r for r in claim.results} if claim else {}
    devices: list[DeviceRecord] = []
    restore: dict[str, Any] = {}
    held: list[HeldDevice] = []
    mps_uuids: list[str] = []
    for spec_device in spec.devices:
        cdi_id = f"{spec_kind(driver)}={uid}-{spec_device.name}"
        resolved = _resolve(spec_device.name, targets)
        if resolved is None:
            # Kept as a device with nothing to undo: its spec stays until unprepare.
            held.append(HeldDevice(kind="device", claim=uid, reason=(
                f"claim {uid}'s CDI spec names device {spec_device.name!r}, which this node "
                "does not publish now")))
            devices.append(DeviceRecord(request_names=[], pool=pool, device=spec_device.name,
                                        cdi_device_ids=[cdi_id], kind="gpu"))
            continue
        name, target, share_id = resolved
        result = results.get((name, share_id))
        admin = result.admin_access if result else False
        requests = [result.request] if result else []
        record = DeviceRecord(request_names=requests, pool=pool, device=name,
                              cdi_device_ids=[cdi_id], kind="gpu", share_id=share_id,
                              admin_access=admin)
        gpu = gpus.get(parent_of(target))
        if isinstance(target, ShareTarget):
            record = record.model_copy(update={"uuid": target.uuid})
            entry = _share_entry(spec_device, target, share_id, result)
            restore.setdefault("shares", {})[str(share_id)] = entry.to_json()
        elif isinstance(target, GpuTarget):
            record = record.model_copy(update={"uuid": target.uuid})
            if not admin and gpu is not None and gpu.compute_mode not in (
                    None, COMPUTE_MODE_DEFAULT):
                restore.setdefault("computeMode", {})[target.uuid] = COMPUTE_MODE_DEFAULT
            mps_uuids.append(target.uuid)
        else:
            record, found = _mig_record(record, target, gpu, dynamic)
            if found is not None:
                mps_uuids.append(found)
        devices.append(record)
    if uid in survivors.mps_daemons and mps_uuids:
        # Without its commands: a daemon that dies is restarted with MPS defaults (logged).
        restore["mps"] = {"claim": uid, "uuids": mps_uuids}
    _preexisting(devices, restore, gpus)
    return ClaimRecord(uid=uid, namespace=claim.namespace if claim else "",
                       name=claim.name if claim else "", state=PREPARE_COMPLETED,
                       devices=devices, restore=Restore.model_validate(restore)), held


def _mig_record(record: DeviceRecord, target: Target, gpu: GpuHardware | None,
                dynamic: frozenset[str]) -> tuple[DeviceRecord, str | None]:
    """A MIG device's record; its live UUID when the device is there."""
    if isinstance(target, StaticMigTarget):
        mig = MigRecord(parent_uuid=target.parent_uuid, gpu_instance_id=target.gpu_instance_id,
                        compute_instance_id=target.compute_instance_id, profile_id=-1,
                        placement_start=-1, placement_size=-1, mig_uuid=target.uuid)
        return record.model_copy(update={"kind": "mig", "uuid": target.uuid,
                                         "parent_uuid": target.parent_uuid, "mig": mig}), \
            target.uuid
    assert isinstance(target, DynamicMigTarget)
    parent = target.parent_uuid
    live = _live(gpu, target.profile.profile_id, target.placement.start)
    if live is None or parent not in dynamic or record.admin_access:
        # Gone (nothing to undo), an admin's layout, or only observed: never destroyed.
        gi, ci, uuid = (live.gpu_instance_id, live.compute_instance_id, live.uuid) \
            if live else (-1, -1, None)
        mig = MigRecord(parent_uuid=parent, gpu_instance_id=gi, compute_instance_id=ci,
                        profile_id=-1, placement_start=-1, placement_size=-1, mig_uuid=uuid)
        return record.model_copy(update={"kind": "mig", "uuid": uuid, "parent_uuid": parent,
                                         "mig": mig}), uuid
    mig = MigRecord(parent_uuid=parent, gpu_instance_id=live.gpu_instance_id,
                    compute_instance_id=live.compute_instance_id,
                    profile_id=target.profile.profile_id, placement_start=target.placement.start,
                    placement_size=target.placement.size, mig_uuid=live.uuid, created=True)
    return record.model_copy(update={"kind": "mig", "uuid": live.uuid, "parent_uuid": parent,
                                     "mig": mig}), live.uuid


def _dynamic(survivors: Survivors, targets: Mapping[str, Target]) -> frozenset[str]:
    """GPUs whose MIG devices the daemon made: as its published slices showed them; for a
    GPU they do not show, when every MIG device on it is one a spec names (one that nobody
    names may be an admin's layout: then none on that GPU is destroyed)."""
    named = set()
    for spec in survivors.specs:
        for device in spec.devices:
            target = targets.get(device.name)
            if isinstance(target, DynamicMigTarget):
                named.add((target.parent_uuid, target.profile.profile_id,
                           target.placement.start))
    dynamic = set()
    for gpu in survivors.gpus:
        published = survivors.published_mig.get(gpu.uuid)
        if published is None:
            published = all((gpu.uuid, i.profile_id, i.placement.start) in named
                            for i in gpu.mig_instances)
        if published:
            dynamic.add(gpu.uuid)
    return frozenset(dynamic)


def _live(gpu: GpuHardware | None, profile_id: int, start: int) -> MigInstance | None:
    for instance in gpu.mig_instances if gpu else ():
        if instance.profile_id == profile_id and instance.placement.start == start:
            return instance
    return None


def _share_entry(device: SpecDevice, target: ShareTarget, share_id: str | None,
                 result: AllocatedResult | None) -> shares.ShareEntry:
    """A share's limits as its spec's client environment states them; the capacities the
    allocation consumed when the API server still has the claim."""
    pinned = next((m for e in device.env if (m := _PINNED.match(e))), None)
    threads = next((m for e in device.env if (m := _THREADS.match(e))), None)
    consumed = result.consumed if result else {}
    return shares.ShareEntry(
        share_id=str(share_id), gpu=target.uuid, device=f"gpu-{target.minor}-shared",
        strategy="MPS" if pinned or threads else "TimeSlicing",
        memory_bytes=int(pinned[1]) * shares.MIB if pinned else consumed.get("memory", 0),
        multiprocessors=consumed.get("multiprocessors", 0), shares=consumed.get("shares", 0),
        thread_percentage=int(threads[1]) if threads else 100,
        baseline_compute_mode=COMPUTE_MODE_DEFAULT)


def _preexisting(devices: Sequence[DeviceRecord], restore: dict[str, Any],
                 gpus: Mapping[str, GpuHardware]) -> None:
    """Every other MIG device on a GPU the claim partitions: never this claim's to destroy."""
    for d in devices:
        if d.mig is None or not d.mig.created:
            continue
        gpu = gpus.get(d.mig.parent_uuid)
        others = sorted(i.gpu_instance_id for i in (gpu.mig_instances if gpu else ())
                        if i.gpu_instance_id != d.mig.gpu_instance_id)
        restore.setdefault("preexistingMig", {})[d.mig.parent_uuid] = others


def _unfinished(claim: ApiClaim, targets: Mapping[str, Target],
                gpus: Mapping[str, GpuHardware], claimed: set[tuple[str, int]], *,
                pool: str, dynamic: frozenset[str]) -> ClaimRecord | None:
    """A reserved claim with no spec whose devices the hardware shows changed: its prepare
    did not finish (no container got a spec). Rebuilt as started, so the usual crash
    recovery undoes exactly that, and the kubelet's retry prepares it."""
    devices: list[DeviceRecord] = []
    restore: dict[str, Any] = {}
    changed = False
    for result in claim.results:
        if result.admin_access or result.share_id is not None:
            continue
        target = targets.get(result.device)
        gpu = gpus.get(parent_of(target)) if target is not None else None
        if gpu is None:
            continue
        record = DeviceRecord(request_names=[result.request], pool=pool, device=result.device,
                              cdi_device_ids=[], kind="gpu")
        if isinstance(target, DynamicMigTarget) and gpu.uuid in dynamic:
            live = _live(gpu, target.profile.profile_id, target.placement.start)
            if live is None or (gpu.uuid, live.gpu_instance_id) in claimed:
                continue
            record, _ = _mig_record(record, target, gpu, dynamic)
            changed = True
        elif type(target) is GpuTarget:
            record = record.model_copy(update={"uuid": target.uuid})
            if gpu.compute_mode not in (None, COMPUTE_MODE_DEFAULT):
                restore.setdefault("computeMode", {})[target.uuid] = COMPUTE_MODE_DEFAULT
                changed = True
        else:
            continue
        devices.append(record)
    if not changed:
        return None
    _preexisting(devices, restore, gpus)
    return ClaimRecord(uid=claim.uid, namespace=claim.namespace, name=claim.name,
                       state=PREPARE_STARTED, devices=devices,
                       restore=Restore.model_validate(restore))


def _note(record: ClaimRecord, claimed: set[tuple[str, int]], explained: set[str],
          baselines: dict[str, bool], gpus: Mapping[str, GpuHardware]) -> None:
    """What ``record`` accounts for on the hardware."""
    for d in record.devices:
        if d.admin_access:
            continue  # it only observes: whoever made the change is somebody else
        if d.mig is not None and d.mig.gpu_instance_id >= 0:
            claimed.add((d.mig.parent_uuid, d.mig.gpu_instance_id))
            if d.mig.created and d.mig.parent_uuid in gpus:
                baselines[d.mig.parent_uuid] = False  # we turned MIG on for it
        if d.kind == "gpu" and d.uuid and not d.admin_access and (
                d.uuid in record.restore.compute_mode or d.share_id):
            explained.add(d.uuid)


def _unattributed(survivors: Survivors, claimed: set[tuple[str, int]],
                  explained: set[str]) -> list[HeldDevice]:
    """Changes on the hardware that no claim explains: held."""
    held = []
    for gpu in sorted(survivors.gpus, key=lambda g: g.minor):
        for instance in gpu.mig_instances:
            if (gpu.uuid, instance.gpu_instance_id) in claimed:
                continue
            if survivors.published_mig.get(gpu.uuid) is False:
                continue  # an admin's static layout, published as such before
            held.append(HeldDevice(
                kind="mig", gpu=gpu.uuid, minor=gpu.minor, mig_uuid=instance.uuid,
                gpu_instance_id=instance.gpu_instance_id, placement=instance.placement,
                reason="MIG device that no surviving CDI spec or allocated claim explains"))
        if gpu.compute_mode not in (None, COMPUTE_MODE_DEFAULT) and gpu.uuid not in explained:
            held.append(HeldDevice(
                kind="compute-mode", gpu=gpu.uuid, minor=gpu.minor,
                reason=f"compute mode {gpu.compute_mode} that no surviving CDI spec or "
                       "allocated claim explains"))
    return held
