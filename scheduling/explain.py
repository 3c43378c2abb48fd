"""``gpudra explain``: would the scheduler allocate these claims, where, and if not, why not.

Runs the reference allocator on every node and condenses its traces: per request, how many
devices are usable, which were chosen, every rejection reason with its device and node
counts (a false selector with the values it read), so a thousand-node answer stays a
screenful. Then the opaque configs are checked as the driver will read them at prepare.
What to explain is found in ``explain_subjects``; output is in ``explain_output``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudra.scheduling.allocation_trace import SEARCH_CONFLICTS, Allocation, usable
from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.catalog import STANDARD_ATTRIBUTES, STANDARD_DOMAIN, suggest
from gpudra.scheduling.cel import CelCompileError, DeviceView, compile_selector
from gpudra.scheduling.cel.values import split_name
from gpudra.scheduling.explain_compute_domain import compute_domain_verdict, config_problems
from gpudra.scheduling.explain_configs import decode_problems, device_problems
from gpudra.scheduling.explain_holders import name_holders
from gpudra.scheduling.explain_mig_mode import mig_mode_hints
from gpudra.scheduling.explain_shares import share_hints
from gpudra.scheduling.explain_subjects import ExplainError, Subject
from gpudra.scheduling.selector_why import SelectorWhy

DEFAULT_DRIVER = "gpu.nvidia.com"
SELECTOR_CODES = frozenset({"class-selector", "request-selector"})


def default_device_classes(driver: str) -> list[dict[str, Any]]:
    """The ``gpu.nvidia.com``, ``mig.nvidia.com`` and ``gpu-share.nvidia.com`` classes, for a
    driver of any name (the last selects the shared devices of ``gpudra.driver.gpu_shares``)."""
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"name": name},
         "spec": {"selectors": [{"cel": {"expression": (
             f"device.driver == '{driver}' && "
             f"device.attributes['{driver}'].type == '{kind}'")}}]}}
        for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig"),
                           ("gpu-share.nvidia.com", "gpu-share"))
    ]


@dataclass
class SelectorDetail:
    """A "selector #i is false" reason: the selector, and what it read, per device count."""

    expression: str
    values: Counter[str] = field(default_factory=Counter)


@dataclass
class RequestSummary:
    """One (sub)request over all nodes. Every device is counted once: usable or not."""

    claim: str
    request: str
    device_class: str
    wanted: str
    matching: int = 0
    """Usable devices: they pass the selectors, are free and tolerated (on all nodes)."""
    nodes_matching: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    """Why the other devices are not usable: reason → devices (on all nodes)."""
    reason_nodes: Counter[str] = field(default_factory=Counter)
    """Rejection reason → nodes where it occurs."""
    conflicts: Counter[str] = field(default_factory=Counter)
    """Usable devices the search did not take, and why (counters, constraints …)."""
    details: dict[str, SelectorDetail] = field(default_factory=dict)
    """For a false selector among ``reasons``: its expression and the values it read."""


@dataclass
class Explanation:
    subject: Subject
    nodes: list[str]
    allocations: list[Allocation]
    requests: list[RequestSummary]
    verdict: str
    verdict_allocation: Allocation | None
    hints: list[str]
    skipped_pools: Counter[str]
    other_nodes: list[str] = field(default_factory=list)
    """Nodes with devices that were left out (their pools are on the wrong node)."""
    config_errors: list[str] = field(default_factory=list)
    """Opaque configs the driver refuses at prepare (field path first)."""

    @property
    def allocatable(self) -> bool:
        """The scheduler would allocate (whatever happens at prepare)."""
        return (self.verdict_allocation is not None and self.verdict_allocation.allocatable
                and not self.subject.unavailable)

    @property
    def ok(self) -> bool:
        """Allocated, and prepared: the pod would start."""
        return self.allocatable and not self.config_errors


def explain(subject: Subject, allocator: Allocator, nodes: Sequence[str],
            labels: Mapping[str, Mapping[str, str]] | None = None, *,
            driver: str = DEFAULT_DRIVER) -> Explanation:
    """Allocate the subject's claims on every node and condense what happened."""
    if not nodes:
        raise ExplainError("no nodes to allocate on: no ResourceSlices with devices")
    allocations = [allocator.allocate(subject.claims, node, (labels or {}).get(node))
                   for node in nodes]
    name_holders(allocations, allocator)
    summaries = _summaries(allocations)
    hints = _hints(subject, allocator)
    fitting = [a for a in allocations if a.allocatable]
    if not fitting:  # an A100/A30 that publishes no MIG device because of its MIG mode
        hints += mig_mode_hints(subject, allocator)
        hints += share_hints(subject, allocator)
    skipped: Counter[str] = Counter(note.reason for a in allocations for note in a.pools)
    verdict_allocation = fitting[0] if fitting else allocations[0]
    config_errors = decode_problems(subject, allocator, driver)
    if fitting and not config_errors:
        config_errors = device_problems(subject, allocator, verdict_allocation, driver)
    if fitting and not config_errors:  # the ComputeDomain configs, as its node side reads them
        config_errors = config_problems(subject, verdict_allocation)
    verdict = _verdict(subject, allocations, fitting, hints, config_errors)
    # IMEX channels: the wait for ComputeDomainReady, or why not in the domain's words.
    verdict, more = compute_domain_verdict(allocations, fitting, allocator, verdict)
    hints += more
    considered = set(nodes)
    others = [n for n in allocator.nodes() if n not in considered]
    return Explanation(subject, list(nodes), allocations, summaries, verdict,
                       verdict_allocation, hints, skipped, others, config_errors)


def _summaries(allocations: Sequence[Allocation]) -> list[RequestSummary]:
    summaries: dict[tuple[str, str], RequestSummary] = {}
    # False selectors are explained once per distinct device dict (nodes of one model share
    # them): count devices per (summary, reason, dict) first, evaluate after.
    pending: Counter[tuple[tuple[str, str], str, int]] = Counter()
    views: dict[int, DeviceView] = {}
    expressions: dict[tuple[tuple[str, str], str], str] = {}
    for allocation in allocations:
        for trace in allocation.requests:
            key = (trace.claim, trace.request)
            summary = summaries.get(key)
            if summary is None:
                summary = RequestSummary(trace.claim, trace.request, trace.device_class,
                                         trace.wanted)
                summaries[key] = summary
            matching = usable(trace)
            summary.matching += matching
            summary.nodes_matching += matching > 0
            reasons: Counter[str] = Counter()
            for outcome, entry in zip(trace.outcomes, trace.devices, strict=False):
                if outcome.status != "rejected":
                    continue
                if outcome.code in SEARCH_CONFLICTS:
                    summary.conflicts[outcome.reason] += 1
                    continue
                reasons[outcome.reason] += 1
                if outcome.code in SELECTOR_CODES and outcome.reason in trace.expressions:
                    expressions[(key, outcome.reason)] = trace.expressions[outcome.reason]
                    pending[(key, outcome.reason, id(entry.raw))] += 1
                    views[id(entry.raw)] = entry.view
            summary.reasons.update(reasons)
            summary.reason_nodes.update(reasons.keys())
    why = SelectorWhy()
    for (key, reason, raw), count in pending.items():
        expression = expressions[(key, reason)]
        detail = summaries[key].details.setdefault(reason, SelectorDetail(expression))
        detail.values[why.why(compile_selector(expression), views[raw])] += count
    return list(summaries.values())


def _device_list(allocation: Allocation) -> str:
    parts = []
    for result in allocation.results or []:
        for item in result["devices"]["results"]:
            parts.append(f"{item['request']} -> {item['device']}")
    return ", ".join(parts)


_NO_SUCH_KEY = re.compile(r"no such key: (\w+)")
_COUNTS_DEVICES = re.compile(r"\b\d+ (of \d+ )?devices?\b")


def _verdict(subject: Subject, allocations: Sequence[Allocation],
             fitting: Sequence[Allocation], hints: Sequence[str],
             config_errors: Sequence[str]) -> str:
    total = len(allocations)
    if subject.unavailable:
        names = ", ".join(subject.unavailable)
        return (f"NOT ALLOCATABLE: no DeviceClass provides {names} (extendedResourceName); "
                "only a device plugin could")
    if fitting:
        first = fitting[0]
        where = f" (fits on {len(fitting)} of {total} nodes)" if total > 1 else ""
        allocated = f"on node {first.node}: {_device_list(first)}{where}"
        if config_errors:
            more = f" (and {len(config_errors) - 1} more)" if len(config_errors) > 1 else ""
            return (f"FAILS AT PREPARE: {config_errors[0]}{more}; the scheduler would allocate "
                    f"{allocated}, then the driver refuses the config when the pod starts")
        return f"ALLOCATABLE {allocated}"
    reasons = Counter(a.error or a.blocking or "unknown" for a in allocations)
    reason, count = reasons.most_common(1)[0]
    missing = _NO_SUCH_KEY.search(reason)
    if missing is not None:
        for hint in hints:
            if f"'{missing.group(1)}'" in hint and "did you mean" in hint:
                reason += f" ({hint[hint.index('did you mean'):]})"
                break
    if total > 1:
        # The reason counts one node's devices, where the request summaries above count all
        # nodes' together: say so, or "0 of 8 devices usable" reads as the cluster's 8.
        if _COUNTS_DEVICES.search(reason):
            reason += (f" (on each of {count} of the {total} nodes)" if count < total
                       else f" (on each of the {total} nodes)")
        else:
            reason += (f" (on {count} of {total} nodes)" if count < total
                       else f" (on all {total} nodes)")
    return f"NOT ALLOCATABLE: {reason}"


# --- "did you mean" -------------------------------------------------------------------

def _published(allocator: Allocator) -> dict[tuple[str, str], set[str]]:
    """(attribute|capacity, domain) → names some device publishes, over the whole cluster."""
    raw: dict[tuple[str, str], set[str]] = {}
    seen: set[int] = set()
    for pool in allocator.index.pools:
        for obj in pool.slices:
            for device in (obj.get("spec") or {}).get("devices") or []:
                for kind in ("attributes", "capacity"):
                    table = device.get(kind) or {}
                    if id(table) not in seen:
                        seen.add(id(table))
                        raw.setdefault((kind, pool.driver), set()).update(table)
    published: dict[tuple[str, str], set[str]] = {}
    for (kind, driver), names in raw.items():
        for qualified in names:
            domain, name = split_name(driver, qualified)
            published.setdefault((kind, domain), set()).add(name)
    return published


def _selectors_of(subject: Subject, allocator: Allocator) -> Iterable[str]:
    for claim in subject.claims:
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            specs = request.get("firstAvailable") or [request.get("exactly") or request]
            for spec in specs:
                device_class = allocator.classes.get(str(spec.get("deviceClassName", ""))) or {}
                for selector in ((device_class.get("spec") or {}).get("selectors") or []) + (
                        spec.get("selectors") or []):
                    yield str((selector.get("cel") or {}).get("expression", ""))


def _hints(subject: Subject, allocator: Allocator) -> list[str]:
    """Attributes/capacities the selectors read that no device publishes, with a suggestion."""
    published = _published(allocator)
    hints: list[str] = []
    for expression in dict.fromkeys(_selectors_of(subject, allocator)):
        try:
            analysis = compile_selector(expression).analysis
        except CelCompileError as exc:
            hints.append(f"selector {expression!r} does not compile: {exc}")
            continue
        for ref in analysis.references:
            kind = "attributes" if ref.kind == "attribute" else "capacity"
            names = published.get((kind, ref.domain), set())
            if ref.name in names or not (names or ref.domain == STANDARD_DOMAIN):
                # Published, or a domain no device here uses (another vendor's): no opinion.
                continue
            candidates = names | (set(STANDARD_ATTRIBUTES) if ref.domain == STANDARD_DOMAIN
                                  and kind == "attributes" else set())
            hint = suggest(ref.name, candidates)
            text = (f"{ref.kind} '{ref.name}' (domain {ref.domain}) is not published by any "
                    "device" + (f"; did you mean '{hint}'?" if hint else ""))
            if text not in hints:
                hints.append(text)
    return hints
