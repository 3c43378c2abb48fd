"""Read the node's GPUs through the NVML seam into a plain inventory record."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpudra.driver.mig import MigProfile
from gpudra.driver.nvml import GpuProbe, MigInstance, MigMode, Nvml

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

    @property
    def mig_capable(self) -> bool:
        return self.mig_mode is not None and bool(self.mig_profiles)


@dataclass(frozen=True)
class NodeInventory:
    driver_version: str
    cuda_driver_version: int
    gpus: tuple[GpuRecord, ...] = field(default=())


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


def nvlink_domains(
    links: dict[str, list[tuple[str, bool]]], uuids: dict[str, str]
) -> dict[str, str]:
    """NVLink domain per GPU bus id: GPUs joined by NVLink directly or through NVSwitches.

    ``links`` maps a GPU bus id to ``(remote bus id, remote is a switch)`` pairs and
    ``uuids`` maps GPU bus ids to UUIDs. A domain is named after the sorted UUIDs of its
    GPUs, so it is stable across restarts and distinct across nodes. GPUs with no NVLink
    peer get no domain.
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
    domains: dict[str, str] = {}
    for gpus in members.values():
        if len(gpus) < 2:
            continue
        digest = hashlib.sha256(",".join(sorted(uuids[g] for g in gpus)).encode()).hexdigest()
        for gpu in gpus:
            domains[gpu] = f"nvl-{digest[:12]}"
    return domains


def read_inventory(nvml: Nvml, *, pcie_root: PcieRootResolver = sysfs_pcie_root) -> NodeInventory:
    """Probe every GPU: identity, topology, MIG mode, MIG profiles and live MIG devices."""
    probes = nvml.probe_all()
    links = {
        p.pci_bus_id: [(link.remote_bus_id, link.remote_is_switch) for link in nvml.nvlinks(p.uuid)]
        for p in probes
    }
    domains = nvlink_domains(links, {p.pci_bus_id: p.uuid for p in probes})
    return NodeInventory(
        driver_version=nvml.driver_version(),
        cuda_driver_version=nvml.cuda_driver_version(),
        gpus=tuple(_record(nvml, p, pcie_root(p.pci_bus_id), domains.get(p.pci_bus_id))
                   for p in probes),
    )


def _record(nvml: Nvml, probe: GpuProbe, root: str | None, domain: str | None) -> GpuRecord:
    mode = nvml.mig_mode(probe.uuid)
    profiles: Iterable[MigProfile] = ()
    instances: Iterable[MigInstance] = ()
    if mode is not None:
        profiles = nvml.mig_profiles(probe.uuid, probe.memory_bytes)
        instances = nvml.mig_instances(probe.uuid)
    return GpuRecord(probe, root, domain, mode, tuple(profiles), tuple(instances))
