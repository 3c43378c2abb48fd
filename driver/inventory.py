"""Read the node's GPUs through the NVML seam into a plain inventory record.

One GPU that cannot be read (lost, or failing) degrades only itself: it is left out of
``gpus`` and listed in ``unavailable`` with what NVML still says about it, so the node's
other GPUs are published and the missing one can be added when it answers again
(:func:`with_answering_gpus`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpudra.driver.mig import MigProfile
from gpudra.driver.nvml import (
    GpuProbe,
    MigInstance,
    MigMode,
    NvLink,
    Nvml,
    NvmlError,
    UnreadableGpu,
)

PcieRootResolver = Callable[[str], str | None]


@dataclass(frozen=True)
class GpuRecord:
    """Everything the device model needs to know about one full GPU."""

    probe: GpuProbe
    pcie_root: str | None
    nvlink_domain: str | None
    mig_mode: MigMode | None
    """``None`` when the GPU cannot do MIG."""
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    nvlinks: tuple[NvLink, ...] = ()
    """Kept to work out NVLink domains again when another GPU joins later."""

    @property
    def mig_capable(self) -> bool:
        return self.mig_mode is not None and bool(self.mig_profiles)


@dataclass(frozen=True)
class NodeInventory:
    driver_version: str
    cuda_driver_version: int
    gpus: tuple[GpuRecord, ...] = field(default=())
    unavailable: tuple[UnreadableGpu, ...] = field(default=())
    """GPUs NVML enumerates but that could not be read: not published."""


def sysfs_pcie_root(bus_id: str, sysfs: Path = Path("/sys")) -> str | None:
    """The PCIe root complex (``pci0000:00``) above a device, read from sysfs."""
    try:
        real = Path(os.path.realpath(sysfs / "bus" / "pci" / "devices" / bus_id))
    except OSError:
        return None
    for part in real.parts:
        if part.startswith("pci") and ":" in part:
            return part
    return None


def simulated_pcie_root(bus_id: str) -> str:
    """A stand-in root complex for simulated GPUs: one per 16 PCI buses.

    Simulated nodes have no sysfs; this keeps the attribute present and gives GPUs on
    nearby buses a shared root, as on real servers where a root port feeds a switch.
    """
    domain, bus, _ = bus_id.split(":", 2)
    return f"pci{domain}:{int(bus, 16) & 0xF0:02x}"


def nvlink_domains(links: dict[str, list[tuple[str, bool]]]) -> dict[str, str]:
    """NVLink domain per GPU bus id: GPUs joined by NVLink directly or through NVSwitches.

    ``links`` maps a GPU bus id to ``(remote bus id, remote is a switch)`` pairs. A domain
    is named after what NVLink joins in it, by PCI bus id: its NVSwitches, or without
    switches its GPUs' slots and the remote ends of their links.
    Not after the GPUs it holds: when one goes missing (fallen off the bus, pulled out) the
    others keep their domain, so a claim's ``matchAttribute`` on it still holds for them and
    their slices do not all change; a GPU replaced in its slot joins the same domain. The
    same slots on another node give the same name: a claim's devices are on one node, where
    names are distinct. GPUs with no NVLink peer get no domain.
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    for gpu, remotes in links.items():
        find(gpu)
        for remote, is_switch in remotes:
            union(gpu, ("switch:" if is_switch else "") + remote)
    members: dict[str, list[str]] = {}
    for gpu in links:
        members.setdefault(find(gpu), []).append(gpu)
    joined: dict[str, set[str]] = {}
    for node in list(parent):
        joined.setdefault(find(node), set()).add(node)
    domains: dict[str, str] = {}
    for root, gpus in members.items():
        if len(gpus) < 2:
            continue
        # Through NVSwitches: the switches alone (a GPU's own slot leaves with the GPU);
        # direct links: every slot they join, the remote ends included.
        switches = {n for n in joined[root] if n.startswith("switch:")}
        digest = hashlib.sha256(",".join(sorted(switches or joined[root])).encode()).hexdigest()
        for gpu in gpus:
            domains[gpu] = f"nvl-{digest[:12]}"
    return domains


def read_inventory(nvml: Nvml, *, pcie_root: PcieRootResolver = sysfs_pcie_root) -> NodeInventory:
    """Probe every GPU: identity, topology, MIG mode, MIG profiles and live MIG devices."""
    records: list[GpuRecord] = []
    unavailable: list[UnreadableGpu] = []
    for found in nvml.probe_all():
        record = _read(nvml, found, pcie_root)
        if isinstance(record, GpuRecord):
            records.append(record)
        else:
            unavailable.append(record)
    return NodeInventory(
        driver_version=nvml.driver_version(),
        cuda_driver_version=nvml.cuda_driver_version(),
        gpus=_with_nvlink_domains(records),
        unavailable=tuple(unavailable),
    )


def with_answering_gpus(
    nvml: Nvml, inventory: NodeInventory, *, pcie_root: PcieRootResolver = sysfs_pcie_root,
) -> NodeInventory:
    """``inventory`` plus those of its unavailable GPUs that can be read now; ``inventory``
    itself when none can. The other GPUs are not read again."""
    records = list(inventory.gpus)
    still: list[UnreadableGpu] = []
    for gpu in inventory.unavailable:
        record: GpuRecord | UnreadableGpu = gpu
        if gpu.uuid is not None:  # without a UUID there is nothing to ask NVML for
            record = _read(nvml, nvml.probe_gpu(gpu.index, gpu.uuid), pcie_root)
        if isinstance(record, GpuRecord):
            records.append(record)
        else:
            still.append(record)
    if len(records) == len(inventory.gpus):
        return inventory
    return replace(inventory, gpus=_with_nvlink_domains(records), unavailable=tuple(still))


def _read(
    nvml: Nvml, found: GpuProbe | UnreadableGpu, pcie_root: PcieRootResolver,
) -> GpuRecord | UnreadableGpu:
    if isinstance(found, UnreadableGpu):
        return found
    try:
        return _record(nvml, found, pcie_root(found.pci_bus_id))
    except NvmlError as exc:
        return UnreadableGpu(found.index, found.uuid, found.minor, found.pci_bus_id,
                             exc.is_gpu_lost, f"reading GPU {found.index} failed: {exc}")


def _record(nvml: Nvml, probe: GpuProbe, root: str | None) -> GpuRecord:
    links = tuple(nvml.nvlinks(probe.uuid))
    mode = nvml.mig_mode(probe.uuid)
    profiles: Iterable[MigProfile] = ()
    instances: Iterable[MigInstance] = ()
    if mode is not None:
        profiles = nvml.mig_profiles(probe.uuid, probe.memory_bytes)
        instances = nvml.mig_instances(probe.uuid)
    return GpuRecord(probe, root, None, mode, tuple(profiles), tuple(instances), links)


def _with_nvlink_domains(records: Iterable[GpuRecord]) -> tuple[GpuRecord, ...]:
    records = sorted(records, key=lambda r: r.probe.index)
    links = {r.probe.pci_bus_id: [(link.remote_bus_id, link.remote_is_switch)
                                  for link in r.nvlinks] for r in records}
    domains = nvlink_domains(links)
    return tuple(replace(r, nvlink_domain=domains.get(r.probe.pci_bus_id)) for r in records)
