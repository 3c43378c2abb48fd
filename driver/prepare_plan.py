"""What preparing a claim means on this node, computed without touching anything.

The plan names, for every allocated device, the physical target (a full GPU, an existing
MIG device, or a MIG device to create at a placement) and its config. Everything that can
be wrong with a claim is found here, before any hardware or file is changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property

from gpudra.api.configs import DeviceConfig
from gpudra.driver.claims import (
    AllocatedDevice,
    ClaimError,
    ClaimToPrepare,
    duplicate_devices,
    resolve_configs,
)
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.devices import Device, NodeDevices, RequestPolicy
from gpudra.driver.gpu_shares import SHARED_TYPE, shared_device_minor
from gpudra.driver.inventory import GpuRecord, NodeInventory
from gpudra.driver.mig import MigProfile, Placement, parse_device_name
from gpudra.driver.shares import ShareEntry, limits_for
from gpudra.driver.vfio_model import IOMMU_GROUP, VFIO
from gpudra.driver.vfio_model import device_minor as vfio_device_minor
from gpudra.driver.vfio_sysfs import sysfs_bus_id


@dataclass(frozen=True)
class GpuTarget:
    uuid: str
    minor: int


@dataclass(frozen=True)
class StaticMigTarget:
    uuid: str
    parent_uuid: str
    parent_minor: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class DynamicMigTarget:
    parent_uuid: str
    parent_minor: int
    profile: MigProfile
    placement: Placement
    reset_less_toggle: bool
    """Hopper and newer change MIG mode without a GPU reset."""


@dataclass(frozen=True)
class ShareTarget(GpuTarget):
    """A share of a full GPU (its ``gpu-<minor>-shared`` device): the GPU itself, plus the
    shared device's capacities and request policies to check a share against."""

    capacity: tuple[tuple[str, int], ...] = ()
    policies: tuple[tuple[str, RequestPolicy], ...] = ()
    tainted: str | None = None
    """A ``NoExecute`` taint on the device (an unhealthy GPU), as ``key=value``."""


@dataclass(frozen=True)
class VfioTarget(GpuTarget):
    """A full GPU taken by ``vfio-pci`` for a VM (its ``gpu-vfio-<minor>`` device); a full
    GPU in every other respect (conflicts, locks). See ``gpudra.driver.vfio``."""

    bus_id: str = ""
    """Sysfs form."""
    group_gpus: tuple[str, ...] = ()
    """The other GPUs of its IOMMU group (they go to the VM too): locked with it."""


Target = GpuTarget | StaticMigTarget | DynamicMigTarget

HOPPER = 9


@dataclass(frozen=True)
class DeviceStep:
    allocated: AllocatedDevice
    target: Target
    config: DeviceConfig | None
    share: ShareEntry | None = None
    """For a :class:`ShareTarget`: the share's limits, from the allocation."""

    @property
    def parent_uuid(self) -> str:
        return self.target.uuid if isinstance(self.target, GpuTarget) else self.target.parent_uuid


@dataclass(frozen=True)
class PreparePlan:
    claim: ClaimToPrepare
    steps: tuple[DeviceStep, ...]


@dataclass(frozen=True)
class NodeIndex:
    """Device name → physical target, for the devices this node publishes."""

    pool: str
    devices: NodeDevices
    targets: Mapping[str, Target]

    @cached_property
    def types(self) -> Mapping[str, str]:
        """Device name → its ``type`` attribute; built once per index, not per claim."""
        return {d.name: d.type for d in self.devices.devices}

    @classmethod
    def build(cls, pool: str, inventory: NodeInventory, options: ModelOptions) -> NodeIndex:
        devices = build_devices(inventory, options)
        gpus = {g.probe.minor: g for g in inventory.gpus}
        targets: dict[str, Target] = {}
        for device in devices.devices:
            if device.type == SHARED_TYPE:
                share = _share_target(device, gpus)
                if share is not None:
                    targets[device.name] = share
                continue
            if device.type == VFIO:
                vfio = _vfio_target(device, gpus)
                if vfio is not None:
                    targets[device.name] = vfio
                continue
            target = _target(device.name, device.type, device.attributes.get("uuid"), gpus)
            if target is not None:
                targets[device.name] = target
        return cls(pool, devices, _with_group_gpus(devices, targets))


def _share_target(device: Device, gpus: Mapping[int, GpuRecord]) -> ShareTarget | None:
    minor = shared_device_minor(device.name)
    if minor is None or minor not in gpus:
        return None
    taint = next((t for t in device.taints if t.effect == "NoExecute"), None)
    return ShareTarget(gpus[minor].probe.uuid, minor,
                       capacity=tuple(sorted(device.capacity.items())),
                       policies=tuple(sorted(device.request_policies.items())),
                       tainted=None if taint is None else f"{taint.key}={taint.value}")


def _with_group_gpus(devices: NodeDevices, targets: dict[str, Target]) -> dict[str, Target]:
    """Each vfio target with the other GPUs published in its IOMMU group."""
    groups: dict[int, list[str]] = {}
    for device in devices.devices:
        group, uuid = device.attributes.get(IOMMU_GROUP), device.attributes.get("uuid")
        if device.type == VFIO and isinstance(group, int) and isinstance(uuid, str):
            groups.setdefault(group, []).append(uuid)
    if all(len(members) == 1 for members in groups.values()):
        return targets  # one GPU per group: nothing to add (the common case)
    for device in devices.devices:
        target = targets.get(device.name)
        group = device.attributes.get(IOMMU_GROUP)
        if isinstance(target, VfioTarget) and isinstance(group, int):
            targets[device.name] = replace(target, group_gpus=tuple(
                u for u in groups[group] if u != target.uuid))
    return targets


def _vfio_target(device: Device, gpus: Mapping[int, GpuRecord]) -> VfioTarget | None:
    minor = vfio_device_minor(device.name)
    if minor is None or minor not in gpus:
        return None
    probe = gpus[minor].probe
    return VfioTarget(probe.uuid, minor, bus_id=sysfs_bus_id(probe.pci_bus_id))


def _target(
    name: str, kind: str, uuid: object, gpus: Mapping[int, GpuRecord]
) -> Target | None:
    if kind == "gpu":
        minor = int(name.removeprefix("gpu-"))
        return GpuTarget(gpus[minor].probe.uuid, minor)
    ref = parse_device_name(name)
    if ref is None or ref.parent_minor not in gpus:
        return None
    parent = gpus[ref.parent_minor]
    if isinstance(uuid, str):
        for inst in parent.mig_instances:
            if inst.uuid == uuid:
                return StaticMigTarget(uuid, parent.probe.uuid, ref.parent_minor,
                                       inst.gpu_instance_id, inst.compute_instance_id)
        return None
    profile = next((p for p in parent.mig_profiles if p.profile_id == ref.profile_id), None)
    if profile is None:
        return None
    placement = next((p for p in profile.placements if p.start == ref.start), None)
    if placement is None:
        return None
    return DynamicMigTarget(parent.probe.uuid, ref.parent_minor, profile, placement,
                            parent.probe.architecture >= HOPPER)


def plan_claim(claim: ClaimToPrepare, node: NodeIndex) -> PreparePlan:
    """Check a claim against this node and say what to do; raises :class:`ClaimError`."""
    if not claim.devices:
        raise ClaimError(f"claim {claim.ref}: allocation has no devices for this driver")
    dupes = duplicate_devices(claim.devices)
    if dupes:
        raise ClaimError(f"claim {claim.ref}: device {dupes[0]!r} allocated twice")
    for device in claim.devices:
        if device.pool != node.pool:
            raise ClaimError(f"claim {claim.ref}: device {device.device!r} is in pool "
                             f"{device.pool!r}, not this node's pool {node.pool!r}")
        if device.device not in node.targets and shared_device_minor(device.device) is not None:
            raise ClaimError(f"claim {claim.ref}: device {device.device!r}: GPU "
                             f"{shared_device_minor(device.device)} is not shareable on this "
                             "node (--shareable-gpus, feature gate ConsumableCapacity)")
        if device.device not in node.targets and parse_device_name(device.device) is not None:
            raise ClaimError(f"claim {claim.ref}: device {device.device!r} is a MIG device this "
                             "node does not offer (--dynamic-mig-gpus, --dynamic-mig-profiles, "
                             "--dynamic-mig-placements, feature gate DynamicMIG; an A100/A30 "
                             "with MIG mode off also needs --allow-mig-mode-change, since "
                             "switching it needs a GPU reset), or its GPU "
                             "was removed or repartitioned")
        if device.device not in node.targets and vfio_device_minor(device.device) is not None:
            raise ClaimError(f"claim {claim.ref}: device {device.device!r} is a vfio device this "
                             "node does not offer (feature gate PassthroughSupport; no IOMMU, "
                             "or the GPU is static MIG, disjoint MIG or was removed)")
        if device.device not in node.targets:
            raise ClaimError(f"claim {claim.ref}: device {device.device!r} is not in this node's "
                             "inventory (was the GPU removed or repartitioned?)")
    configs = resolve_configs(claim, node.types)
    steps = tuple(_step(claim, d, node.targets[d.device], configs[d.device])
                  for d in claim.devices)
    _check_overlaps(claim, steps)
    return PreparePlan(claim, steps)


def _step(
    claim: ClaimToPrepare, allocated: AllocatedDevice, target: Target,
    config: DeviceConfig | None,
) -> DeviceStep:
    if not isinstance(target, ShareTarget):
        if allocated.share_id is not None or allocated.consumed:
            raise ClaimError(f"claim {claim.ref}: device {allocated.device!r} is not a shared "
                             "device, yet the allocation result has a shareID or "
                             "consumedCapacity")
        return DeviceStep(allocated, target, config)
    if target.tainted is not None:
        raise ClaimError(f"claim {claim.ref}: device {allocated.device!r}: GPU {target.uuid} is "
                         f"unhealthy (taint {target.tainted}); no new shares on it")
    share = limits_for(claim, allocated.device, allocated.share_id,
                       allocated.consumed_capacity, dict(target.capacity),
                       dict(target.policies), target.uuid, config)
    return DeviceStep(allocated, target, config, share)


def _check_overlaps(claim: ClaimToPrepare, steps: tuple[DeviceStep, ...]) -> None:
    """One claim cannot hold a full GPU and a partition of it, or overlapping partitions."""
    by_parent: dict[str, list[DeviceStep]] = {}
    for step in steps:
        if not step.allocated.admin_access:
            by_parent.setdefault(step.parent_uuid, []).append(step)
    for group in by_parent.values():
        shared = [s for s in group if isinstance(s.target, ShareTarget)]
        if shared and len(shared) < len(group):
            raise ClaimError(f"claim {claim.ref}: device {shared[0].allocated.device!r} is a "
                             "share of a GPU the claim also holds whole or partitioned")
        if shared:
            continue
        whole = [s for s in group if isinstance(s.target, GpuTarget)]
        if whole and len(group) > 1:
            raise ClaimError(f"claim {claim.ref}: device {whole[0].allocated.device!r} is a full "
                             "GPU and the claim also holds a MIG device on it")
        dynamic = [s for s in group if isinstance(s.target, DynamicMigTarget)]
        for i, a in enumerate(dynamic):
            for b in dynamic[i + 1:]:
                assert isinstance(a.target, DynamicMigTarget)
                assert isinstance(b.target, DynamicMigTarget)
                if a.target.placement.overlaps(b.target.placement):
                    raise ClaimError(f"claim {claim.ref}: MIG devices {a.allocated.device!r} and "
                                     f"{b.allocated.device!r} overlap on the same GPU")
