"""A reference copy of the kube-scheduler's structured allocator, with a trace of its choices.

For the claims of one pod and one node it finds the devices the scheduler would (first
fit, depth-first backtracking over claims, requests and ``firstAvailable`` subrequests,
the same order of checks) and returns ``status.allocation``-shaped results, or the
scheduler's error (a CEL runtime error aborts the allocation, as on a real cluster), plus
a trace that says, for every device and request, whether it was chosen and otherwise why.

The claim's requests are read in ``claim_requests``, the pools in ``pools``, and the trace
types are in ``allocation_trace``. What stays here is one thing: the search,
a recursion over state shared by all its steps (``_Run``), kept in one file so its order
of checks can be read next to the scheduler's.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpudra.api.api_limits import ALLOCATION_RESULTS_MAX_SIZE
from gpudra.scheduling.allocation_state import (
    Constraint,
    CounterLedger,
    allocated_devices,
    shared_consumption,
    untolerated_taint,
)
from gpudra.scheduling.allocation_trace import (
    SEARCH_CONFLICTS,
    Allocation,
    AllocationError,
    DeviceOutcome,
    RequestTrace,
    shortfall,
)
from gpudra.scheduling.capacity import Amount, add, render
from gpudra.scheduling.capacity import check as check_capacity
from gpudra.scheduling.cel import CelCompileError, Selector, compile_selector
from gpudra.scheduling.claim_requests import Request, RequestGroup, claim_label, request_groups
from gpudra.scheduling.pools import DeviceEntry, DeviceId, NodePools, PoolIndex, node_matches


class _TooMany(Exception):
    """``errAllocationResultMaxSizeExceeded``: backtrack to the nearest subrequest choice."""


@dataclass(frozen=True)
class _Verdict:
    code: str = ""
    reason: str = ""

    @property
    def matches(self) -> bool:
        return not self.code


_MATCH = _Verdict()
_ALLOCATED = _Verdict("allocated", "already allocated")
_IN_CLAIM = _Verdict("in-claim", "already chosen for this pod's claims")


@dataclass(frozen=True)
class _Check:
    """One compiled selector with the verdicts it gives (``selector`` None: did not compile)."""

    selector: Selector | None
    false: _Verdict
    error: _Verdict


class _Claim:
    """One claim being allocated: its requests, constraints and the devices picked so far."""

    def __init__(self, claim: Mapping[str, Any]) -> None:
        self.source = claim
        self.label = claim_label(claim)
        devices = (claim.get("spec") or {}).get("devices") or {}
        self.groups = request_groups(devices)
        self.constraints = [Constraint(i, c) for i, c in
                            enumerate(devices.get("constraints") or [])]
        self.configs: Sequence[Mapping[str, Any]] = devices.get("config") or []
        self.results: list[tuple[Request, DeviceEntry]] = []
        self.consumed: list[dict[str, Amount] | None] = []
        """Per result: what a share of a multi-allocatable device consumes (else None)."""
        self.selected: dict[int, int] = {}

    def chosen_requests(self) -> list[Request]:
        return [g.alternatives[self.selected.get(gi, 0)] for gi, g in enumerate(self.groups)]


Key = tuple[int, int, int]
"""(claim, request, subrequest) indices."""


# --- the allocator ----------------------------------------------------------------------

class Allocator:
    """Cluster state (slices, classes, existing allocations), reusable for many nodes."""

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]],
        device_classes: Iterable[Mapping[str, Any]],
        allocations: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        allocations = list(allocations)
        self.index = PoolIndex(slices, allocated_devices(allocations),
                               shared_consumption(allocations))
        self.classes = {str((c.get("metadata") or {}).get("name", "")): c
                        for c in device_classes}
        self.verdicts: dict[tuple[int, str, str, int], tuple[Any, Any, _Verdict]] = {}
        """Selector and taint verdicts by (claim, request, driver, device dict): identical
        nodes share device dicts, so a claim explained on a thousand of them evaluates its
        CEL once per distinct device. The value keeps both dicts alive (ids stay unique)."""

    def nodes(self) -> list[str]:
        """Nodes with node-local pools, by name."""
        return self.index.nodes()

    def allocate(self, claims: Mapping[str, Any] | Sequence[Mapping[str, Any]], node: str,
                 labels: Mapping[str, str] | None = None) -> Allocation:
        """Allocate one claim, or all claims of a pod together, on ``node``."""
        batch = [claims] if isinstance(claims, Mapping) else list(claims)
        return _Run(self, batch, node, labels).run()


def allocate(
    slices: Iterable[Mapping[str, Any]],
    device_classes: Iterable[Mapping[str, Any]],
    allocations: Iterable[Mapping[str, Any]],
    claim: Mapping[str, Any],
    node: str,
) -> Allocation:
    """One-shot form of :class:`Allocator`."""
    return Allocator(slices, device_classes, allocations).allocate(claim, node)


class _Run:
    """One allocation attempt: per-request data, the search, then results and trace."""

    def __init__(self, allocator: Allocator, claims: list[Mapping[str, Any]], node: str,
                 labels: Mapping[str, str] | None) -> None:
        self.allocator = allocator
        self.index = allocator.index
        self.claims = [_Claim(c) for c in claims]
        self.node = node
        self.labels = labels
        self.pools: NodePools = self.index.for_node(node, labels)
        self.devices = self.pools.devices
        self.positions = {entry.id: i for i, entry in enumerate(self.devices)}
        self.verdicts: dict[Key, list[_Verdict]] = {}
        self.all_devices: dict[Key, list[DeviceEntry]] = {}
        self.traces: dict[Key, RequestTrace] = {}
        self.dynamic: dict[Key, dict[DeviceId, _Verdict]] = {}
        self.allocating: dict[DeviceId, set[int]] = {}
        self.sharing: dict[DeviceId, int] = {}
        """Shares of multi-allocatable devices the search has picked, per device."""
        self.consuming: dict[DeviceId, dict[str, Amount]] = {}
        """What those shares consume (``allocatingCapacity``)."""
        self.ledger = CounterLedger(self.index)
        self.too_many = False

    # --- selection: computed once per (device, request) -----------------------------------

    def _compiled(self, claim: _Claim, request: Request,
                  device_class: Mapping[str, Any]) -> list[_Check]:
        """The class selectors, then the request's, compiled once per (sub)request."""
        checks: list[_Check] = []
        class_selectors = [str((s.get("cel") or {}).get("expression", ""))
                           for s in (device_class.get("spec") or {}).get("selectors") or []]
        for owner, code, expressions in (
                (f"class {request.device_class}", "class-selector", class_selectors),
                (f"claim {claim.label}", "request-selector", request.selectors)):
            who = owner if code == "class-selector" else "request"
            for i, expression in enumerate(expressions):
                try:
                    selector = compile_selector(expression)
                except CelCompileError as exc:
                    failed = _Verdict("cel-error",
                                      f"{owner}: selector #{i}: CEL compile error: {exc}")
                    checks.append(_Check(None, failed, failed))
                    continue
                checks.append(_Check(
                    selector, _Verdict(code, f"{who} selector #{i} is false"),
                    _Verdict("cel-error", f"{owner}: selector #{i}: CEL runtime error: ")))
        return checks

    def _verdict(self, request: Request, checks: list[_Check], entry: DeviceEntry) -> _Verdict:
        """``isSelectable`` (selectors in order, then per-device node selection), then taints."""
        view = entry.view
        for check in checks:
            if check.selector is None:
                return check.false
            result = check.selector.result(view)
            if result is True:
                continue
            if result is False:
                return check.false
            return _Verdict("cel-error", check.error.reason + str(result))
        if entry.per_device_node and not node_matches(self.node, self.labels, entry.raw):
            return _Verdict("wrong-node", "device is not available on this node")
        if request.tolerations or entry.raw.get("taints"):
            taint = untolerated_taint(entry.taints, request.tolerations)
            if taint is not None:
                return _Verdict("taint", "taint {}={}:{} not tolerated".format(
                    taint.get("key", ""), taint.get("value", ""), taint.get("effect", "")))
        return _MATCH

    def _verdicts(self, claim: _Claim, request: Request, checks: list[_Check]) -> list[_Verdict]:
        cache = self.allocator.verdicts
        claim_id = id(claim.source)
        out = []
        for entry in self.devices:
            if entry.per_device_node:  # depends on the node: not shared
                out.append(self._verdict(request, checks, entry))
                continue
            key = (claim_id, request.name, entry.pool.driver, id(entry.raw))
            found = cache.get(key)
            if found is None:
                verdict = self._verdict(request, checks, entry)
                cache[key] = (claim.source, entry.raw, verdict)
            else:
                verdict = found[2]
            out.append(verdict)
        return out

    def _prepare(self) -> None:
        """``validateDeviceRequest`` for every (sub)request, in order; errors abort."""
        for ci, claim in enumerate(self.claims):
            minimum = 0
            for gi, group in enumerate(claim.groups):
                counts = []
                for ai, request in enumerate(group.alternatives):
                    counts.append(self._prepare_request(ci, gi, ai, claim, request))
                minimum += min(counts) if counts else 0
            if minimum > ALLOCATION_RESULTS_MAX_SIZE:
                raise AllocationError(
                    f"claim {claim.label}: number of requested devices {minimum} exceeds the "
                    f"claim limit of {ALLOCATION_RESULTS_MAX_SIZE}")

    def _prepare_request(self, ci: int, gi: int, ai: int, claim: _Claim,
                         request: Request) -> int:
        key = (ci, gi, ai)
        self.traces[key] = RequestTrace(claim.label, request.name, request.device_class,
                                        request.wanted)
        self.dynamic[key] = {}
        device_class = self.allocator.classes.get(request.device_class)
        if device_class is None:
            raise AllocationError(
                f"claim {claim.label}, request {request.name}: could not retrieve device "
                f"class {request.device_class}: deviceclass.resource.k8s.io "
                f"\"{request.device_class}\" not found")
        checks = self._compiled(claim, request, device_class)
        self.traces[key].expressions = {c.false.reason: c.selector.expression
                                        for c in checks if c.selector is not None}
        self.verdicts[key] = self._verdicts(claim, request, checks)
        if not request.all_mode:
            return request.count
        for note in self.pools.skipped:
            state = {"incomplete": "being updated", "invalid": "invalid"}.get(note.kind)
            if state is not None:
                raise AllocationError(
                    f"claim {claim.label}, request {request.name}: asks for all devices, "
                    f"but resource pool {note.driver}/{note.pool} is currently {state}")
        chosen = []
        for entry, verdict in zip(self.devices, self.verdicts[key], strict=True):
            if verdict.code == "cel-error":
                raise AllocationError(verdict.reason)
            # "All" picks by selectors and capacity (what existing allocations leave);
            # in-use and taints are checked when allocating.
            if (verdict.matches or verdict.code == "taint") and self._fits_now(request, entry):
                chosen.append(entry)
        self.all_devices[key] = chosen
        return len(chosen)

    def _fits_now(self, request: Request, entry: DeviceEntry) -> bool:
        """The capacity check before the search (nothing picked yet)."""
        if not request.capacity and not entry.multi:
            return True
        return check_capacity(entry.name, entry.pool.driver, entry.capacities,
                              requested=request.capacity,
                              allocated=self.index.shared.get(entry.id, {}),
                              allocating={}).fits

    # --- the search (allocateOne / allocateDevice) ----------------------------------------

    def _in_use(self, ci: int, request: Request, entry: DeviceEntry) -> _Verdict | None:
        if entry.multi and not request.admin_access:
            # Shares never make a multi-allocatable device busy; capacity decides.
            return _ALLOCATED if entry.id in self.index.allocated else None
        users = self.allocating.get(entry.id)
        if request.admin_access:
            return _IN_CLAIM if users and ci in users else None
        if entry.id in self.index.allocated:
            return _ALLOCATED
        return _IN_CLAIM if users else None

    def _capacity(self, key: Key, request: Request, entry: DeviceEntry
                  ) -> tuple[bool, dict[str, Amount] | None]:
        """``CmpRequestOverCapacity``: (fits, what a share consumes)."""
        if not request.capacity and not entry.multi:
            return True, None  # nothing asked of an exclusive device: always fits
        fit = check_capacity(entry.name, entry.pool.driver, entry.capacities,
                             requested=request.capacity,
                             allocated=self.index.shared.get(entry.id, {}),
                             allocating=self.consuming.get(entry.id, {}))
        if not fit.fits:
            code = "capacity" if fit.held else "capacity-search"
            self.dynamic[key][entry.id] = _Verdict(code, fit.reason)
            return False, None
        return True, (fit.consumed if entry.multi else None)

    def _holds_counters(self, entry: DeviceEntry) -> bool:
        """Whether taking the device takes its counters: always for exclusive devices, for a
        multi-allocatable one only with its first share (counted once, see gpu_shares)."""
        return not entry.multi or (entry.id not in self.index.shared
                                   and not self.sharing.get(entry.id))

    def _take(self, key: Key, request: Request, entry: DeviceEntry, must: bool) -> bool:
        ci = key[0]
        claim = self.claims[ci]
        busy = self._in_use(ci, request, entry)
        if busy is not None:
            self.dynamic[key][entry.id] = busy
            return False
        fits, consumed = self._capacity(key, request, entry)
        if not fits:
            return False
        counted = self._holds_counters(entry)
        shortage = self.ledger.take(entry) if counted else None
        if shortage is not None:
            # Counters held by existing allocations make the device unavailable, like the
            # device itself being allocated; the search's own picks only make it a conflict.
            code = "allocated" if shortage.allocated else "counters"
            self.dynamic[key][entry.id] = _Verdict(code, shortage.reason)
            return False
        # Upstream quirk we mirror (1.36 allocateDevice): a device turned down for a taint
        # or a constraint after its counters were checked keeps them taken until this
        # allocation ends, so later requests may find the counters short.
        static = self.verdicts[key][self.positions[entry.id]]
        if static.code == "taint":
            self.dynamic[key][entry.id] = static
            return False
        added: list[Constraint] = []
        for constraint in claim.constraints:
            if not constraint.applies(request.base, request.name):
                continue
            rejected = constraint.add(entry, request.base)
            if rejected is None:
                added.append(constraint)
                continue
            for done in added:
                done.remove(entry, request.base)
            if must:
                raise AllocationError(
                    f"claim {claim.label}, request {request.name}: cannot add device "
                    "{}/{}/{} because a claim constraint would not be satisfied".format(
                        *entry.id))
            self.dynamic[key][entry.id] = _Verdict("constraint", rejected)
            return False
        if consumed is not None:
            self.sharing[entry.id] = self.sharing.get(entry.id, 0) + 1
            add(self.consuming.setdefault(entry.id, {}), consumed)
        else:
            self.allocating.setdefault(entry.id, set()).add(ci)
        claim.results.append((request, entry))
        claim.consumed.append(consumed)
        return True

    def _give_back(self, ci: int, request: Request, entry: DeviceEntry) -> None:
        claim = self.claims[ci]
        for constraint in claim.constraints:
            if constraint.applies(request.base, request.name):
                constraint.remove(entry, request.base)
        claim.results.pop()
        consumed = claim.consumed.pop()
        if consumed is not None:
            self.sharing[entry.id] -= 1
            add(self.consuming[entry.id], consumed, -1)
            if self.sharing[entry.id] == 0:
                # Upstream quirk we mirror (1.36 allocateDevice's rollback gives counters
                # back for exclusive devices only): the counters the first share took stay
                # taken until this allocation ends.
                del self.sharing[entry.id]
            return
        self.ledger.give_back(entry)
        users = self.allocating[entry.id]
        users.discard(ci)
        if not users:
            del self.allocating[entry.id]

    def _one(self, key: Key, di: int, start: int, in_sub: bool) -> bool:
        """Find a device for slot ``di`` of (sub)request ``key``, then the rest; True when done."""
        ci, gi, ai = key
        if ci >= len(self.claims):
            return True
        claim = self.claims[ci]
        if gi >= len(claim.groups):
            try:
                return self._one((ci + 1, 0, 0), 0, 0, False)
            except _TooMany:
                # Another choice in this claim may let the next one use a smaller subrequest.
                return False
        group = claim.groups[gi]
        if group.first_available and not in_sub:
            return self._first_available(ci, gi, claim, group)
        request = group.alternatives[ai]
        self.traces[key].tried = True
        needed = len(self.all_devices[key]) if request.all_mode else request.count
        if request.all_mode and needed == 0:
            return False
        if di >= needed:
            return self._one((ci, gi + 1, 0), 0, 0, False)
        if len(claim.results) + needed - di > ALLOCATION_RESULTS_MAX_SIZE:
            self.too_many = True
            raise _TooMany
        if request.all_mode:
            entry = self.all_devices[key][di]
            if not self._take(key, request, entry, must=True):
                return False
            return self._continue(key, di, 0, in_sub, request=request, entry=entry)
        verdicts = self.verdicts[key]
        # Combinations, not permutations: devices before ``start`` were tried in this slot.
        for position in range(start, len(self.devices)):
            entry = self.devices[position]
            busy = self._in_use(ci, request, entry)
            if busy is not None:
                if busy is _IN_CLAIM:
                    self.dynamic[key][entry.id] = busy
                continue
            verdict = verdicts[position]
            if verdict.code == "cel-error":
                raise AllocationError(verdict.reason)
            if not verdict.matches and verdict.code != "taint":
                continue
            if not self._take(key, request, entry, must=False):
                continue
            if self._continue(key, di, position + 1, in_sub, request=request, entry=entry):
                return True
        return False

    def _first_available(self, ci: int, gi: int, claim: _Claim, group: RequestGroup) -> bool:
        all_too_many = True
        for alternative in range(len(group.alternatives)):
            try:
                done = self._one((ci, gi, alternative), 0, 0, True)
            except _TooMany:
                continue
            all_too_many = False
            if done:
                claim.selected[gi] = alternative
                return True
        if all_too_many:
            raise _TooMany
        return False

    def _continue(self, key: Key, di: int, start: int, in_sub: bool, *, request: Request,
                  entry: DeviceEntry) -> bool:
        """Recurse to the next slot; undo this device unless that finished everything."""
        ci = key[0]
        try:
            done = self._one(key, di + 1, start, in_sub)
        except BaseException:
            self._give_back(ci, request, entry)
            raise
        if not done:
            self._give_back(ci, request, entry)
        return done

    # --- putting it together ------------------------------------------------------------

    def run(self) -> Allocation:
        error: str | None = None
        done = False
        try:
            self._prepare()
            try:
                done = self._one((0, 0, 0), 0, 0, False)
            except _TooMany:
                done = False
        except AllocationError as exc:
            error = str(exc)
        if not done and error is None and any(n.kind == "invalid" for n in self.pools.skipped):
            error = "invalid resource pools were encountered"
        results = [self._result(claim) for claim in self.claims] if done else None
        traces = self._traces(done)
        allocation = Allocation(self.node, [c.label for c in self.claims], results, error,
                                traces, self.pools.skipped)
        if results is None and error is None:
            allocation.blocking = _blocking(self, traces)
        return allocation

    def _result(self, claim: _Claim) -> dict[str, Any]:
        results = []
        for (request, entry), consumed in zip(claim.results, claim.consumed, strict=True):
            item: dict[str, Any] = {"request": request.name, "driver": entry.id[0],
                                    "pool": entry.id[1], "device": entry.id[2]}
            if request.admin_access:
                item["adminAccess"] = True
            if request.tolerations:
                item["tolerations"] = [dict(t) for t in request.tolerations]
            if consumed is not None:
                # A fresh lower-case RFC 4122 UUID per share, as GenerateShareID.
                item["shareID"] = str(uuid.uuid4())
                item["consumedCapacity"] = {name: render(consumed[name])
                                            for name in sorted(consumed)}
            results.append(item)
        return {
            "devices": {"results": results, "config": self._configs(claim)},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [self.node]}]}]},
        }

    def _configs(self, claim: _Claim) -> list[dict[str, Any]]:
        """Class configs once per class (``FromClass``), then claim configs (``FromClaim``)."""
        configs: list[dict[str, Any]] = []
        by_class: dict[str, list[dict[str, Any]]] = {}
        chosen = claim.chosen_requests()
        for request in chosen:
            if request.device_class in by_class:
                for config in by_class[request.device_class]:
                    config["requests"].append(request.name)
                continue
            device_class = self.allocator.classes[request.device_class]
            added = [{"source": "FromClass", "requests": [request.name], **dict(c)}
                     for c in (device_class.get("spec") or {}).get("config") or []]
            by_class[request.device_class] = added
            configs.extend(added)
        for claim_config in claim.configs:
            names = list(claim_config.get("requests") or [])
            entry: dict[str, Any] = {"source": "FromClaim", **dict(claim_config)}
            if not names:
                entry.pop("requests", None)  # omitempty: the scheduler writes no empty list
                configs.append(entry)
                continue
            # As the scheduler does: once per request the config names (so a config naming
            # two requests appears twice), or for the chosen subrequest by its full name.
            for request in chosen:
                if request.base in names or (request.sub and request.name in names):
                    configs.append(dict(entry))
        return configs

    def _traces(self, done: bool) -> list[RequestTrace]:
        chosen = ({(ci, r.name, e.id) for ci, c in enumerate(self.claims) for r, e in c.results}
                  if done else set())
        allocated = self.index.allocated
        outcome = DeviceOutcome
        traces = []
        # One outcome per device and request on every node: the loop is kept lean (a
        # thousand simulated nodes of 208 devices make 416,000 of them per request pair).
        for key, trace in self.traces.items():
            ci, gi, ai = key
            request = self.claims[ci].groups[gi].alternatives[ai]
            trace.selected = done and self.claims[ci].selected.get(gi, 0) == ai
            trace.devices = self.devices
            dynamic = self.dynamic[key]
            mine = {i for c, name, i in chosen if c == ci and name == request.name}
            admin = request.admin_access
            append = trace.outcomes.append
            # (no verdicts: preparation stopped at an error before this request)
            for entry, verdict in zip(self.devices, self.verdicts.get(key, ()), strict=False):
                device = entry.id
                if device in mine:
                    append(outcome(device, "chosen"))
                elif verdict.code:
                    append(outcome(device, "rejected", verdict.code, verdict.reason))
                elif not admin and device in allocated:
                    append(outcome(device, "rejected", _ALLOCATED.code, _ALLOCATED.reason))
                elif device in dynamic:
                    found = dynamic[device]
                    append(outcome(device, "rejected", found.code, found.reason))
                else:
                    append(outcome(device, "matches", "", "matches, not needed"))
            traces.append(trace)
        return traces


def _astuple(verdict: _Verdict) -> tuple[str, str]:
    return verdict.code, verdict.reason


def _blocking(run: _Run, traces: list[RequestTrace]) -> str:
    if run.too_many:
        return f"a claim would need more than {ALLOCATION_RESULTS_MAX_SIZE} devices"
    by_key = dict(zip(run.traces, traces, strict=True))
    prefix = len(run.claims) > 1
    for ci, claim in enumerate(run.claims):
        for gi, group in enumerate(claim.groups):
            short = [shortfall(r, by_key[(ci, gi, ai)]) for ai, r in enumerate(group.alternatives)]
            if all(short):
                text = "; ".join(s for s in short if s)
                return f"claim {claim.label}: {text}" if prefix else text
    dynamic: Counter[tuple[str, str]] = Counter()
    for (ci, gi, _), trace in by_key.items():
        for outcome in trace.outcomes:
            if outcome.code in SEARCH_CONFLICTS:
                dynamic[(run.claims[ci].groups[gi].name, outcome.reason)] += 1
    if dynamic:
        (name, reason), count = dynamic.most_common(1)[0]
        return (f"request {name}: no combination of devices fits; most often: {reason} "
                f"({count} device{'' if count == 1 else 's'})")
    return "no combination of devices satisfies all requests"
