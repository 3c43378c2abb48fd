"""``explain`` names what holds a GPU, not the first counter of its set that ran out.

A full GPU, its MIG placements, its shared device (``gpu-N-shared``) and its passthrough
device (``gpu-vfio-N``) all consume one counter set per GPU. When one of them holds the GPU,
the allocator reports the first counter it checked that ran short (``counter copy-engines
of set gpu-0-counter-set is held by allocated devices``), which names an engine the user
never asked about. Here each such reason is rewritten to name the devices that consume the
set: the allocated ones (another claim's share, MIG device or VM's GPU), or those the other
requests of the same claim take.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpudra.scheduling.allocation_trace import Allocation, DeviceOutcome, RequestTrace, is_usable
from gpudra.scheduling.allocator import Allocator

_HELD = re.compile(r"counter \S+ of set (\S+) is held by allocated devices \([^)]*\)")
_BELOW_ZERO = re.compile(r"counter \S+ of set (\S+) would go below zero \([^)]*\)")

_COUNTER_CODES = frozenset({"allocated", "counters"})
"""Outcome codes of a counter held by allocated devices, or taken in the search."""

Pool = tuple[str, str]
"""(driver, pool name)."""


def name_holders(allocations: Iterable[Allocation], allocator: Allocator) -> None:
    """Rewrite counter reasons in place (outcomes and the blocking line) to name holders."""
    pools: dict[Pool, Mapping[str, Mapping[str, Any]]] = {}

    def devices(pool: Pool) -> Mapping[str, Mapping[str, Any]]:
        found = pools.get(pool)
        if found is None:
            found = _pool_devices(allocator, pool)
            pools[pool] = found
        return found

    for allocation in allocations:
        rewritten: dict[str, str] = {}
        for trace in allocation.requests:
            for i, outcome in enumerate(trace.outcomes):
                # Only these codes carry counter reasons: the rest (nearly all, on a big
                # cluster) is skipped without a regex.
                if outcome.code not in _COUNTER_CODES:
                    continue
                reason = _rewrite(outcome, trace, allocation.requests, allocator, devices)
                if reason is not None:
                    rewritten[outcome.reason] = reason
                    trace.outcomes[i] = outcome._replace(reason=reason)
        if allocation.blocking:
            for old, new in rewritten.items():
                allocation.blocking = allocation.blocking.replace(old, new)


def _rewrite(outcome: DeviceOutcome, trace: RequestTrace, traces: Sequence[RequestTrace],
             allocator: Allocator, devices: Any) -> str | None:
    held = _HELD.fullmatch(outcome.reason)
    below = None if held else _BELOW_ZERO.fullmatch(outcome.reason)
    if held is None and below is None:
        return None
    driver, pool, _ = outcome.device
    raw = devices((driver, pool))
    if held is not None:
        counter_set = held.group(1)
        index = allocator.index
        names = [name for name in raw if (driver, pool, name) in index.allocated
                 or (driver, pool, name) in index.shared]
        holders = [n for n in names if counter_set in _sets(raw[n])]
        if not holders:
            return None
        return (f"held by allocated {_describe(holders, raw)} "
                f"(the same GPU: counter set {counter_set})")
    assert below is not None
    counter_set = below.group(1)
    taken: dict[str, str] = {}
    for other in traces:
        if other is trace:
            continue
        for o in other.outcomes:
            name = o.device[2]
            if o.device[:2] == (driver, pool) and is_usable(o) and name in raw \
                    and counter_set in _sets(raw[name]):
                taken.setdefault(name, other.request)
    if not taken:
        return None
    requests = sorted(set(taken.values()))
    many = len(requests) > 1
    return (f"held by {_describe(list(taken), raw)}, which request{'s' if many else ''} "
            f"{', '.join(requests)} {'take' if many else 'takes'} "
            f"(the same GPU: counter set {counter_set})")


def _describe(names: Sequence[str], raw: Mapping[str, Mapping[str, Any]]) -> str:
    """``shared device gpu-0-shared``, ``MIG devices a, b``, ``GPU gpu-0``, by type."""
    by_type: dict[str, list[str]] = {}
    for name in names:
        by_type.setdefault(_type(raw[name]), []).append(name)
    parts = []
    for kind, label in (("gpu-share", "shared device"), ("mig", "MIG device"), ("gpu", "GPU"),
                        ("vfio", "vfio device")):
        found = sorted(by_type.pop(kind, []))
        if found:
            shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
            parts.append(f"{label}{'s' if len(found) > 1 else ''} {shown}")
            if kind == "vfio":  # say what it means: the GPU itself went to a VM
                parts[-1] += " (the GPU is taken as vfio: passed through to a VM)"
    for found in by_type.values():
        parts.append("device" + ("s " if len(found) > 1 else " ") + ", ".join(sorted(found)))
    return " and ".join(parts)


def _pool_devices(allocator: Allocator, pool: Pool) -> dict[str, Mapping[str, Any]]:
    for candidate in allocator.index.pools:
        if (candidate.driver, candidate.name) == pool:
            return {str(device.get("name")): device for obj in candidate.slices
                    for device in ((obj.get("spec") or {}).get("devices") or [])}
    return {}


def _sets(device: Mapping[str, Any]) -> set[str]:
    return {str(use.get("counterSet", "")) for use in device.get("consumesCounters") or []}


def _type(device: Mapping[str, Any]) -> str:
    value = (device.get("attributes") or {}).get("type") or {}
    return str(value.get("string", "")) if isinstance(value, Mapping) else ""
