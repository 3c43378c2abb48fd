"""Pool-wide checks: the scheduler's view of a driver's ResourceSlices, not the apiserver's.

The apiserver accepts each slice on its own; a pool that fails here is one the scheduler
skips as invalid or incomplete.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def pool_problems(slices: list[Obj]) -> list[str]:
    """What makes the scheduler treat a pool as invalid, for slices of one driver.

    The apiserver accepts each slice on its own; these cross-slice rules (duplicate device
    names or counter sets in a pool, references to unknown counter sets or counters) are
    checked by the scheduler. Only slices of the newest generation of each pool count.
    """
    pools: dict[tuple[str, str], list[Obj]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        pools.setdefault((spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")),
                         []).append(spec)
    problems: list[str] = []
    for (driver, pool), specs in sorted(pools.items()):
        newest = max((sp.get("pool") or {}).get("generation", 0) for sp in specs)
        current = [sp for sp in specs if (sp.get("pool") or {}).get("generation", 0) == newest]
        where = f"pool {driver}/{pool}"
        expected = (current[0].get("pool") or {}).get("resourceSliceCount", 0)
        if len(current) != expected:
            problems.append(f"{where}: {len(current)} slices of generation {newest}, "
                            f"resourceSliceCount says {expected}")
        counter_sets: dict[str, set[str]] = {}
        devices: set[str] = set()
        for sp in current:
            for cs in sp.get("sharedCounters") or []:
                if cs.get("name") in counter_sets:
                    problems.append(f"{where}: duplicate counter set {cs.get('name')!r}")
                counter_sets[cs.get("name")] = set(cs.get("counters") or {})
            for dev in sp.get("devices") or []:
                if dev.get("name") in devices:
                    problems.append(f"{where}: duplicate device name {dev.get('name')!r}")
                devices.add(dev.get("name"))
        for sp in current:
            for dev in sp.get("devices") or []:
                for use in dev.get("consumesCounters") or []:
                    known = counter_sets.get(use.get("counterSet"))
                    if known is None:
                        problems.append(f"{where}: device {dev.get('name')!r} consumes unknown "
                                        f"counter set {use.get('counterSet')!r}")
                        continue
                    for counter in sorted(set(use.get("counters") or {}) - known):
                        problems.append(f"{where}: device {dev.get('name')!r} consumes unknown "
                                        f"counter {use.get('counterSet')}/{counter}")
    return problems
