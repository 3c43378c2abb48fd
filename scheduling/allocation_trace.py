"""What the allocator reports: per device and request, whether it was chosen and otherwise
why (the trace), the answer for a pod's claims on one node, and why-not summaries of it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpudra.scheduling.claim_requests import Request
from gpudra.scheduling.pools import DeviceEntry, DeviceId, PoolNote


class DeviceOutcome(NamedTuple):
    """What happened to one device for one request (a tuple: there are many of these)."""

    device: DeviceId
    status: str
    """``chosen``, ``matches`` (selected by CEL, not needed) or ``rejected``."""
    code: str = ""
    """Why, as a category: class-selector, request-selector, cel-error, allocated (also its
    counters held by allocated devices), in-claim, taint, counters, constraint, wrong-node."""
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
    expressions: dict[str, str] = field(default_factory=dict)
    """The selector behind each "selector #i is false" reason."""
    devices: Sequence[DeviceEntry] = ()
    """The node's devices, in the order of ``outcomes`` (what the selectors saw)."""

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
    reasons = top_reasons(o for o in outcomes if not is_usable(o))
    return f" ({reasons})" if reasons else ""


SEARCH_CONFLICTS = frozenset({"counters", "constraint", "in-claim", "capacity-search"})
"""Rejections of usable devices: only the devices the search picked for other slots clash."""


def is_usable(outcome: DeviceOutcome) -> bool:
    """The device passes the selectors, is free and tolerated (at most the search said no)."""
    return outcome.status in ("chosen", "matches") or outcome.code in SEARCH_CONFLICTS


def usable(trace: RequestTrace) -> int:
    """How many devices of the trace are usable (:func:`is_usable`)."""
    return sum(1 for o in trace.outcomes if is_usable(o))


def shortfall(request: Request, trace: RequestTrace) -> str | None:
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
