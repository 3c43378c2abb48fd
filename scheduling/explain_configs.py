"""Opaque configs as the driver reads them at prepare, checked before anything is scheduled.

The scheduler copies configs into the allocation without looking at them, so an invalid
one allocates fine and fails when the pod starts. ``explain`` decodes every config for this
driver (claim and class) with the driver's own decoder, and checks the allocated devices
against the configs that govern them (a ``GpuConfig`` for a MIG device) as prepare does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpudra.scheduling.allocation_state import lookup_attribute
from gpudra.scheduling.allocation_trace import Allocation
from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.claim_requests import request_groups
from gpudra.scheduling.explain_subjects import Subject

# The decoders (gpudra.api.configs, pydantic: slow to import) are imported only when a
# claim or class has a config for this driver; most explained claims have none.

_POSITION = re.compile(r"^claim [^:]*:[^:]*: config\[(\d+)\]")


def parameter_problems(path: str, parameters: Any) -> list[str]:
    """``<path>.<field>: <message>`` for each problem of one opaque config of this driver."""
    from gpudra.api.configs import validate_opaque

    found = []
    for problem in validate_opaque(parameters):
        where, _, message = problem.partition(": ")
        sub = "" if where in ("", "parameters") else f".{where}"
        found.append(f"{path}{sub}: {message or problem}")
    return found


def _ours(config: Any, driver: str) -> Mapping[str, Any] | None:
    """The ``opaque`` of a config entry for this driver, if it is one."""
    opaque = config.get("opaque") if isinstance(config, Mapping) else None
    if isinstance(opaque, Mapping) and opaque.get("driver") == driver:
        return opaque
    return None


def _classes(subject: Subject) -> Iterable[str]:
    for claim in subject.claims:
        for group in request_groups((claim.get("spec") or {}).get("devices") or {}):
            for request in group.alternatives:
                yield request.device_class


def decode_problems(subject: Subject, allocator: Allocator, driver: str) -> list[str]:
    """Every config of the subject's claims and classes this driver cannot decode."""
    found: list[str] = []
    for index, claim in enumerate(subject.claims):
        title, prefix = subject.source(index)
        configs = ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
        for i, config in enumerate(configs):
            opaque = _ours(config, driver)
            if opaque is not None:
                found.extend(f"{title}: {p}" for p in parameter_problems(
                    f"{prefix}.config[{i}].opaque.parameters", opaque.get("parameters")))
    for name in dict.fromkeys(_classes(subject)):
        spec = (allocator.classes.get(name) or {}).get("spec") or {}
        for i, config in enumerate(spec.get("config") or []):
            opaque = _ours(config, driver)
            if opaque is not None:
                found.extend(f"DeviceClass {name}: {p}" for p in parameter_problems(
                    f"spec.config[{i}].opaque.parameters", opaque.get("parameters")))
    return found


def _origins(subject: Subject, allocator: Allocator, driver: str) -> dict[int, str]:
    """Where each config of this driver was written, by the identity of its ``opaque``
    (the allocator copies entries shallowly, so the allocation shares them)."""
    origins: dict[int, str] = {}
    for index, claim in enumerate(subject.claims):
        title, prefix = subject.source(index)
        configs = ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
        for i, config in enumerate(configs):
            opaque = _ours(config, driver)
            if opaque is not None:
                origins[id(opaque)] = f"{title}: {prefix}.config[{i}]"
    for name in dict.fromkeys(_classes(subject)):
        spec = (allocator.classes.get(name) or {}).get("spec") or {}
        for i, config in enumerate(spec.get("config") or []):
            opaque = _ours(config, driver)
            if opaque is not None:
                origins[id(opaque)] = f"DeviceClass {name}: spec.config[{i}]"
    return origins


def device_problems(subject: Subject, allocator: Allocator, allocation: Allocation,
                    driver: str) -> list[str]:
    """Configs that do not fit the devices the allocation chose, as prepare refuses them."""
    entries = allocator.index.entries()
    origins = _origins(subject, allocator, driver)
    found: list[str] = []
    for claim, result in zip(subject.claims, allocation.results or [], strict=False):
        ours = [(position, config, opaque)
                for position, config in enumerate(result["devices"]["config"])
                if (opaque := _ours(config, driver)) is not None]
        if not ours:  # nothing to resolve: no config can misfit a device
            continue
        from gpudra.driver.claims import (
            AllocatedDevice,
            ClaimError,
            ClaimToPrepare,
            OpaqueConfig,
            resolve_configs,
        )

        items = result["devices"]["results"]
        devices = tuple(AllocatedDevice(r["request"], r["pool"], r["device"],
                                        bool(r.get("adminAccess")))
                        for r in items if r["driver"] == driver)
        kinds: dict[str, str] = {}
        for r in items:
            entry = entries.get((r["driver"], r["pool"], r["device"]))
            kind = lookup_attribute(entry, f"{driver}/type") if entry is not None else None
            kinds[r["device"]] = str(kind[1]) if kind is not None else ""
        configs: list[OpaqueConfig] = []
        paths: dict[int, str] = {}
        for position, config, opaque in ours:
            configs.append(OpaqueConfig(tuple(config.get("requests") or ()),
                                        opaque.get("parameters") or {},
                                        str(config.get("source")), position))
            paths[position] = origins.get(
                id(opaque), f"status.allocation.devices.config[{position}]")
        meta = claim.get("metadata") or {}
        try:
            resolve_configs(ClaimToPrepare("", str(meta.get("namespace", "")),
                                           str(meta.get("name", "")), devices, tuple(configs)),
                            kinds)
        except ClaimError as exc:
            match = _POSITION.match(str(exc))
            if match is None:
                found.append(str(exc))
                continue
            found.append(f"{paths.get(int(match.group(1)), '')}: "
                         f"{str(exc)[match.end():].removeprefix(' is ')}")
    return found
