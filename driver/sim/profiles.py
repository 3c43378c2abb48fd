"""The simulator's hardware catalogue: GPU models and node profiles from ``data/*.yaml``.

Everything here is immutable; what changes at run time lives in :mod:`.state`.
"""

from __future__ import annotations

import pkgutil
import re
import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from .codes import BRAND, DEVICE_ARCH

_BUS_ID = re.compile(r"^([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")
_UUID_NAMESPACE = uuid.UUID("6c0f1b9e-5d0a-4a8e-9d53-0a3c5f9b7e21")


@dataclass(frozen=True)
class ComputeInstanceProfile:
    id: int
    slices: int
    max_instances: int
    multiprocessors: int


@dataclass(frozen=True)
class GpuInstanceProfile:
    index: int
    """The ``NVML_GPU_INSTANCE_PROFILE_*`` index; ``id`` is what NVML returns for it."""
    id: int
    name: str
    slices: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg: int
    ofa: int
    max_instances: int
    placement_starts: tuple[int, ...]
    placement_size: int
    create_order: tuple[int, ...]
    compute_profiles: tuple[ComputeInstanceProfile, ...]

    def compute_profile(self, profile_id: int) -> ComputeInstanceProfile | None:
        for ci in self.compute_profiles:
            if ci.id == profile_id:
                return ci
        return None

    def ci_multiprocessors(self, ci: ComputeInstanceProfile) -> int:
        """SMs of a CI in this GI: a full-size CI has all of them (1g.20gb has 26, not 16)."""
        return self.multiprocessors if ci.slices == self.slices else ci.multiprocessors

    def ci_name(self, ci: ComputeInstanceProfile) -> str:
        return self.name if ci.slices == self.slices else f"{ci.slices}c.{self.name}"


@dataclass(frozen=True)
class MigCapability:
    memory_slices: int
    compute_slices: int
    max_gpu_instances: int
    resetless_toggle: bool
    """Hopper and newer switch MIG mode without a GPU reset."""
    profiles: tuple[GpuInstanceProfile, ...]

    def by_index(self, index: int) -> GpuInstanceProfile | None:
        for profile in self.profiles:
            if profile.index == index:
                return profile
        return None

    def by_id(self, profile_id: int) -> GpuInstanceProfile | None:
        for profile in self.profiles:
            if profile.id == profile_id:
                return profile
        return None

    def by_name(self, name: str) -> GpuInstanceProfile | None:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        return None


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str
    brand: int
    architecture: int
    cuda_cc: tuple[int, int]
    memory_mib: int
    multiprocessors: int
    pci_device_id: int
    mig: MigCapability | None


@dataclass(frozen=True)
class PciAddress:
    domain: int
    bus: int
    device: int
    function: int

    @classmethod
    def parse(cls, text: str) -> PciAddress:
        """Parse ``DDDDDDDD:BB:DD.F`` (any domain width); raises ValueError otherwise."""
        match = _BUS_ID.match(text.strip())
        if match is None:
            raise ValueError(f"not a PCI bus id: {text!r}")
        domain, bus, device, function = match.groups()
        return cls(int(domain, 16), int(bus, 16), int(device, 16), int(function))

    @property
    def bus_id(self) -> str:
        return f"{self.domain:08X}:{self.bus:02X}:{self.device:02X}.{self.function}"

    @property
    def bus_id_legacy(self) -> str:
        return f"{self.domain:04X}:{self.bus:02X}:{self.device:02X}.{self.function}"


@dataclass(frozen=True)
class NvLink:
    """One NVLink: the PCI address at its far end and whether a switch sits there."""

    remote: PciAddress
    remote_is_switch: bool
    remote_device_id: int


@dataclass(frozen=True)
class GpuSlot:
    """One GPU as the node profile places it."""

    index: int
    model: GpuModel
    pci: PciAddress
    numa_node: int
    uuid: str
    nvlinks: tuple[NvLink, ...]
    mig_enabled: bool
    mig_instances: tuple[tuple[GpuInstanceProfile, int], ...]
    """Pre-created GPU instances (profile, placement start), each with its full-size CI."""


@dataclass(frozen=True)
class Fabric:
    """What ``nvmlDeviceGetGpuFabricInfo`` answers for every GPU of a multi-node NVLink node."""

    cluster_uuid: str
    clique_id: int
    state: str
    """A ``NVML_GPU_FABRIC_STATE_*`` name: NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED."""
    status: str
    """A return code name (``SUCCESS``…): the probe's outcome, meaningful once COMPLETED."""


@dataclass(frozen=True)
class NodeProfile:
    name: str
    description: str
    driver_version: str
    cuda_driver_version: int
    gpus: tuple[GpuSlot, ...]
    fabric: Fabric | None = None
    """None: no multi-node NVLink (the fabric calls answer NOT_SUPPORTED)."""


def gpu_uuid(profile: str, index: int, board: int = 0) -> str:
    """Deterministic ``GPU-…`` UUID: the same node profile always has the same GPUs, and
    the ``board``-th replacement in a slot its own."""
    name = f"{profile}/{index}" + (f"/board-{board}" if board else "")
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, name)}"


def mig_uuid(parent_uuid: str, gi_id: int, ci_id: int, serial: int) -> str:
    """Deterministic ``MIG-…`` UUID for one created compute instance."""
    return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{parent_uuid}/{gi_id}/{ci_id}/{serial}')}"


def _load(name: str) -> dict[str, Any]:
    # pkgutil, not importlib.resources: the node daemon imports pkgutil anyway (gRPC does),
    # and resources.files() would add importlib's readers and zipfile to its memory.
    raw = pkgutil.get_data(f"{__package__}.data", name)
    if raw is None:
        raise ValueError(f"{name}: no such simulator data file in this installation")
    text = raw.decode("utf-8")
    # libyaml when present: the profiles are long, and the pure-Python parser is slow on them.
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(data, dict) or data.get("schema_version") != 1:
        raise ValueError(f"{name}: expected a mapping with schema_version: 1")
    return data


@cache
def nvml_data() -> dict[str, Any]:
    """The ``nvml:`` section of ``gpus.yaml`` (enumerations the simulator must match)."""
    section: dict[str, Any] = _load("gpus.yaml")["nvml"]
    return section


def _gi_profile(row: dict[str, Any], ci_tables: dict[int, Any]) -> GpuInstanceProfile:
    starts = tuple(int(s) for s in row["placements"]["starts"])
    order = tuple(int(s) for s in row.get("create_order", sorted(starts, reverse=True)))
    if sorted(order) != sorted(starts):
        raise ValueError(f"{row['name']}: create_order must list every placement start once")
    cis = tuple(
        ComputeInstanceProfile(int(c["id"]), int(c["slices"]), int(c["max"]), int(c["sm"]))
        for c in ci_tables[int(row["slices"])]
    )
    return GpuInstanceProfile(
        index=int(row["index"]), id=int(row["id"]), name=str(row["name"]),
        slices=int(row["slices"]), memory_mib=int(row["memory_mib"]),
        multiprocessors=int(row["sm"]), copy_engines=int(row["ce"]), decoders=int(row["dec"]),
        encoders=int(row["enc"]), jpeg=int(row["jpeg"]), ofa=int(row["ofa"]),
        max_instances=int(row["max"]), placement_starts=starts,
        placement_size=int(row["placements"]["size"]), create_order=order,
        compute_profiles=cis,
    )


def _model(key: str, row: dict[str, Any]) -> GpuModel:
    mig = None
    if row.get("mig"):
        m = row["mig"]
        ci_tables = {int(k): v for k, v in m["compute_instance_profiles"].items()}
        mig = MigCapability(
            memory_slices=int(m["memory_slices"]), compute_slices=int(m["compute_slices"]),
            max_gpu_instances=int(m["max_gpu_instances"]),
            resetless_toggle=bool(m["resetless_toggle"]),
            profiles=tuple(_gi_profile(p, ci_tables) for p in m["gpu_instance_profiles"]),
        )
    major, minor = row["cuda_cc"]
    return GpuModel(
        key=key, name=str(row["name"]), brand=BRAND[row["brand"]],
        architecture=DEVICE_ARCH[row["architecture"]], cuda_cc=(int(major), int(minor)),
        memory_mib=int(row["memory_mib"]), multiprocessors=int(row["multiprocessors"]),
        pci_device_id=int(row["pci_device_id"]), mig=mig,
    )


@cache
def _models() -> dict[str, GpuModel]:
    return {key: _model(key, row) for key, row in _load("gpus.yaml")["models"].items()}


def gpu_models() -> list[str]:
    """Keys of every simulated GPU model."""
    return sorted(_models())


def gpu_model(key: str) -> GpuModel:
    try:
        return _models()[key]
    except KeyError:
        raise ValueError(f"unknown GPU model {key!r}; known: {', '.join(gpu_models())}") from None


@cache
def _raw_nodes() -> dict[str, dict[str, Any]]:
    nodes: dict[str, dict[str, Any]] = _load("nodes.yaml")["nodes"]
    return nodes


def node_profiles() -> list[str]:
    """Names of every simulated node profile."""
    return sorted(_raw_nodes())


def _resolve_raw(name: str) -> dict[str, Any]:
    """The node's own fields on top of the node it ``extends``, overrides applied per GPU."""
    raw = _raw_nodes()
    if name not in raw:
        raise ValueError(f"unknown node profile {name!r}; known: {', '.join(node_profiles())}")
    node = dict(raw[name])
    if "extends" in node:
        base = _resolve_raw(node.pop("extends"))
        node = {**base, **node}
    defaults = node.get("gpu_defaults", {})
    gpus = [{**defaults, **gpu} for gpu in node["gpus"]]
    for index, override in node.pop("gpu_overrides", {}).items():
        gpus[int(index)] = {**gpus[int(index)], **override}
    node["gpus"] = gpus
    node["gpu_defaults"] = {}
    return node


def _nvlinks(node: dict[str, Any], gpu: dict[str, Any],
             gpus_by_bus: dict[PciAddress, GpuModel]) -> tuple[NvLink, ...]:
    switches = node.get("nvswitches") or {"bus_ids": [], "pci_device_id": 0}
    switch_addrs = {PciAddress.parse(b) for b in switches["bus_ids"]}
    links: list[NvLink] = []
    for group in gpu.get("nvlinks") or []:
        if "switch" in group:
            remote = PciAddress.parse(group["switch"])
            if remote not in switch_addrs:
                raise ValueError(f"link to {group['switch']}, which is not a listed NVSwitch")
            link = NvLink(remote, True, int(switches["pci_device_id"]))
        else:
            remote = PciAddress.parse(group["gpu"])
            if remote not in gpus_by_bus:
                raise ValueError(f"link to {group['gpu']}, which is not a GPU of this node")
            link = NvLink(remote, False, gpus_by_bus[remote].pci_device_id)
        links.extend([link] * int(group["count"]))
    return tuple(links)


def _mig_instances(model: GpuModel, spec: dict[str, Any]) -> tuple[
        tuple[GpuInstanceProfile, int], ...]:
    instances = []
    for item in spec.get("instances", []):
        name, _, start = str(item).partition("@")
        profile = model.mig.by_name(name) if model.mig else None
        if profile is None:
            raise ValueError(f"{model.key} has no MIG profile {name!r}")
        instances.append((profile, int(start)))
    return tuple(instances)


@cache
def node_profile(name: str) -> NodeProfile:
    """The named node, fully resolved; raises ValueError for an unknown or inconsistent one."""
    node = _resolve_raw(name)
    models = [gpu_model(g["model"]) for g in node["gpus"]]
    addrs = [PciAddress.parse(g["pci_bus_id"]) for g in node["gpus"]]
    if len(set(addrs)) != len(addrs):
        raise ValueError(f"{name}: two GPUs share a PCI bus id")
    by_bus = dict(zip(addrs, models, strict=True))
    slots = []
    for index, (gpu, model, addr) in enumerate(zip(node["gpus"], models, addrs, strict=True)):
        mig = gpu.get("mig") or {}
        if mig.get("enabled") and model.mig is None:
            raise ValueError(f"{name}: GPU {index} ({model.key}) cannot enable MIG")
        slots.append(GpuSlot(
            index=index, model=model, pci=addr, numa_node=int(gpu.get("numa_node", -1)),
            uuid=gpu_uuid(name, index), nvlinks=_nvlinks(node, gpu, by_bus),
            mig_enabled=bool(mig.get("enabled", False)),
            mig_instances=_mig_instances(model, mig),
        ))
    return NodeProfile(
        name=name, description=str(node.get("description", "")),
        driver_version=str(node["driver_version"]),
        cuda_driver_version=int(node["cuda_driver_version"]), gpus=tuple(slots),
        fabric=_fabric(node.get("fabric")),
    )


def _fabric(raw: dict[str, Any] | None) -> Fabric | None:
    if not raw:
        return None
    fabric = Fabric(cluster_uuid=str(uuid.UUID(str(raw["cluster_uuid"]))),
                    clique_id=int(raw["clique_id"]), state=str(raw["state"]),
                    status=str(raw.get("status", "SUCCESS")))
    if fabric.state not in FABRIC_STATES:
        raise ValueError(f"fabric state {fabric.state!r}; known: {', '.join(FABRIC_STATES)}")
    return fabric


FABRIC_STATES = {"NOT_SUPPORTED": 0, "NOT_STARTED": 1, "IN_PROGRESS": 2, "COMPLETED": 3}
"""``nvmlGpuFabricState_t`` (nvml.h)."""
