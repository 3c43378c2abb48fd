"""``explain``'s hint for a MIG request that finds no MIG device on an A100/A30 whose MIG mode
is off: the node does not switch it (a switch needs a GPU reset) unless its admin allows it.

Read from the slices alone, so it works on a cluster as on ``--simulate``: a full GPU whose
``architecture`` is Ampere (the MIG-capable GPUs that need a reset to switch MIG mode) and
that no MIG device names as its ``parentUUID`` publishes no MIG devices at all, static or
made on demand. Which of the node's settings withholds them the slices cannot say, so the
hint names both (``gpudra.driver.mig_offer``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.explain_subjects import Subject

MIG_CLASS = "mig.nvidia.com"
AMPERE = "Ampere"


def mig_mode_hints(subject: Subject, allocator: Allocator) -> list[str]:
    """One hint per node with such GPUs, when the subject asks for a MIG device."""
    if not _wants_mig(subject, allocator):
        return []
    hints = []
    for pool in allocator.index.pools:
        withheld = _ampere_without_mig(_devices(pool.slices))
        if withheld:
            hints.append(
                f"node {pool.name}: {', '.join(withheld)} (A100/A30, MIG mode off) publish no "
                "MIG devices: switching MIG mode on them needs a GPU reset, which the node "
                "makes only on GPUs its admin allows (gpudra node --allow-mig-mode-change, "
                "chart dynamicMig.allowModeChange) and that offer dynamic MIG "
                "(--dynamic-mig-gpus); or an admin enables MIG mode on them")
    return hints


def _wants_mig(subject: Subject, allocator: Allocator) -> bool:
    for claim in subject.claims:
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            for spec in request.get("firstAvailable") or [request.get("exactly") or request]:
                name = str(spec.get("deviceClassName", ""))
                if name == MIG_CLASS or "'mig'" in _selectors_text(spec, allocator, name) \
                        or '"mig"' in _selectors_text(spec, allocator, name):
                    return True
    return False


def _selectors_text(spec: Mapping[str, Any], allocator: Allocator, class_name: str) -> str:
    device_class = allocator.classes.get(class_name) or {}
    selectors = ((device_class.get("spec") or {}).get("selectors") or []) + (
        spec.get("selectors") or [])
    return " ".join(str((s.get("cel") or {}).get("expression", "")) for s in selectors)


def _devices(slices: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [device for obj in slices
            for device in ((obj.get("spec") or {}).get("devices") or [])]


def _string(device: Mapping[str, Any], name: str) -> str:
    value = (device.get("attributes") or {}).get(name) or {}
    return str(value.get("string", "")) if isinstance(value, Mapping) else ""


def _ampere_without_mig(devices: list[Mapping[str, Any]]) -> list[str]:
    parents = {_string(d, "parentUUID") for d in devices if _string(d, "type") == "mig"}
    return [str(d.get("name", "")) for d in devices
            if _string(d, "type") == "gpu" and _string(d, "architecture") == AMPERE
            and _string(d, "uuid") not in parents]
