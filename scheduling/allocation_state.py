"""What one allocation tracks while it searches: devices already in use, taints, the counters
its devices take, and the claim's constraints (``k8s.io/dynamic-resource-allocation/structured``).

The pools these refer to are built once, in ``pools``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from gpudra.scheduling.capacity import add, parse_amount
from gpudra.scheduling.pools import Amount, CounterKey, DeviceEntry, DeviceId, PoolIndex


def _allocation_results(allocations: Iterable[Mapping[str, Any]]
                        ) -> Iterable[Mapping[str, Any]]:
    for item in allocations:
        allocation = item if "devices" in item else (item.get("status") or {}).get("allocation")
        if not isinstance(allocation, Mapping):
            continue
        yield from (allocation.get("devices") or {}).get("results") or []


def _result_id(result: Mapping[str, Any]) -> DeviceId:
    return (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))


def allocated_devices(allocations: Iterable[Mapping[str, Any]]) -> set[DeviceId]:
    """Devices in exclusive use by existing ``status.allocation`` results (admin access and
    shares of multi-allocatable devices do not make a device busy).

    Accepts allocation results or whole ResourceClaims (their ``status.allocation``).
    """
    return {_result_id(r) for r in _allocation_results(allocations)
            if not r.get("adminAccess") and not r.get("shareID")}


def shared_consumption(allocations: Iterable[Mapping[str, Any]]
                       ) -> dict[DeviceId, dict[str, Amount]]:
    """Per multi-allocatable device with existing shares: the summed ``consumedCapacity``
    (``AggregatedCapacity``); a device with shares is listed even if they consume nothing."""
    shared: dict[DeviceId, dict[str, Amount]] = {}
    for result in _allocation_results(allocations):
        if not result.get("shareID"):
            continue
        total = shared.setdefault(_result_id(result), {})
        for name, raw in (result.get("consumedCapacity") or {}).items():
            value = parse_amount(raw)
            if value is not None:
                add(total, {str(name): value})
    return shared


def share_ids(allocations: Iterable[Mapping[str, Any]]) -> set[str]:
    return {str(r["shareID"]) for r in _allocation_results(allocations) if r.get("shareID")}


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """``resourceclaim.ToleratesTaint``: effect and key must match when set, then the operator."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return bool((toleration.get("value") or "") == (taint.get("value") or ""))
    return False


def untolerated_taint(taints: Iterable[Mapping[str, Any]],
                      tolerations: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint no toleration covers (effect None never blocks)."""
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return taint
    return None


class CounterShortage(NamedTuple):
    """Why a device's counters do not fit."""

    reason: str
    allocated: bool
    """Devices allocated before this search hold the counters (not the search's own picks):
    the device is unavailable whatever the search does."""


class CounterLedger:
    """Counters taken by the devices of the allocation being searched, per pool."""

    def __init__(self, index: PoolIndex) -> None:
        self._index = index
        self._taken: dict[tuple[str, str], dict[CounterKey, Amount]] = {}

    def take(self, entry: DeviceEntry) -> CounterShortage | None:
        """Take the device's counters, or say which counter would go below zero."""
        consumes = entry.consumes
        if not consumes:
            return None
        available = self._index.available(entry.pool)
        # The scheduler re-checks every counter of the pool; only this device's can change.
        overdrawn = self._index.overdrawn(entry.pool)
        if overdrawn is not None:
            return CounterShortage(overdrawn, True)
        for key, value in consumes:
            if value > available.get(key, 0):
                return CounterShortage(f"counter {key[1]} of set {key[0]} is held by allocated "
                                       f"devices (needs {value}, {available.get(key, 0)} left)",
                                       True)
        taken = self._taken.setdefault(entry.pool.key, {})
        for key, value in consumes:
            have = available.get(key, 0) - taken.get(key, 0)
            if value > have:
                return CounterShortage(f"counter {key[1]} of set {key[0]} would go below zero "
                                       f"(needs {value}, {have} left)", False)
        for key, value in consumes:
            taken[key] = taken.get(key, 0) + value
        return None

    def give_back(self, entry: DeviceEntry) -> None:
        taken = self._taken.get(entry.pool.key, {})
        for key, value in entry.consumes:
            taken[key] = taken.get(key, 0) - value


def lookup_attribute(entry: DeviceEntry, qualified: str) -> tuple[str, Any] | None:
    """``lookupAttribute``: the fully qualified name first, then the bare name if the domain
    is the device's driver. Returned as (type, value) so equal values of different types
    never match."""
    attributes = entry.raw.get("attributes") or {}
    encoded = attributes.get(qualified)
    if encoded is None:
        domain, _, name = qualified.partition("/")
        if domain != entry.pool.driver:
            return None
        encoded = attributes.get(name)
    if not isinstance(encoded, Mapping) or len(encoded) != 1:
        return None
    kind, value = next(iter(encoded.items()))
    return (str(kind), tuple(value) if isinstance(value, list) else value)


class Constraint:
    """One ``spec.devices.constraints[i]``: ``matchAttribute`` or ``distinctAttribute``."""

    def __init__(self, index: int, spec: Mapping[str, Any]) -> None:
        self.index = index
        self.requests = frozenset(str(r) for r in spec.get("requests") or [])
        self.distinct = "distinctAttribute" in spec
        self.attribute = str(spec.get("distinctAttribute" if self.distinct else
                                      "matchAttribute", ""))
        self._values: list[tuple[str, Any]] = []
        # distinctAttribute as the 1.36 scheduler keeps it (incubating/constraint.go,
        # distinctAttributeConstraint: ``attributes map[string]DeviceAttribute`` keyed by the
        # (parent) request name, and ``numDevices``): each device of a request overwrites
        # that request's one entry, and ``remove`` deletes the entry outright. A candidate is
        # therefore only compared with the last device each request took, so a request with
        # count > 1, or requests after it, can be given devices with the same value (two
        # GPUs of one NUMA node under a distinct numaNode). The claim's API contract
        # (DeviceConstraint.distinctAttribute: "unique across those devices") says
        # otherwise; upstream fixed it after 1.36 (kubernetes#140438, #140600). We predict
        # what a 1.36 scheduler does, so we keep its bookkeeping; ``gpudra explain`` cannot
        # tell the scheduler to honour the constraint.
        self._last_by_request: dict[str, tuple[str, Any]] = {}
        self._distinct_devices = 0

    @property
    def label(self) -> str:
        kind = "distinctAttribute" if self.distinct else "matchAttribute"
        return f"constraint #{self.index} {kind} {self.attribute}"

    def applies(self, base: str, full: str) -> bool:
        return not self.requests or base in self.requests or full in self.requests

    def add(self, entry: DeviceEntry, base: str) -> str | None:
        """Record the device, picked for (parent) request ``base``, or say why the
        constraint rejects it."""
        value = lookup_attribute(entry, self.attribute)
        if value is None:
            return f"{self.label}: the device has no such attribute"
        if self.distinct:
            # The first device always fits (numDevices == 0); later ones are compared with
            # the map's entries only. Values of another type never clash.
            if self._distinct_devices and value in self._last_by_request.values():
                return f"{self.label}: value {value[1]!r} is already taken"
            self._last_by_request[base] = value
            self._distinct_devices += 1
            return None
        if self._values and value != self._values[0]:
            return (f"{self.label}: value {value[1]!r} differs from {self._values[0][1]!r} "
                    "of the devices already chosen")
        self._values.append(value)
        return None

    def remove(self, entry: DeviceEntry, base: str) -> None:
        if self.distinct:
            # As the 1.36 remove: the request's entry goes, even when an earlier device of
            # the same request is still chosen.
            self._last_by_request.pop(base, None)
            self._distinct_devices -= 1
            return
        value = lookup_attribute(entry, self.attribute)
        if value is not None and value in self._values:
            # Remove the last occurrence: removals come in reverse order of additions.
            del self._values[len(self._values) - 1 - self._values[::-1].index(value)]
