"""Devices as an older API server can take them: what it lacks is left out, never sent.

A 1.32 or 1.33 cluster (``resource.k8s.io`` v1beta1 / v1beta2) has no partitionable
devices, device taints, consumable capacity or binding conditions
(:data:`gpudra.kube.resource_versions.NEWER_FEATURES`). Sending them would get the slice
rejected or, worse, stored without the field, which changes what it means. So before
slices are built, each device the missing feature would make unsafe is left out, and a
field that is only information is dropped:

* partitionable devices: the counter sets go; per counter set, the first device that
  takes the whole set (the full GPU) stays, without ``consumesCounters``; every other
  device that consumes counters (MIG placements, shares) is left out, since nothing would
  keep it apart from the full GPU any more;
* taints: a device with a ``NoSchedule`` or ``NoExecute`` taint is left out (the scheduler
  could not see that it must not be used); ``None`` taints, information only, are dropped;
* consumable capacity: a multi-allocatable device is left out (it would be allocated whole
  to one claim beside the full GPU it shares), and with it its request policies;
* binding conditions: a device that needs them is left out (the scheduler would bind the
  pod before the device is ready); ``bindsToNode`` is dropped.

Pure: the same devices give the same result, with a summary for the one warning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpudra.driver.devices import CounterSet, Device, NodeDevices
from gpudra.kube.resource_versions import (
    BINDING_CONDITIONS,
    CONSUMABLE_CAPACITY,
    PARTITIONABLE,
    TAINTS,
)


@dataclass(frozen=True)
class LeftOut:
    """What ``supported`` took away, per feature."""

    devices: Mapping[str, int]
    """feature -> devices left out because of it."""
    fields: Mapping[str, int]
    """feature -> devices (or counter sets) that lost a field but are still published."""

    @property
    def features(self) -> frozenset[str]:
        return frozenset(self.devices) | frozenset(self.fields)

    def __bool__(self) -> bool:
        return bool(self.devices or self.fields)


NOTHING = LeftOut({}, {})


def supported(devices: NodeDevices, lacks: Iterable[str]) -> tuple[NodeDevices, LeftOut]:
    """``devices`` without what a server that ``lacks`` these features cannot take."""
    lacking = frozenset(lacks)
    if not lacking:
        return devices, NOTHING
    dropped: Counter[str] = Counter()
    stripped: Counter[str] = Counter()
    whole = _whole_sets(devices.counter_sets) if PARTITIONABLE in lacking else {}
    taken: set[str] = set()
    kept: list[Device] = []
    for device in devices.devices:
        reason = _unsafe(device, lacking, whole, taken)
        if reason is not None:
            dropped[reason] += 1
            continue
        changed = device
        if PARTITIONABLE in lacking and device.consumes_counters:
            taken.update(c.counter_set for c in device.consumes_counters)
            changed = replace(changed, consumes_counters=())
            stripped[PARTITIONABLE] += 1
        if TAINTS in lacking and device.taints:
            changed = replace(changed, taints=())
            stripped[TAINTS] += 1
        if CONSUMABLE_CAPACITY in lacking and device.request_policies:
            changed = replace(changed, request_policies={})
            stripped[CONSUMABLE_CAPACITY] += 1
        if BINDING_CONDITIONS in lacking and device.binds_to_node:
            changed = replace(changed, binds_to_node=False)
            stripped[BINDING_CONDITIONS] += 1
        kept.append(changed)
    counter_sets = devices.counter_sets
    if PARTITIONABLE in lacking and counter_sets:
        counter_sets = ()
    if not dropped and not stripped and counter_sets is devices.counter_sets:
        return devices, NOTHING
    result = replace(devices, devices=tuple(kept), counter_sets=counter_sets)
    return result, LeftOut(dict(dropped), dict(stripped))


def _whole_sets(counter_sets: Iterable[CounterSet]) -> dict[str, Mapping[str, int]]:
    return {cs.name: cs.counters for cs in counter_sets}


def _unsafe(device: Device, lacking: frozenset[str], whole: Mapping[str, Mapping[str, int]],
            taken: set[str]) -> str | None:
    """The feature whose absence makes publishing ``device`` unsafe, or None."""
    if CONSUMABLE_CAPACITY in lacking and device.allow_multiple_allocations:
        return CONSUMABLE_CAPACITY
    if BINDING_CONDITIONS in lacking and (device.binding_conditions
                                          or device.binding_failure_conditions):
        return BINDING_CONDITIONS
    if TAINTS in lacking and any(t.effect != "None" for t in device.taints):
        return TAINTS
    if PARTITIONABLE in lacking and device.consumes_counters:
        for consumption in device.consumes_counters:
            if consumption.counter_set in taken or \
                    dict(consumption.counters) != dict(whole.get(consumption.counter_set, {})):
                return PARTITIONABLE
    return None


def describe(left_out: LeftOut) -> str:
    """One line: what was left out and why, for the warning."""
    parts = []
    for feature in sorted(left_out.features):
        gone, lost = left_out.devices.get(feature, 0), left_out.fields.get(feature, 0)
        said = []
        if gone:
            said.append(f"{gone} device{'s' if gone != 1 else ''} left out")
        if lost:
            said.append(f"{lost} without the field{'s' if lost != 1 else ''}")
        parts.append(f"{feature}: {', '.join(said)}")
    return "; ".join(parts)
