"""The cluster as the structured allocator sees it: pools, their devices and counters.

Mirrors ``GatherPools`` and the per-pool bookkeeping of the scheduler's allocator
(``k8s.io/dynamic-resource-allocation/structured``): only the newest generation of a pool
counts, a pool is complete when all its ``resourceSliceCount`` slices are there, pools are
ordered by driver then name (pools with binding conditions last), slices by name, devices
as published. Everything here is built once and shared by the allocations of many nodes;
what one allocation takes while it searches is in ``allocation_state``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gpudra.api.quantity import QuantityError, parse_quantity
from gpudra.scheduling.capacity import Capacity, device_capacities
from gpudra.scheduling.cel import DeviceView, device_view

DeviceId = tuple[str, str, str]
"""(driver, pool, device)."""
CounterKey = tuple[str, str]
"""(counter set, counter)."""
Amount = int | Fraction

_amounts: dict[str, Amount] = {}


def amount(encoded: Any) -> Amount:
    """A counter value (``{"value": "80Gi"}``) as an exact number; cached, values repeat a lot."""
    text = str(encoded.get("value", "0") if isinstance(encoded, Mapping) else encoded)
    found = _amounts.get(text)
    if found is None:
        try:
            value = parse_quantity(text)
        except QuantityError:
            value = Fraction(0)
        found = int(value) if value.denominator == 1 else value
        _amounts[text] = found
    return found


class DeviceEntry:
    """One published device in one pool, with what the allocator keeps asking about it."""

    __slots__ = ("_capacities", "_consumes", "id", "per_device_node", "pool", "raw",
                 "slice_name", "view")

    def __init__(self, pool: Pool, slice_name: str, raw: Mapping[str, Any],
                 per_device_node: bool) -> None:
        self.pool = pool
        self.slice_name = slice_name
        self.raw = raw
        self.per_device_node = per_device_node
        self.id: DeviceId = (pool.driver, pool.name, str(raw.get("name", "")))
        self.view: DeviceView = device_view(pool.driver, raw)
        self._consumes: tuple[tuple[CounterKey, Amount], ...] | None = None
        self._capacities: dict[str, Capacity] | None = None

    @property
    def name(self) -> str:
        return self.id[2]

    @property
    def consumes(self) -> tuple[tuple[CounterKey, Amount], ...]:
        """Counters this device takes while allocated (parsed on first use)."""
        if self._consumes is None:
            self._consumes = tuple(
                ((str(use.get("counterSet", "")), name), amount(value))
                for use in self.raw.get("consumesCounters") or ()
                for name, value in sorted((use.get("counters") or {}).items()))
        return self._consumes

    @property
    def multi(self) -> bool:
        """``allowMultipleAllocations``: shares, not exclusive use (KEP-5075)."""
        return self.raw.get("allowMultipleAllocations") is True

    @property
    def capacities(self) -> dict[str, Capacity]:
        if self._capacities is None:
            self._capacities = device_capacities(self.raw)
        return self._capacities

    @property
    def taints(self) -> Sequence[Mapping[str, Any]]:
        return self.raw.get("taints") or ()

    def __repr__(self) -> str:
        return "DeviceEntry({}/{}/{})".format(*self.id)


@dataclass
class Pool:
    """The newest generation of one (driver, pool) with all its slices."""

    driver: str
    name: str
    slices: list[Mapping[str, Any]]
    complete: bool
    invalid: str | None = None
    counter_sets: dict[str, dict[str, Amount]] = field(default_factory=dict)
    binding_conditions: bool = False
    devices_by_slice: dict[str, list[DeviceEntry]] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.driver, self.name)


@dataclass(frozen=True)
class PoolNote:
    """A pool the allocator did not take devices from on this node, and why."""

    driver: str
    pool: str
    kind: str
    """``incomplete`` or ``invalid``."""
    reason: str


@dataclass
class NodePools:
    """What one node can allocate from: usable pools in order, and the rest with reasons."""

    node: str
    pools: list[Pool]
    devices: list[DeviceEntry]
    skipped: list[PoolNote]


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _slice_name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def node_matches(node: str, labels: Mapping[str, str] | None, spec: Mapping[str, Any]) -> bool:
    """``nodeName`` / ``allNodes`` / ``nodeSelector`` of a slice (or device) against one node."""
    if spec.get("nodeName"):
        return bool(spec["nodeName"] == node)
    if spec.get("allNodes"):
        return True
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping):
        return node_selector_matches(selector, node, labels or {})
    return False


def node_selector_matches(selector: Mapping[str, Any], node: str,
                          labels: Mapping[str, str]) -> bool:
    """core/v1 NodeSelector semantics: terms are ORed, requirements within a term ANDed."""
    terms = selector.get("nodeSelectorTerms") or []
    return any(_term_matches(term, node, labels) for term in terms)


def _term_matches(term: Mapping[str, Any], node: str, labels: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    fields_values = {"metadata.name": node}
    return all(_requirement(r, labels) for r in expressions) and all(
        _requirement(r, fields_values) for r in fields)


def _requirement(req: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, op = req.get("key", ""), req.get("operator", "")
    wanted = [str(v) for v in req.get("values") or []]
    present = key in values
    value = values.get(key, "")
    if op == "In":
        return present and value in wanted
    if op == "NotIn":
        return not present or value not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, limit = int(value), int(wanted[0])
        except ValueError:
            return False
        return have > limit if op == "Gt" else have < limit
    return False


def _counter_sets(slices: Iterable[Mapping[str, Any]]) -> tuple[dict[str, dict[str, Amount]],
                                                                  str | None]:
    sets: dict[str, dict[str, Amount]] = {}
    for obj in slices:
        for counter_set in _spec(obj).get("sharedCounters") or []:
            name = str(counter_set.get("name", ""))
            if name in sets:
                return sets, f"duplicate counter set name {name}"
            sets[name] = {k: amount(v) for k, v in (counter_set.get("counters") or {}).items()}
    return sets, None


def _validate_devices(pool: Pool) -> str | None:
    names: set[str] = set()
    checked: set[int] = set()
    for obj in pool.slices:
        for device in _spec(obj).get("devices") or []:
            name = str(device.get("name", ""))
            if name in names:
                return f"duplicate device name {name}"
            names.add(name)
            for use in device.get("consumesCounters") or []:
                if id(use) in checked:  # shared by identical (simulated) nodes
                    continue
                checked.add(id(use))
                counter_set = pool.counter_sets.get(str(use.get("counterSet", "")))
                if counter_set is None:
                    return f"counter set {use.get('counterSet')} not found"
                unknown = (use.get("counters") or {}).keys() - counter_set.keys()
                if unknown:
                    return (f"counter {min(unknown)} not found in counter set "
                            f"{use['counterSet']}")
    return None


_Checked = tuple[list[Any], dict[str, dict[str, Amount]], str | None, bool]
"""What a pool's slices gave: (their lists, kept alive), counter sets, invalid, binding."""


def _build_pool(driver: str, name: str, slices: list[Mapping[str, Any]],
                checked: dict[tuple[int, ...], _Checked]) -> Pool:
    slices = sorted(slices, key=_slice_name)
    wanted = int((_spec(slices[0]).get("pool") or {}).get("resourceSliceCount", 1) or 1)
    pool = Pool(driver, name, slices, complete=len(slices) >= wanted)
    if not pool.complete:
        return pool
    # Identical (simulated) nodes share their slices' device and counter lists: such a
    # pool is parsed and validated once, not once per node.
    lists = [x for obj in slices for x in (_spec(obj).get("devices"),
                                           _spec(obj).get("sharedCounters"))]
    key = tuple(id(x) for x in lists)
    found = checked.get(key)
    if found is None:
        pool.counter_sets, pool.invalid = _counter_sets(slices)
        if pool.invalid is None:
            pool.invalid = _validate_devices(pool)
        pool.binding_conditions = any(
            d.get("bindingConditions") for obj in slices for d in _spec(obj).get("devices") or [])
        checked[key] = (lists, pool.counter_sets, pool.invalid, pool.binding_conditions)
    else:
        _, pool.counter_sets, pool.invalid, pool.binding_conditions = found
    return pool


class PoolIndex:
    """All slices of the cluster grouped into pools, plus the devices already allocated."""

    def __init__(self, slices: Iterable[Mapping[str, Any]],
                 allocated: Iterable[DeviceId] = (),
                 shared: Mapping[DeviceId, Mapping[str, Amount]] | None = None) -> None:
        grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        generations: dict[tuple[str, str], int] = {}
        for obj in slices:
            spec = _spec(obj)
            pool_spec = spec.get("pool") or {}
            key = (str(spec.get("driver", "")), str(pool_spec.get("name", "")))
            generation = int(pool_spec.get("generation", 0) or 0)
            current = generations.get(key)
            if current is None or generation > current:
                generations[key] = generation
                grouped[key] = [obj]
            elif generation == current:
                grouped[key].append(obj)
        checked: dict[tuple[int, ...], _Checked] = {}
        self.pools = [_build_pool(d, p, s, checked) for (d, p), s in sorted(grouped.items())]
        self.allocated: frozenset[DeviceId] = frozenset(allocated)
        self.shared: Mapping[DeviceId, Mapping[str, Amount]] = dict(shared or {})
        """Multi-allocatable devices with existing shares, and what those consume."""
        self._by_node: dict[str, list[Pool]] = {}
        self._other: list[Pool] = []
        for pool in self.pools:
            names = {_spec(s).get("nodeName") for s in pool.slices if _spec(s).get("devices")}
            if len(names) == 1 and None not in names:
                self._by_node.setdefault(str(names.pop()), []).append(pool)
            else:
                self._other.append(pool)
        # The 1.36 allocator (GatherPools) takes every slice with sharedCounters into every
        # node's pools, whatever its node. Such a pool of another node brings no devices, but
        # if it is incomplete or invalid, a request for All devices fails on every node (and
        # an invalid one turns "does not fit" into an error): an upstream quirk we mirror.
        # Only those can change an answer, so only they are kept.
        self._broken_counter_pools = [
            pool for pool in self.pools
            if (not pool.complete or pool.invalid is not None)
            and any(_spec(s).get("sharedCounters") for s in pool.slices)]
        self._available: dict[tuple[str, str], dict[CounterKey, Amount]] = {}
        self._overdrawn: dict[tuple[str, str], str | None] = {}

    def nodes(self) -> list[str]:
        """Nodes that have node-local pools, in name order."""
        return sorted(self._by_node)

    def for_node(self, node: str, labels: Mapping[str, str] | None = None) -> NodePools:
        """The pools and devices the allocator walks for ``node``, in its order."""
        usable: list[tuple[Pool, list[Mapping[str, Any]]]] = []
        skipped: list[PoolNote] = []
        for pool in self._by_node.get(node, []) + self._other:
            targeting = [s for s in pool.slices if self._targets(s, node, labels)]
            if not targeting:
                continue
            if not pool.complete:
                skipped.append(PoolNote(pool.driver, pool.name, "incomplete",
                                        "pool incomplete: only "
                                        f"{len(pool.slices)} of its slices are published"))
                continue
            if pool.invalid is not None:
                skipped.append(PoolNote(pool.driver, pool.name, "invalid",
                                        f"pool invalid: {pool.invalid}"))
                continue
            usable.append((pool, targeting))
        seen = {note.driver + "/" + note.pool for note in skipped}
        seen.update(f"{pool.driver}/{pool.name}" for pool, _ in usable)
        for pool in self._broken_counter_pools:
            if f"{pool.driver}/{pool.name}" in seen:
                continue
            why = (f"only {len(pool.slices)} of its slices are published" if not pool.complete
                   else str(pool.invalid))
            skipped.append(PoolNote(pool.driver, pool.name,
                                    "incomplete" if not pool.complete else "invalid",
                                    f"pool {'incomplete' if not pool.complete else 'invalid'}: "
                                    f"{why} (a pool of other nodes: the scheduler takes every "
                                    "pool with shared counters into every node's allocation)"))
        usable.sort(key=lambda p: (p[0].binding_conditions, p[0].driver, p[0].name))
        devices = [entry for pool, targeting in usable for obj in targeting
                   for entry in self._entries(pool, obj)]
        return NodePools(node, [pool for pool, _ in usable], devices, skipped)

    @staticmethod
    def _targets(obj: Mapping[str, Any], node: str, labels: Mapping[str, str] | None) -> bool:
        spec = _spec(obj)
        if not spec.get("devices"):
            return False
        if spec.get("perDeviceNodeSelection"):
            return any(node_matches(node, labels, d) for d in spec["devices"])
        return node_matches(node, labels, spec)

    @staticmethod
    def _entries(pool: Pool, obj: Mapping[str, Any]) -> list[DeviceEntry]:
        """The slice's devices, made once and shared by every node that sees the slice."""
        name = _slice_name(obj)
        entries = pool.devices_by_slice.get(name)
        if entries is None:
            spec = _spec(obj)
            per_device = bool(spec.get("perDeviceNodeSelection"))
            entries = [DeviceEntry(pool, name, d, per_device) for d in spec.get("devices") or []]
            pool.devices_by_slice[name] = entries
        return entries

    def entries(self) -> dict[DeviceId, DeviceEntry]:
        """Every device entry built so far (by the nodes allocated on), by id."""
        return {entry.id: entry for pool in self.pools
                for entries in pool.devices_by_slice.values() for entry in entries}

    def available(self, pool: Pool) -> dict[CounterKey, Amount]:
        """Shared counters of a pool minus what already-allocated devices consume (cached)."""
        found = self._available.get(pool.key)
        if found is None:
            found = {(s, c): v for s, counters in pool.counter_sets.items()
                     for c, v in counters.items()}
            for obj in pool.slices:
                for device in _spec(obj).get("devices") or []:
                    # A device with shares holds its counters once, however many (KEP-5075,
                    # IsDeviceAllocated); see gpudra.driver.gpu_shares.
                    device_id = (pool.driver, pool.name, str(device.get("name")))
                    if device_id not in self.allocated and device_id not in self.shared:
                        continue
                    for use in device.get("consumesCounters") or []:
                        for counter, value in (use.get("counters") or {}).items():
                            key = (str(use.get("counterSet", "")), counter)
                            if key in found:
                                found[key] -= amount(value)
            self._available[pool.key] = found
            self._overdrawn[pool.key] = next(
                (f"counter {c} of set {s} is already overdrawn by allocated devices"
                 for (s, c), left in found.items() if left < 0), None)
        return found

    def overdrawn(self, pool: Pool) -> str | None:
        """A counter allocated devices already took past zero: no device of the pool fits."""
        self.available(pool)
        return self._overdrawn[pool.key]
