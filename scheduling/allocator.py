"""A reference copy of the kube-scheduler's structured allocator, with a trace of its choices.

For the claims of one pod and one node it finds the devices the scheduler would (first
fit, depth-first backtracking over claims, requests and ``firstAvailable`` subrequests,
the same order of checks) and returns ``status.allocation``-shaped results, or the
scheduler's error (a CEL runtime error aborts the allocation, as on a real cluster), plus
a trace that says, for every device and request, whether it was chosen and otherwise why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpudra.scheduling.allocation_state import (
    Constraint,
    CounterLedger,
    DeviceEntry,
    DeviceId,
    NodePools,
    PoolIndex,
    PoolNote,
    allocated_devices,
    node_matches,
    untolerated_taint,
)
from gpudra.scheduling.cel import CelCompileError, Selector, compile_selector

MAX_RESULTS = 32
"""``AllocationResultsMaxSize``: devices per claim."""


# --- the claim, as the allocator reads it ------------------------------------------------

@dataclass(frozen=True)
class Request:
    """One request, or one ``firstAvailable`` subrequest of a request."""

    name: str
    """``req``, or ``req/sub`` for a subrequest: what results and configs call it."""
    base: str
    sub: str
    device_class: str
    selectors: tuple[str, ...]
    all_mode: bool
    count: int
    admin_access: bool
    tolerations: tuple[Mapping[str, Any], ...]

    @property
    def wanted(self) -> str:
        return "All" if self.all_mode else str(self.count)


@dataclass(frozen=True)
class RequestGroup:
    """``spec.devices.requests[i]``: one alternative, or its ``firstAvailable`` list."""

    name: str
    alternatives: tuple[Request, ...]
    first_available: bool


def _request(base: str, sub: str, spec: Mapping[str, Any], admin: bool) -> Request:
    mode = spec.get("allocationMode") or "ExactCount"
    selectors = tuple(str((s.get("cel") or {}).get("expression", ""))
                      for s in spec.get("selectors") or [])
    return Request(
        name=f"{base}/{sub}" if sub else base,
        base=base,
        sub=sub,
        device_class=str(spec.get("deviceClassName", "")),
        selectors=selectors,
        all_mode=mode == "All",
        count=int(spec.get("count") or 1) if mode != "All" else 0,
        admin_access=admin,
        tolerations=tuple(spec.get("tolerations") or ()),
    )


def request_groups(devices: Mapping[str, Any]) -> list[RequestGroup]:
    """The requests of ``spec.devices`` (a pre-v1 request without ``exactly`` is accepted)."""
    groups = []
    for raw in devices.get("requests") or []:
        name = str(raw.get("name", ""))
        if raw.get("firstAvailable"):
            alternatives = tuple(_request(name, str(s.get("name", "")), s, False)
                                 for s in raw["firstAvailable"])
            groups.append(RequestGroup(name, alternatives, True))
        else:
            exact = raw.get("exactly") or raw
            groups.append(RequestGroup(name, (
                _request(name, "", exact, bool(exact.get("adminAccess"))),), False))
    return groups


def claim_label(claim: Mapping[str, Any]) -> str:
    """``namespace/name`` as the scheduler prints it (``klog.KObj``)."""
    meta = claim.get("metadata") or {}
    name = str(meta.get("name") or meta.get("generateName") or "<unnamed>")
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


# --- the trace ------------------------------------------------------------------------

class DeviceOutcome(NamedTuple):
    """What happened to one device for one request (a tuple: there are many of these)."""

    device: DeviceId
    status: str
    """``chosen``, ``matches`` (selected by CEL, not needed) or ``rejected``."""
    code: str = ""
    """Why, as a category: class-selector, request-selector, cel-error, allocated, in-claim,
    taint, counters, constraint, wrong-node."""
    reason: str = ""


@dataclass
class RequestTrace:
    claim: str
    request: str
    device_class: str
    wanted: str
    outcomes: list[DeviceOutcome] = field(default_factory=list)
    tried: bool = False
    """The search reached this (sub)request."""
    selected: bool = False
    """The allocation uses this (sub)request."""

    @property
    def chosen(self) -> list[DeviceId]:
        return [o.device for o in self.outcomes if o.status == "chosen"]


@dataclass
class Allocation:
    """The answer for a pod's claims (often one) on one node."""

    node: str
    claims: list[str]
    results: list[dict[str, Any]] | None
    """One ``status.allocation`` per claim, when all of them fit on the node."""
    error: str | None
    """A scheduler error: allocation is aborted (CEL runtime error, unknown class …)."""
    requests: list[RequestTrace]
    pools: list[PoolNote]
    blocking: str | None = None
    """One line: why the claims do not fit (when they neither fit nor error)."""

    @property
    def allocatable(self) -> bool:
        return self.results is not None

    @property
    def result(self) -> dict[str, Any] | None:
        """The first (usually only) claim's allocation."""
        return self.results[0] if self.results else None


class AllocationError(Exception):
    """The scheduler would abort with this error."""


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
        self.label = claim_label(claim)
        devices = (claim.get("spec") or {}).get("devices") or {}
        self.groups = request_groups(devices)
        self.constraints = [Constraint(i, c) for i, c in
                            enumerate(devices.get("constraints") or [])]
        self.configs: Sequence[Mapping[str, Any]] = devices.get("config") or []
        self.results: list[tuple[Request, DeviceEntry]] = []
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
        self.index = PoolIndex(slices, allocated_devices(allocations))
        self.classes = {str((c.get("metadata") or {}).get("name", "")): c
                        for c in device_classes}

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

    def _prepare(self) -> None:
        """``validateDeviceRequest`` for every (sub)request, in order; errors abort."""
        for ci, claim in enumerate(self.claims):
            minimum = 0
            for gi, group in enumerate(claim.groups):
                counts = []
                for ai, request in enumerate(group.alternatives):
                    counts.append(self._prepare_request(ci, gi, ai, claim, request))
                minimum += min(counts) if counts else 0
            if minimum > MAX_RESULTS:
                raise AllocationError(f"claim {claim.label}: number of requested devices "
                                      f"{minimum} exceeds the claim limit of {MAX_RESULTS}")

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
        self.verdicts[key] = [self._verdict(request, checks, e) for e in self.devices]
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
            # "All" picks by selectors alone; in-use and taints are checked when allocating.
            if verdict.matches or verdict.code == "taint":
                chosen.append(entry)
        self.all_devices[key] = chosen
        return len(chosen)

    # --- the search (allocateOne / allocateDevice) ----------------------------------------

    def _in_use(self, ci: int, request: Request, entry: DeviceEntry) -> _Verdict | None:
        users = self.allocating.get(entry.id)
        if request.admin_access:
            return _IN_CLAIM if users and ci in users else None
        if entry.id in self.index.allocated:
            return _ALLOCATED
        return _IN_CLAIM if users else None

    def _take(self, key: Key, request: Request, entry: DeviceEntry, must: bool) -> bool:
        ci = key[0]
        claim = self.claims[ci]
        busy = self._in_use(ci, request, entry)
        if busy is not None:
            self.dynamic[key][entry.id] = busy
            return False
        reason = self.ledger.take(entry)
        if reason is not None:
            self.dynamic[key][entry.id] = _Verdict("counters", reason)
            return False
        static = self.verdicts[key][self.positions[entry.id]]
        if static.code == "taint":
            self.ledger.give_back(entry)
            self.dynamic[key][entry.id] = static
            return False
        added: list[Constraint] = []
        for constraint in claim.constraints:
            if not constraint.applies(request.base, request.name):
                continue
            rejected = constraint.add(entry)
            if rejected is None:
                added.append(constraint)
                continue
            for done in added:
                done.remove(entry)
            self.ledger.give_back(entry)
            if must:
                raise AllocationError(
                    f"claim {claim.label}, request {request.name}: cannot add device "
                    "{}/{}/{} because a claim constraint would not be satisfied".format(
                        *entry.id))
            self.dynamic[key][entry.id] = _Verdict("constraint", rejected)
            return False
        self.allocating.setdefault(entry.id, set()).add(ci)
        claim.results.append((request, entry))
        return True

    def _give_back(self, ci: int, request: Request, entry: DeviceEntry) -> None:
        claim = self.claims[ci]
        for constraint in claim.constraints:
            if constraint.applies(request.base, request.name):
                constraint.remove(entry)
        self.ledger.give_back(entry)
        users = self.allocating[entry.id]
        users.discard(ci)
        if not users:
            del self.allocating[entry.id]
        claim.results.pop()

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
        if len(claim.results) + needed - di > MAX_RESULTS:
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
        for request, entry in claim.results:
            item: dict[str, Any] = {"request": request.name, "driver": entry.id[0],
                                    "pool": entry.id[1], "device": entry.id[2]}
            if request.admin_access:
                item["adminAccess"] = True
            if request.tolerations:
                item["tolerations"] = [dict(t) for t in request.tolerations]
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
        traces = []
        for key, trace in self.traces.items():
            ci, gi, ai = key
            request = self.claims[ci].groups[gi].alternatives[ai]
            trace.selected = done and self.claims[ci].selected.get(gi, 0) == ai
            dynamic = self.dynamic[key]
            outcomes = trace.outcomes
            # (no verdicts: preparation stopped at an error before this request)
            for entry, verdict in zip(self.devices, self.verdicts.get(key, ()), strict=False):
                if (ci, request.name, entry.id) in chosen:
                    outcomes.append(DeviceOutcome(entry.id, "chosen"))
                elif verdict.matches and not request.admin_access and (
                        entry.id in self.index.allocated):
                    outcomes.append(DeviceOutcome(entry.id, "rejected", *_astuple(_ALLOCATED)))
                elif not verdict.matches:
                    outcomes.append(DeviceOutcome(entry.id, "rejected", *_astuple(verdict)))
                elif entry.id in dynamic:
                    outcomes.append(DeviceOutcome(entry.id, "rejected",
                                                  *_astuple(dynamic[entry.id])))
                else:
                    outcomes.append(DeviceOutcome(entry.id, "matches", "", "matches, not needed"))
            traces.append(trace)
        return traces


def _astuple(verdict: _Verdict) -> tuple[str, str]:
    return verdict.code, verdict.reason


# --- why not --------------------------------------------------------------------------

def top_reasons(outcomes: Iterable[DeviceOutcome], limit: int = 3) -> str:
    """The commonest rejections: ``"200 devices: class … selector #0 is false; 2 devices: …"``."""
    counts = Counter(o.reason for o in outcomes if o.status == "rejected")
    parts = [f"{n} device{'s' if n != 1 else ''}: {reason}"
             for reason, n in counts.most_common(limit)]
    if len(counts) > limit:
        parts.append("…")
    return "; ".join(parts)


def _why(outcomes: Iterable[DeviceOutcome]) -> str:
    reasons = top_reasons(outcomes)
    return f" ({reasons})" if reasons else ""


def usable(trace: RequestTrace) -> int:
    """Devices that pass the selectors, are free and tolerated (only the search rejected them)."""
    return sum(1 for o in trace.outcomes if o.status in ("chosen", "matches")
               or o.code in ("counters", "constraint", "in-claim"))


def _short(request: Request, trace: RequestTrace) -> str | None:
    """Why this (sub)request cannot be met whatever the other requests do, if it cannot."""
    if request.all_mode:
        blocked = [o for o in trace.outcomes if o.code in ("allocated", "taint")]
        if blocked:
            return (f"request {request.name}: wants all matching devices but some are "
                    f"unavailable{_why(blocked)}")
        if usable(trace) == 0:
            return f"request {request.name}: no device matches{_why(trace.outcomes)}"
        return None
    count = usable(trace)
    if count >= request.count:
        return None
    return (f"request {request.name}: needs {request.count}, {count} of {len(trace.outcomes)} "
            f"devices usable{_why(trace.outcomes)}")


def _blocking(run: _Run, traces: list[RequestTrace]) -> str:
    if run.too_many:
        return f"a claim would need more than {MAX_RESULTS} devices"
    by_key = dict(zip(run.traces, traces, strict=True))
    prefix = len(run.claims) > 1
    for ci, claim in enumerate(run.claims):
        for gi, group in enumerate(claim.groups):
            short = [_short(r, by_key[(ci, gi, ai)]) for ai, r in enumerate(group.alternatives)]
            if all(short):
                text = "; ".join(s for s in short if s)
                return f"claim {claim.label}: {text}" if prefix else text
    dynamic: Counter[tuple[str, str]] = Counter()
    for (ci, gi, _), trace in by_key.items():
        for outcome in trace.outcomes:
            if outcome.code in ("counters", "constraint", "in-claim"):
                dynamic[(run.claims[ci].groups[gi].name, outcome.reason)] += 1
    if dynamic:
        (name, reason), count = dynamic.most_common(1)[0]
        return (f"request {name}: no combination of devices fits; most often: {reason} "
                f"({count} devices)")
    return "no combination of devices satisfies all requests"
