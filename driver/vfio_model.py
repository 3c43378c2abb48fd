"""The ``vfio`` devices: each full GPU published a second time, for passthrough to a VM.

A GPU is handed out as ``gpu-<minor>`` (to containers, through ``nvidia``) or as
``gpu-vfio-<minor>`` (to a VM, through ``vfio-pci``), never both: the two devices consume
all of one counter set. A GPU that has a counter set already (dynamic MIG, shares) lends it
to its vfio device, which takes what the full GPU takes, so a MIG device or a share excludes
passthrough too; a GPU without one gets a one-counter set that its full GPU and its vfio
device both consume. Static MIG GPUs and ``--dynamic-mig-placements disjoint`` GPUs publish
no full GPU and no vfio device: passing them through would take partitions the scheduler
counts as free.

Pure: the IOMMU groups are read from sysfs once by the caller (:class:`VfioOffer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final

from gpudra.driver.devices import (
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
    NodeDevices,
)
from gpudra.driver.gpu_shares import plain_counter_set, whole_gpu
from gpudra.driver.vfio_sysfs import PciSysfs, sysfs_bus_id

if TYPE_CHECKING:
    from gpudra.driver.inventory import GpuRecord, NodeInventory

VFIO: Final = "vfio"
NAME_PREFIX: Final = "gpu-vfio-"
IOMMU_GROUP: Final = "iommuGroup"
IOMMUFD: Final = "iommuFDEnabled"
PCI_BUS_ID: Final = "resource.kubernetes.io/pciBusID"
PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
NUMA_NODE: Final = "resource.kubernetes.io/numaNode"
ATTRIBUTES: Final[Mapping[str, type[AttributeValue]]] = {
    "type": str, "uuid": str, "productName": str, "brand": str, "architecture": str,
    "numaNode": int, PCI_BUS_ID: str, PCIE_ROOT: str, NUMA_NODE: int, IOMMU_GROUP: int,
    IOMMUFD: bool,
    "vendorID": str, "deviceID": str,
}
"""Every attribute a vfio device may carry (``vendorID``/``deviceID``/``iommuFDEnabled``
as NVIDIA's driver names them); no CUDA or driver versions: a VM brings its own driver."""
CAPACITIES: Final = ("addressableMemory",)


@dataclass(frozen=True)
class VfioOffer:
    """What the node's sysfs says about passthrough, read once at start-up."""

    groups: Mapping[str, int] = field(default_factory=dict)
    """Sysfs bus id → IOMMU group, for every NVIDIA function."""
    ids: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Sysfs bus id → (vendor, device) ids, ``0x10de``-style."""
    iommufd: bool = False

    @classmethod
    def read(cls, sysfs: PciSysfs, bus_ids: list[str], *, iommufd: bool) -> VfioOffer:
        groups: dict[str, int] = {}
        ids: dict[str, tuple[str, str]] = {}
        for bus in bus_ids:
            if not sysfs.exists(bus):
                continue
            group = sysfs.iommu_group(bus)
            if group is not None:
                groups[bus] = group
            vendor, device = sysfs.vendor(bus), sysfs.device_id(bus)
            if vendor is not None and device is not None:
                ids[bus] = (vendor, device)
        return cls(groups, ids, iommufd)


def device_name(minor: int) -> str:
    return f"{NAME_PREFIX}{minor}"


def device_minor(name: str) -> int | None:
    rest = name.removeprefix(NAME_PREFIX)
    return int(rest) if rest != name and rest.isdigit() else None


def with_vfio_devices(devices: NodeDevices, inventory: NodeInventory,
                      offer: VfioOffer) -> NodeDevices:
    """``devices`` plus a vfio device after each full GPU that has an IOMMU group."""
    by_name = {d.name: d for d in devices.devices}
    added: dict[str, Device] = {}
    replaced: dict[str, Device] = {}
    new_sets: list[CounterSet] = []
    for gpu in inventory.gpus:
        full = by_name.get(f"gpu-{gpu.probe.minor}")
        bus = sysfs_bus_id(gpu.probe.pci_bus_id)
        group = offer.groups.get(bus)
        if full is None or group is None:
            continue
        consumes = full.consumes_counters
        if not consumes:
            counter_set = plain_counter_set(gpu.probe.minor)
            new_sets.append(counter_set)
            consumes = whole_gpu(counter_set)
            replaced[full.name] = replace(full, consumes_counters=consumes)
        added[full.name] = _vfio_device(full, gpu, bus, group, offer, consumes=consumes)
    if not added:
        return devices
    out: list[Device] = []
    for device in devices.devices:
        out.append(replaced.get(device.name, device))
    # Last in each GPU's group: the scheduler takes the first fit, and only vfio claims
    # can take it anyway (their DeviceClass selects the type).
    for name, vfio in added.items():
        last = max(i for i, d in enumerate(out) if d.group == by_name[name].group)
        out.insert(last + 1, vfio)
    return replace(devices, devices=tuple(out),
                   counter_sets=devices.counter_sets + tuple(new_sets))


def _vfio_device(full: Device, gpu: GpuRecord, bus: str, group: int, offer: VfioOffer, *,
                 consumes: tuple[CounterConsumption, ...]) -> Device:
    attributes: dict[str, AttributeValue] = {
        key: value for key, value in full.attributes.items() if key in ATTRIBUTES}
    attributes.update({"type": VFIO, IOMMU_GROUP: group, IOMMUFD: offer.iommufd})
    if bus in offer.ids:
        attributes["vendorID"], attributes["deviceID"] = offer.ids[bus]
    return Device(
        name=device_name(gpu.probe.minor), group=full.group, attributes=attributes,
        capacity={"addressableMemory": gpu.probe.memory_bytes},
        consumes_counters=consumes,
        taints=full.taints,
    )
