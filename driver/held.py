"""Hardware held for someone the daemon cannot name (pure): what it is, why, how it is
published (a ``NoSchedule`` taint on every device sharing it), which claims it refuses, and
when it is released.

:mod:`gpudra.driver.recovery` finds it when a checkpoint cannot be read; it is kept in
``held-unknown.json`` in the driver's data directory across restarts, and never destroyed
by the daemon: the operator decides (README, "Operations"). An entry is released once its
hardware is back to baseline (the MIG device destroyed, the compute mode ``Default``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from gpudra.driver.devices import NodeDevices, Taint
from gpudra.driver.mig import Placement
from gpudra.driver.nvml import COMPUTE_MODE_DEFAULT
from gpudra.driver.prepare_plan import DynamicMigTarget, GpuTarget, StaticMigTarget, Target
from gpudra.driver.survivors import GpuHardware

HELD_TAINT: Final = "gpu.nvidia.com/held-unknown"
"""``NoSchedule`` on every device that shares hardware with something held."""
HELD_FILE: Final = "held-unknown.json"
"""In the driver's data directory: the held set, kept across restarts."""

HeldKind = Literal["mig", "compute-mode", "share", "device"]


@dataclass(frozen=True)
class HeldDevice:
    """Hardware held for someone the daemon cannot name: never destroyed, never reused."""

    kind: HeldKind
    reason: str
    gpu: str | None = None
    """The physical GPU; ``None`` when not even that is known (a spec's unknown device)."""
    minor: int | None = None
    mig_uuid: str | None = None
    gpu_instance_id: int | None = None
    placement: Placement | None = None
    claim: str | None = None
    """The claim UID when a spec names one."""

    @property
    def what(self) -> str:
        """How log lines, Events and ``/readyz`` name it."""
        if self.kind == "mig" and self.placement is not None:
            return (f"MIG device {self.mig_uuid} (memory slices {self.placement.start}-"
                    f"{self.placement.start + self.placement.size - 1}) on gpu-{self.minor}")
        if self.gpu is not None:
            return f"gpu-{self.minor} ({self.gpu})"
        return f"claim {self.claim}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "reason": self.reason}
        for key, value in (("gpu", self.gpu), ("minor", self.minor),
                           ("migUUID", self.mig_uuid), ("gpuInstanceId", self.gpu_instance_id),
                           ("claim", self.claim)):
            if value is not None:
                out[key] = value
        if self.placement is not None:
            out["placement"] = {"start": self.placement.start, "size": self.placement.size}
        return out

    @classmethod
    def from_json(cls, raw: object, where: str) -> HeldDevice:
        """Raises :class:`ValueError` naming ``where`` and the field."""
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: expected an object")
        kind = raw.get("kind")
        if kind not in ("mig", "compute-mode", "share", "device"):
            raise ValueError(f"{where}.kind: expected mig, compute-mode, share or device")
        placement = raw.get("placement")
        if placement is not None:
            if not (isinstance(placement, dict) and _is_int(placement.get("start"))
                    and _is_int(placement.get("size"))):
                raise ValueError(f"{where}.placement: expected {{start, size}} integers")
            placement = Placement(placement["start"], placement["size"])
        values: dict[str, Any] = {}
        for key, name, kind_ok in (("gpu", "gpu", str), ("minor", "minor", int),
                                   ("migUUID", "mig_uuid", str),
                                   ("gpuInstanceId", "gpu_instance_id", int),
                                   ("claim", "claim", str), ("reason", "reason", str)):
            value = raw.get(key)
            if value is not None and (not isinstance(value, kind_ok) or isinstance(value, bool)):
                expected = "a string" if kind_ok is str else "an integer"
                raise ValueError(f"{where}.{key}: expected {expected}")
            values[name] = value
        return cls(kind=kind, placement=placement, **{**values, "reason": values["reason"] or ""})


def still_held(held: Iterable[HeldDevice], gpus: Sequence[GpuHardware]) -> tuple[
        tuple[HeldDevice, ...], tuple[HeldDevice, ...]]:
    """(kept, released): an entry is released once its hardware is back to baseline (the
    operator destroyed the MIG device, or put the compute mode back), or its GPU is gone."""
    by_uuid = {g.uuid: g for g in gpus}
    kept: list[HeldDevice] = []
    released: list[HeldDevice] = []
    for h in held:
        gpu = by_uuid.get(h.gpu or "")
        if h.kind == "mig":
            there = gpu is not None and any(i.uuid == h.mig_uuid for i in gpu.mig_instances)
        elif h.kind in ("compute-mode", "share"):
            there = gpu is not None and gpu.compute_mode != COMPUTE_MODE_DEFAULT
        else:
            there = False  # a spec's unknown device: said once, nothing on hardware to keep
        (kept if there else released).append(h)
    return tuple(kept), tuple(released)


def kept_mig_instances(held: Iterable[HeldDevice]) -> set[tuple[str, int]]:
    """(parent, GPU instance id) of held MIG devices: start-up clean-up must skip them."""
    return {(h.gpu, h.gpu_instance_id) for h in held
            if h.kind == "mig" and h.gpu is not None and h.gpu_instance_id is not None}


def held_mig_uuids(held: Iterable[HeldDevice]) -> set[str]:
    """Held MIG devices' UUIDs: their GPU stays published as dynamic MIG (tainted)."""
    return {h.mig_uuid for h in held if h.kind == "mig" and h.mig_uuid}


def conflict(held: Iterable[HeldDevice], target: Target, admin_access: bool) -> HeldDevice | None:
    """The held entry a device about to be prepared would share hardware with; admin access
    only observes, so it never conflicts."""
    if admin_access:
        return None
    parent = parent_of(target)
    for h in held:
        if h.gpu != parent:
            continue
        if h.kind != "mig" or h.placement is None:
            return h  # the whole GPU is held
        if isinstance(target, DynamicMigTarget):
            if target.placement.overlaps(h.placement):
                return h
        elif isinstance(target, StaticMigTarget):
            if target.uuid == h.mig_uuid:
                return h
        else:
            return h  # a full GPU (or a share of it) includes the held MIG device
    return None


def with_held_taints(devices: NodeDevices, held: Sequence[HeldDevice],
                     targets: Mapping[str, Target], since: str) -> NodeDevices:
    """``devices`` with ``HELD_TAINT`` (``NoSchedule``) on each that shares hardware with
    something held; ``since`` is the taint's ``timeAdded``."""
    if not held:
        return devices
    taint = Taint(HELD_TAINT, "", "NoSchedule", since)
    tainted = []
    for device in devices.devices:
        target = targets.get(device.name)
        hit = target is not None and conflict(held, target, admin_access=False) is not None
        if hit and all(t.key != HELD_TAINT for t in device.taints):
            tainted.append(replace(device, taints=(*device.taints, taint)))
        else:
            tainted.append(device)
    return replace(devices, devices=tuple(tainted))


def summary(held: Sequence[HeldDevice]) -> list[str]:
    """One line per held entry, for ``/readyz`` and the Event."""
    return [f"held: {h.what}: {h.reason}" for h in held]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def held_document(held: Sequence[HeldDevice]) -> bytes:
    return (json.dumps({"held": [h.to_json() for h in held]}, indent=1) + "\n").encode()


def parse_held(content: bytes, where: str) -> tuple[HeldDevice, ...]:
    """The held file; :class:`ValueError` naming ``where`` and the field."""
    try:
        doc = json.loads(content)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{where}: not valid JSON") from exc
    entries = doc.get("held") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{where}: expected {{\"held\": [...]}}")
    return tuple(HeldDevice.from_json(raw, f"{where}: held[{i}]") for i, raw in enumerate(entries))




def parent_of(target: Target | None) -> str:
    """The physical GPU a target is on."""
    if isinstance(target, GpuTarget):
        return target.uuid
    if target is None:
        return ""
    return target.parent_uuid
