"""Inventory → DRA devices (pure): full GPUs, static MIG devices, dynamic MIG placements.

Attribute names and types follow NVIDIA's driver so claims written for it mean the same
here; ``numaNode`` and ``nvlinkDomain`` are additions for placement-aware selection.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gpudra.driver.devices import (
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
    NodeDevices,
    Version,
)
from gpudra.driver.gpu_shares import (
    NONE,
    SHARED_CAPACITIES,
    SHARED_TYPE,
    ShareableGpus,
    can_share,
    plain_counter_set,
    shared_device,
    whole_gpu,
)
from gpudra.driver.mig import (
    CAPACITY_NAMES,
    MigProfile,
    Placement,
    consumption,
    device_name,
    gpu_counters,
    placement_order,
)
from gpudra.driver.mig_offer import EVERY, MigOffer, disjoint_order, disjoint_set, profile_order
from gpudra.driver.vfio_model import ATTRIBUTES as VFIO_ATTRIBUTES
from gpudra.driver.vfio_model import CAPACITIES as VFIO_CAPACITIES
from gpudra.driver.vfio_model import VFIO, VfioOffer, with_vfio_devices

if TYPE_CHECKING:  # annotations only: `gpudra validate` reads the schema without NVML
    from gpudra.driver.inventory import GpuRecord, NodeInventory

PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"
"""Kubernetes' standard name (``deviceattribute.StandardDeviceAttributeNUMANode``, an int):
claims can line a GPU up with a NIC or CPUs of other drivers by ``matchAttribute``. Our own
``numaNode`` stays beside it for claims written against it."""

# --- what devices publish: the schema the builders below follow -----------------------------
# gpudra.scheduling.catalog checks claims against it; tests/scheduling/test_catalog.py builds
# every simulated profile and checks that devices publish exactly this, no more, no less.

GPU: Final = "gpu"
MIG: Final = "mig"
SHARED: Final = SHARED_TYPE
_COMMON_ATTRIBUTES: Final[Mapping[str, type[AttributeValue]]] = {
    "type": str, "uuid": str, "productName": str, "brand": str, "architecture": str,
    "cudaComputeCapability": Version, "driverVersion": Version, "cudaDriverVersion": Version,
    "numaNode": int, PCI_BUS_ID: str, PCIE_ROOT: str, NUMA_NODE: int, "addressingMode": str,
}
PUBLISHED_ATTRIBUTES: Final[Mapping[str, Mapping[str, type[AttributeValue]]]] = {
    GPU: {**_COMMON_ATTRIBUTES, "nvlinkDomain": str},
    MIG: {**_COMMON_ATTRIBUTES, "parentUUID": str, "profile": str},
    SHARED: {**_COMMON_ATTRIBUTES, "nvlinkDomain": str},
    VFIO: VFIO_ATTRIBUTES,
}
"""Per device type: every attribute a device may carry (some only on some nodes), with the
Python type of its value. A qualified name is in another domain; bare ones are the driver's."""
GPU_CAPACITIES: Final = ("memory", "multiprocessors")
PUBLISHED_CAPACITIES: Final[Mapping[str, tuple[str, ...]]] = {
    GPU: GPU_CAPACITIES,
    MIG: CAPACITY_NAMES,
    SHARED: SHARED_CAPACITIES,
    VFIO: VFIO_CAPACITIES,
}
"""Per device type: the capacities every device of it publishes."""
MEMORY_SLICE_CAPACITY: Final = "memorySlice"
"""Static MIG devices also publish ``memorySlice<i>`` (value 1) per memory slice they hold."""

# nvmlBrandType_t → the strings NVIDIA's driver publishes.
BRANDS = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS",
    11: "NvidiaCloudGaming", 12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia",
    15: "GeForceRTX", 16: "TitanRTX",
}
# nvmlDeviceArchitecture_t → architecture names.
ARCHITECTURES = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
    8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell",
}


@dataclass(frozen=True)
class ModelOptions:
    dynamic_mig: bool = True
    """Feature gate DynamicMIG: off, no GPU offers MIG devices made on demand."""
    mig: MigOffer = EVERY
    """Which GPUs offer them, of which profiles, placed how (``--dynamic-mig-*``; the
    daemon's default offers none: see ``gpudra.driver.mig_offer``)."""
    owned_mig_uuids: Collection[str] = ()
    """MIG devices this driver created for prepared claims; not admin-made (static) MIG."""
    shareable: ShareableGpus = NONE
    """GPUs that also publish a shared device (``--shareable-gpus``, gate ConsumableCapacity);
    see ``gpudra.driver.gpu_shares``."""
    vfio: VfioOffer | None = None
    """Full GPUs also published as ``vfio`` devices (gate PassthroughSupport); see
    ``gpudra.driver.vfio_model``."""


def semver(text: str) -> Version:
    """A driver-style version as semver: ``580.95.05`` → ``580.95.5``, ``8.0`` → ``8.0.0``."""
    parts = [str(int(p)) for p in text.strip().split(".")[:3] if p.isdigit()]
    while len(parts) < 3:
        parts.append("0")
    return Version(".".join(parts))


def cuda_version(value: int) -> Version:
    """NVML's CUDA driver version integer (``13000``) as semver (``13.0.0``)."""
    return Version(f"{value // 1000}.{(value % 1000) // 10}.0")


def _common_attributes(inv: NodeInventory, gpu: GpuRecord) -> dict[str, AttributeValue]:
    probe = gpu.probe
    attrs: dict[str, AttributeValue] = {
        "productName": probe.name,
        "brand": BRANDS.get(probe.brand, "Unknown"),
        "architecture": ARCHITECTURES.get(probe.architecture, "Unknown"),
        "cudaComputeCapability": semver("{}.{}".format(*probe.cuda_compute_capability)),
        "driverVersion": semver(inv.driver_version),
        "cudaDriverVersion": cuda_version(inv.cuda_driver_version),
        PCI_BUS_ID: probe.pci_bus_id,
    }
    if gpu.pcie_root is not None:
        attrs[PCIE_ROOT] = gpu.pcie_root
    if probe.numa_node is not None:
        attrs["numaNode"] = attrs[NUMA_NODE] = probe.numa_node
    if probe.addressing_mode is not None:  # NVIDIA's too: only where NVML answers
        attrs["addressingMode"] = probe.addressing_mode
    if gpu.nvlink_domain is not None:
        attrs["nvlinkDomain"] = gpu.nvlink_domain
    return attrs


def _full_gpu(inv: NodeInventory, gpu: GpuRecord, counters: CounterSet | None) -> Device:
    probe = gpu.probe
    attrs: dict[str, AttributeValue] = {"type": GPU, "uuid": probe.uuid}
    attrs.update(_common_attributes(inv, gpu))
    consumes: tuple[CounterConsumption, ...] = ()
    if counters is not None:
        consumes = (CounterConsumption(counters.name, dict(counters.counters)),)
    return Device(
        name=f"gpu-{probe.minor}",
        group=f"gpu-{probe.minor}",
        attributes=attrs,
        capacity=dict(zip(
            GPU_CAPACITIES, (probe.memory_bytes, probe.multiprocessors), strict=True)),
        consumes_counters=consumes,
    )


def _mig_attributes(
    inv: NodeInventory, gpu: GpuRecord, profile: MigProfile
) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {"type": MIG, "parentUUID": gpu.probe.uuid,
                                        "profile": profile.name}
    attrs.update(_common_attributes(inv, gpu))
    # MIG devices cannot use NVLink peer-to-peer, so they belong to no NVLink domain.
    attrs.pop("nvlinkDomain", None)
    return attrs


def _offered(gpu: GpuRecord, options: ModelOptions) -> list[MigProfile]:
    """The profiles this GPU offers made on demand; none when it offers no dynamic MIG."""
    if not (options.dynamic_mig and gpu.mig_capable
            and options.mig.covers(gpu.probe.minor, gpu.probe.uuid)):
        return []
    if options.mig.mode_change_refused(gpu.probe.minor, gpu.probe.uuid,
                                       mig_on=bool(gpu.mig_mode and gpu.mig_mode.current),
                                       architecture=gpu.probe.architecture):
        return []  # MIG off and switching it needs a reset nobody allowed
    return profile_order(options.mig, gpu.mig_profiles)


def _is_static(gpu: GpuRecord, options: ModelOptions) -> bool:
    """MIG enabled with partitions we did not make: an admin's static layout, keep it.

    A GPU that offers no dynamic MIG (any more) lists the instances it holds as static
    ones, ours included: under their own names, so an allocated device stays published."""
    if gpu.mig_mode is None or not gpu.mig_mode.current:
        return False
    if not _offered(gpu, options):
        return True
    return any(m.uuid not in options.owned_mig_uuids for m in gpu.mig_instances)


def _static_mig_devices(inv: NodeInventory, gpu: GpuRecord) -> list[Device]:
    by_id = {p.profile_id: p for p in gpu.mig_profiles}
    devices = []
    for instance in gpu.mig_instances:
        profile = by_id.get(instance.profile_id)
        if profile is None:
            continue
        attrs = _mig_attributes(inv, gpu, profile)
        attrs["uuid"] = instance.uuid
        capacity = profile.capacities()
        for i in instance.placement.slices:
            capacity[f"{MEMORY_SLICE_CAPACITY}{i}"] = 1
        devices.append(Device(
            name=device_name(gpu.probe.minor, profile, instance.placement),
            group=f"gpu-{gpu.probe.minor}",
            attributes=attrs,
            capacity=capacity,
        ))
    return devices


def _shareable(gpu: GpuRecord, options: ModelOptions) -> bool:
    probe = gpu.probe
    return (options.shareable.covers(probe.minor, probe.uuid)
            and can_share(probe.memory_bytes, probe.multiprocessors))


def _with_share(full: Device, gpu: GpuRecord, counter_set: CounterSet) -> list[Device]:
    """The full GPU, then its shared twin (after it: whole GPUs keep allocation priority)."""
    probe = gpu.probe
    return [full, shared_device(full, probe.minor, probe.memory_bytes, probe.multiprocessors,
                                counter_set)]


def _plain_shared(inv: NodeInventory, gpu: GpuRecord) -> tuple[CounterSet, list[Device]]:
    """A GPU without dynamic MIG that is shareable: one counter keeps whole and shares apart."""
    counter_set = plain_counter_set(gpu.probe.minor)
    full = _full_gpu(inv, gpu, None)
    full = Device(full.name, full.group, full.attributes, full.capacity,
                  consumes_counters=whole_gpu(counter_set))
    return counter_set, _with_share(full, gpu, counter_set)


def _dynamic_mig_devices(
    inv: NodeInventory, gpu: GpuRecord, options: ModelOptions, ordered: list[MigProfile]
) -> tuple[CounterSet, list[Device]]:
    """``placements: all``: the full GPU, its share, every placement; counters between."""
    minor = gpu.probe.minor
    # Counters of the offered profiles only: the same proof (every packing of them and
    # nothing more) holds for any subset, with fewer counters per set.
    counters = gpu_counters(minor, options.mig.chosen_profiles(gpu.mig_profiles))
    counter_set = CounterSet(counters.name, dict(counters.counters))
    full = _full_gpu(inv, gpu, counter_set)
    devices = _with_share(full, gpu, counter_set) if _shareable(gpu, options) else [full]
    for profile in ordered:
        for placement in placement_order(profile):
            devices.append(_dynamic_device(
                inv, gpu=gpu, profile=profile, placement=placement, counter_set=counters.name,
                consumed=consumption(profile, placement, counters)))
    return counter_set, devices


def _disjoint_mig_devices(
    inv: NodeInventory, gpu: GpuRecord, ordered: list[MigProfile]
) -> list[Device]:
    """``placements: disjoint``: placements that never overlap, and nothing else on the GPU
    (no full GPU, no share): any subset of them is a valid packing, so no counters."""
    return [Device(name=device_name(gpu.probe.minor, profile, placement),
                   group=f"gpu-{gpu.probe.minor}",
                   attributes=_mig_attributes(inv, gpu, profile),
                   capacity=profile.capacities())
            for profile, placement in disjoint_set(ordered)]


def _dynamic_device(
    inv: NodeInventory,
    *,
    gpu: GpuRecord,
    profile: MigProfile,
    placement: Placement,
    counter_set: str,
    consumed: dict[str, int],
) -> Device:
    return Device(
        name=device_name(gpu.probe.minor, profile, placement),
        group=f"gpu-{gpu.probe.minor}",
        attributes=_mig_attributes(inv, gpu, profile),
        capacity=profile.capacities(),
        consumes_counters=(CounterConsumption(counter_set, consumed),),
    )


def build_devices(inv: NodeInventory, options: ModelOptions | None = None) -> NodeDevices:
    """All devices of a node, grouped per physical GPU in minor-number order."""
    options = options or ModelOptions()
    devices: list[Device] = []
    counter_sets: list[CounterSet] = []
    groups: list[str] = []
    for gpu in sorted(inv.gpus, key=lambda g: g.probe.minor):
        groups.append(f"gpu-{gpu.probe.minor}")
        offered = _offered(gpu, options)
        if _is_static(gpu, options):
            devices.extend(_static_mig_devices(inv, gpu))
        elif offered and options.mig.placements == "disjoint":
            ordered = disjoint_order(options.mig, gpu.mig_profiles)
            devices.extend(_disjoint_mig_devices(inv, gpu, ordered))
        elif offered:
            counter_set, gpu_devices = _dynamic_mig_devices(inv, gpu, options, offered)
            counter_sets.append(counter_set)
            devices.extend(gpu_devices)
        elif _shareable(gpu, options):
            counter_set, gpu_devices = _plain_shared(inv, gpu)
            counter_sets.append(counter_set)
            devices.extend(gpu_devices)
        else:
            devices.append(_full_gpu(inv, gpu, None))
    built = NodeDevices(tuple(devices), tuple(counter_sets), tuple(groups))
    return built if options.vfio is None else with_vfio_devices(built, inv, options.vfio)
