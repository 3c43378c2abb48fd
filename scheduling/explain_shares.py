"""``explain``'s hint for a claim that asks for a share of a GPU where no node offers one.

Shared devices (type ``gpu-share``, class ``gpu-share.nvidia.com``) are published only for
the GPUs a node daemon's ``--shareable-gpus`` names, none by default; without the hint the
answer is a false class selector on every device, which does not say what to change. Read
from the slices alone, so it works on a cluster as on ``--simulate``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.explain_subjects import Subject

SHARE_CLASS = "gpu-share.nvidia.com"
SHARE_TYPE = "gpu-share"


def share_hints(subject: Subject, allocator: Allocator) -> list[str]:
    """One hint when the subject asks for a shared device and no node publishes one."""
    if not _wants_share(subject, allocator) or _published(allocator):
        return []
    return ["no node publishes shared GPUs (devices of type 'gpu-share'): a node daemon "
            "publishes one for each GPU its --shareable-gpus names (none by default; chart "
            "value shareableGpus); explain --simulate takes --shareable-gpus too"]


def _specs(subject: Subject) -> Iterator[Mapping[str, Any]]:
    for claim in subject.claims:
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            yield from request.get("firstAvailable") or [request.get("exactly") or request]


def _wants_share(subject: Subject, allocator: Allocator) -> bool:
    for spec in _specs(subject):
        name = str(spec.get("deviceClassName", ""))
        device_class = allocator.classes.get(name) or {}
        selectors = ((device_class.get("spec") or {}).get("selectors") or []) + (
            spec.get("selectors") or [])
        text = " ".join(str((s.get("cel") or {}).get("expression", "")) for s in selectors)
        if name == SHARE_CLASS or f"'{SHARE_TYPE}'" in text or f'"{SHARE_TYPE}"' in text:
            return True
    return False


def _published(allocator: Allocator) -> bool:
    for pool in allocator.index.pools:
        for obj in pool.slices:
            for device in (obj.get("spec") or {}).get("devices") or []:
                kind = (device.get("attributes") or {}).get("type") or {}
                if isinstance(kind, Mapping) and kind.get("string") == SHARE_TYPE:
                    return True
    return False
