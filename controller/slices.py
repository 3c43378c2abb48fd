"""Devices → ResourceSlice objects: plain dicts in the ``resource.k8s.io/v1`` JSON shape.

The layout's contract: what one node publishes must not make the scheduler's per-node work
grow with the cluster (DESIGN, round 3).

- Why it matters: the 1.36 allocator (``k8s.io/dynamic-resource-allocation/structured``,
  incubating ``NewAllocator`` and ``GatherPools``) files every slice with ``sharedCounters``
  as shared, whatever its ``nodeName``, and gathers it for EVERY node's Filter. There that
  other node's pool is incomplete (its device slices do not target the node filtered), so
  ``checkSlicesInPool`` scans all slices of the cluster for it, and ``buildPool`` converts
  and validates all of that pool's devices and counters. One Filter therefore costs
  (nodes publishing counters) times (slices in the cluster + one pool's devices and
  attributes). No layout with counters escapes it: ``buildPool`` reads a slice with
  counters as counters only (never its devices), and a pool's ``resourceSliceCount`` is one
  number for every node, so the pool looks incomplete to every other node. Upstream master
  (kubernetes#138917, in 1.37.0-alpha.1) gathers a counters slice only for its own node.
- So what is published by default has no counter set: full GPUs (and admin-made MIG
  devices) only. Dynamic MIG and shares, which need counters to keep a full GPU, its MIG
  placements and its shares apart, are the admin's choice per GPU (``--dynamic-mig-gpus``,
  ``--dynamic-mig-profiles``, ``--shareable-gpus``); each node that takes them adds its
  pool to every node's Filter (bench/RESULTS.md, "Scheduler scale").
- ``--dynamic-mig-placements disjoint`` offers MIG with no counters: per GPU a fixed set
  of placements that never overlap (and no full GPU there), each made when prepared. Any
  subset is a packing the hardware accepts, so no counter rule is needed, and the cost is
  the node's own devices only: flat in the cluster's size.

Layout of the node's pool (one pool, named after the node):

1. Counters-only slices, first: every ``sharedCounters`` set in one slice (several only past
   8 sets per slice). Devices of other slices reference them by counter set name.
2. One device slice per physical GPU group, in ``NodeDevices.groups`` order, devices in the
   order given (the scheduler takes the first fit, so device order is allocation priority).
   A change on one GPU (inventory, taint, health) therefore rewrites one slice. A group over
   the per-slice device limit (128, or 64 once any device in the slice has taints or
   consumes counters) is cut into consecutive chunks.
3. A node without devices or counters still publishes one empty slice, so the pool exists
   and the scheduler sees it complete.

Slice names are deterministic: ``<node>-<driver>-counters[-<n>]`` and
``<node>-<driver>-<group>[-<n>]``. The scheduler orders a pool's slices by name, so GPU
slices are ordered lexicographically (``gpu-10`` before ``gpu-2``), not numerically. We keep
the group name verbatim anyway: a zero-padded or positional name would change when a GPU
appears or disappears, and would then rewrite other GPUs' slices; cross-GPU priority is not
something we promise. Names over 253 characters keep their suffix, shorten the node/driver
part and end in 8 hex digits of the full name's sha256, so they stay unique and stable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpudra.api.api_limits import (
    DNS1123_SUBDOMAIN_MAX_LENGTH,
    RESOURCE_SLICE_MAX_COUNTER_SETS,
    RESOURCE_SLICE_MAX_DEVICES,
    RESOURCE_SLICE_MAX_DEVICES_WITH_ADVANCED_FEATURES,
)
from gpudra.api.quantity import format_quantity
from gpudra.driver.devices import (
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
    NodeDevices,
    RequestPolicy,
    Taint,
    Version,
)

API_VERSION: Final = "resource.k8s.io/v1"
KIND: Final = "ResourceSlice"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "gpudra"
COUNTERS_SUFFIX: Final = "counters"
UNGROUPED_SUFFIX: Final = "devices"
"""Slice name suffix for devices whose ``group`` is empty."""
_HASH_LENGTH: Final = 8


@dataclass(frozen=True)
class OwnerRef:
    """The object the slices belong to (the Node), so node deletion garbage-collects them."""

    name: str
    uid: str
    api_version: str = "v1"
    kind: str = "Node"

    def to_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
        }


def build_slices(
    devices: NodeDevices,
    *,
    driver: str,
    node_name: str,
    generation: int = 1,
    owner: OwnerRef | None = None,
) -> list[dict[str, Any]]:
    """The node's whole pool as ResourceSlice dicts, in a fixed order (see module docstring).

    Pure and deterministic: the same devices always give equal output. Nothing is validated
    here beyond layout; run ``slice_validation.ensure_valid`` before sending. Equal leaves
    (``{"string": "Hopper"}``, ``{"value": "1"}``) are one shared dict (:class:`_Leaves`):
    read the output, or copy it before changing it.
    """
    parts: list[tuple[str, dict[str, Any]]] = []
    leaves = _Leaves()
    sets = devices.counter_sets
    for n, start in enumerate(range(0, len(sets), RESOURCE_SLICE_MAX_COUNTER_SETS)):
        chunk = sets[start : start + RESOURCE_SLICE_MAX_COUNTER_SETS]
        parts.append((_numbered(COUNTERS_SUFFIX, n),
                      {"sharedCounters": _counter_sets(chunk, leaves)}))
    for group, members in _grouped(devices):
        for n, device_chunk in enumerate(_device_chunks(members)):
            body = {"devices": [encode_device(d, leaves) for d in device_chunk]}
            parts.append((_numbered(group or UNGROUPED_SUFFIX, n), body))
    if not parts:
        # An empty pool is still a pool: publish it so the scheduler knows it is complete.
        parts.append(("", {}))

    names = [slice_name(node_name, driver, suffix) for suffix, _ in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"slice names collide: {sorted(names)} (group names clash)")
    pool = {"name": node_name, "generation": generation, "resourceSliceCount": len(parts)}
    return [
        _slice(name, driver=driver, node_name=node_name, pool=pool, body=body, owner=owner)
        for name, (_, body) in zip(names, parts, strict=True)
    ]


def slice_list(slices: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A ``v1 List`` of the slices, for ``kubectl apply -f`` or ``kubectl diff -f``."""
    return {"apiVersion": "v1", "kind": "List", "items": [dict(s) for s in slices]}


def slice_name(node_name: str, driver: str, suffix: str = "") -> str:
    """``<node>-<driver>[-<suffix>]``, lowercase, at most 253 characters, unique per input."""
    full = f"{node_name}-{driver}".lower() + (f"-{suffix.lower()}" if suffix else "")
    if len(full) <= DNS1123_SUBDOMAIN_MAX_LENGTH:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_LENGTH]
    tail = (f"-{suffix.lower()}" if suffix else "") + f"-{digest}"
    # Strip separators at the cut so the name stays a valid DNS subdomain.
    head = f"{node_name}-{driver}".lower()[: DNS1123_SUBDOMAIN_MAX_LENGTH - len(tail)]
    return head.rstrip("-.") + tail


def _numbered(suffix: str, n: int) -> str:
    return suffix if n == 0 else f"{suffix}-{n}"


def _grouped(devices: NodeDevices) -> list[tuple[str, list[Device]]]:
    """Devices per group: declared groups first, in order; undeclared ones as first seen."""
    by_group: dict[str, list[Device]] = {group: [] for group in devices.groups}
    for device in devices.devices:
        by_group.setdefault(device.group, []).append(device)
    # A declared GPU without devices gets no slice: there is nothing to allocate from it.
    return [(group, members) for group, members in by_group.items() if members]


def _is_advanced(device: Device) -> bool:
    return bool(device.taints or device.consumes_counters)


def _device_chunks(devices: Sequence[Device]) -> list[list[Device]]:
    """Consecutive chunks, each as long as the apiserver allows for what it contains."""
    chunks: list[list[Device]] = []
    current: list[Device] = []
    advanced = False
    for device in devices:
        would_be_advanced = advanced or _is_advanced(device)
        limit = RESOURCE_SLICE_MAX_DEVICES
        if would_be_advanced:
            limit = RESOURCE_SLICE_MAX_DEVICES_WITH_ADVANCED_FEATURES
        if current and len(current) + 1 > limit:
            chunks.append(current)
            current, would_be_advanced = [], _is_advanced(device)
        current.append(device)
        advanced = would_be_advanced
    if current:
        chunks.append(current)
    return chunks


def _slice(
    name: str,
    *,
    driver: str,
    node_name: str,
    pool: Mapping[str, Any],
    body: Mapping[str, Any],
    owner: OwnerRef | None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}}
    if owner is not None:
        metadata["ownerReferences"] = [owner.to_dict()]
    spec: dict[str, Any] = {"driver": driver, "nodeName": node_name, "pool": dict(pool)}
    spec.update(body)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


# --- encoding -------------------------------------------------------------------------------
# Map keys are emitted sorted, as Go's JSON encoder (and so the apiserver) returns them.


class _Leaves:
    """The one-key leaf dicts of one build, each made once per distinct value and shared.

    A pool has thousands of them (dozens per device) but few distinct ones. A pool built
    as separate dicts is large, and the daemon's memory keeps its high-water mark (CPython
    keeps freed memory for reuse), so a smaller build is a smaller daemon.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, type, object], dict[str, Any]] = {}
        self._quantities: dict[int, str] = {}

    def leaf(self, key: str, value: object) -> dict[str, Any]:
        """``{key: value}``; the type is part of the identity (``1`` and ``True`` differ)."""
        identity = (key, type(value), value)
        found = self._seen.get(identity)
        if found is None:
            found = self._seen[identity] = {key: value}
        return found

    def quantity(self, value: int) -> dict[str, Any]:
        """``{"value": <quantity>}``."""
        text = self._quantities.get(value)
        if text is None:
            text = self._quantities[value] = format_quantity(value)
        return self.leaf("value", text)


def _attribute(value: AttributeValue) -> tuple[str, object]:
    """The one field of a ``DeviceAttribute``; ``bool`` is tested before ``int`` since it is
    one in Python."""
    if isinstance(value, bool):
        return "bool", value
    if isinstance(value, int):
        return "int", value
    if isinstance(value, str):
        return "string", value
    if isinstance(value, Version):
        return "version", value.value
    raise TypeError(f"unsupported attribute value {value!r} ({type(value).__name__})")


def encode_attribute(value: AttributeValue) -> dict[str, Any]:
    """One ``DeviceAttribute``."""
    key, encoded = _attribute(value)
    return {key: encoded}


def _quantities(values: Mapping[str, int], leaves: _Leaves) -> dict[str, dict[str, Any]]:
    return {name: leaves.quantity(values[name]) for name in sorted(values)}


def _capacities(device: Device, leaves: _Leaves) -> dict[str, dict[str, Any]]:
    out = _quantities(device.capacity, leaves)
    for name, policy in device.request_policies.items():
        if name in out:  # a dict of its own: the quantity leaf is shared
            out[name] = {**out[name], "requestPolicy": _request_policy(policy)}
    return out


def _request_policy(policy: RequestPolicy) -> dict[str, Any]:
    return {"default": format_quantity(policy.default),
            "validRange": {"max": format_quantity(policy.maximum),
                           "min": format_quantity(policy.minimum),
                           "step": format_quantity(policy.step)}}


def _counter_sets(counter_sets: Iterable[CounterSet], leaves: _Leaves) -> list[dict[str, Any]]:
    return [{"name": cs.name, "counters": _quantities(cs.counters, leaves)}
            for cs in counter_sets]


def _consumption(consumption: CounterConsumption, leaves: _Leaves) -> dict[str, Any]:
    return {"counterSet": consumption.counter_set,
            "counters": _quantities(consumption.counters, leaves)}


def _taint(taint: Taint) -> dict[str, Any]:
    out: dict[str, Any] = {"key": taint.key}
    # ``value`` is omitempty in the API: an empty one would never come back from the server.
    if taint.value:
        out["value"] = taint.value
    out["effect"] = taint.effect
    if taint.time_added is not None:
        out["timeAdded"] = taint.time_added
    return out


def encode_device(device: Device, leaves: _Leaves | None = None) -> dict[str, Any]:
    """One ``Device``; empty maps and lists are left out, as the apiserver would store it.
    Leaves are shared with the rest of the build given ``leaves``, else with nothing."""
    if leaves is None:
        leaves = _Leaves()
    out: dict[str, Any] = {"name": device.name}
    if device.allow_multiple_allocations:
        out["allowMultipleAllocations"] = True
    if device.attributes:
        attributes = device.attributes
        out["attributes"] = {key: leaves.leaf(*_attribute(attributes[key]))
                             for key in sorted(attributes)}
    if device.capacity:
        out["capacity"] = _capacities(device, leaves)
    if device.consumes_counters:
        out["consumesCounters"] = [_consumption(c, leaves) for c in device.consumes_counters]
    if device.taints:
        out["taints"] = [_taint(t) for t in device.taints]
    if device.binds_to_node:
        out["bindsToNode"] = True
    if device.binding_conditions:
        out["bindingConditions"] = list(device.binding_conditions)
    if device.binding_failure_conditions:
        out["bindingFailureConditions"] = list(device.binding_failure_conditions)
    return out
