"""``gpudra explain``: would the scheduler allocate these claims, where, and if not, why not.

Runs the reference allocator on every node and condenses its traces: per request, how many
devices match, which were chosen, and every rejection reason with its device and node
counts, so a thousand-node answer stays a screenful; the JSON form keeps each node's detail.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudra.scheduling.allocation_trace import Allocation, DeviceOutcome, usable
from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.catalog import STANDARD_ATTRIBUTES, STANDARD_DOMAIN, suggest
from gpudra.scheduling.cel import CelCompileError, compile_selector
from gpudra.scheduling.cel.values import split_name
from gpudra.scheduling.validate import objects, pod_spec


class ExplainError(ValueError):
    """The input cannot be explained (nothing to allocate, a dangling reference …)."""


def default_device_classes(driver: str) -> list[dict[str, Any]]:
    """The ``gpu.nvidia.com`` and ``mig.nvidia.com`` classes, for a driver of any name."""
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"name": name},
         "spec": {"selectors": [{"cel": {"expression": (
             f"device.driver == '{driver}' && "
             f"device.attributes['{driver}'].type == '{kind}'")}}]}}
        for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig"))
    ]


# --- what to explain ------------------------------------------------------------------

@dataclass
class Subject:
    """Claims the scheduler would allocate together: one claim, or all claims of a pod."""

    title: str
    claims: list[dict[str, Any]]


def _claim_from_template(template: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    meta = template.get("metadata") or {}
    spec = (template.get("spec") or {}).get("spec") or {}
    metadata = {"name": name or meta.get("name") or "<unnamed>"}
    if meta.get("namespace"):
        metadata["namespace"] = meta["namespace"]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": metadata, "spec": dict(spec)}


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "<unnamed>")


def _title(kind: str, obj: Mapping[str, Any]) -> str:
    namespace = (obj.get("metadata") or {}).get("namespace")
    return f"{kind} {namespace + '/' if namespace else ''}{_name(obj)}"


def subjects(documents: Iterable[Any]) -> tuple[list[Subject], list[dict[str, Any]]]:
    """The claims to explain and the DeviceClasses found in the documents.

    Pods (and workloads with a pod template) are explained with all their claims together;
    claims and templates a pod uses are not explained a second time on their own.
    """
    items = list(objects(documents))
    classes = [dict(o) for o in items if o.get("kind") == "DeviceClass"]
    claims = {_name(o): o for o in items if o.get("kind") == "ResourceClaim"}
    templates = {_name(o): o for o in items if o.get("kind") == "ResourceClaimTemplate"}
    used: set[tuple[str, str]] = set()
    found: list[Subject] = []
    for obj in items:
        spec = pod_spec(obj)
        if spec is None or not spec.get("resourceClaims"):
            continue
        pod_claims = []
        for entry in spec.get("resourceClaims") or []:
            pod_claims.append(_pod_claim(obj, entry, claims, templates, used))
        found.append(Subject(_title(str(obj.get("kind")), obj), pod_claims))
    for name, claim in claims.items():
        if ("claim", name) not in used:
            found.append(Subject(_title("ResourceClaim", claim), [dict(claim)]))
    for name, template in templates.items():
        if ("template", name) not in used:
            found.append(Subject(_title("ResourceClaimTemplate", template),
                                 [_claim_from_template(template)]))
    if not found:
        raise ExplainError("nothing to explain: no ResourceClaim, ResourceClaimTemplate or Pod "
                           "with resourceClaims in the input")
    return found, classes


def _pod_claim(pod: Mapping[str, Any], entry: Mapping[str, Any],
               claims: Mapping[str, Mapping[str, Any]],
               templates: Mapping[str, Mapping[str, Any]],
               used: set[tuple[str, str]]) -> dict[str, Any]:
    if entry.get("resourceClaimTemplateName"):
        name = str(entry["resourceClaimTemplateName"])
        if name not in templates:
            raise ExplainError(f"{_title(str(pod.get('kind')), pod)} uses ResourceClaimTemplate "
                               f"{name}, which is not in the input")
        used.add(("template", name))
        claim = _claim_from_template(templates[name], f"{_name(pod)}-{entry.get('name')}")
        namespace = (pod.get("metadata") or {}).get("namespace")
        if namespace:
            claim["metadata"]["namespace"] = namespace
        return claim
    name = str(entry.get("resourceClaimName", ""))
    if name not in claims:
        raise ExplainError(f"{_title(str(pod.get('kind')), pod)} uses ResourceClaim {name}, "
                           "which is not in the input")
    used.add(("claim", name))
    return dict(claims[name])


# --- the explanation ------------------------------------------------------------------

@dataclass
class RequestSummary:
    """One (sub)request over all nodes."""

    claim: str
    request: str
    device_class: str
    wanted: str
    matching: int = 0
    """Devices that pass the selectors and are free (on all nodes)."""
    nodes_matching: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    """Rejection reason → devices (on all nodes)."""
    reason_nodes: Counter[str] = field(default_factory=Counter)
    """Rejection reason → nodes where it occurs."""


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

    @property
    def allocatable(self) -> bool:
        return self.verdict_allocation is not None and self.verdict_allocation.allocatable


def explain(subject: Subject, allocator: Allocator, nodes: Sequence[str],
            labels: Mapping[str, Mapping[str, str]] | None = None) -> Explanation:
    """Allocate the subject's claims on every node and condense what happened."""
    if not nodes:
        raise ExplainError("no nodes to allocate on: no ResourceSlices with devices")
    allocations = [allocator.allocate(subject.claims, node, (labels or {}).get(node))
                   for node in nodes]
    summaries = _summaries(allocations)
    hints = _hints(subject, allocator)
    fitting = [a for a in allocations if a.allocatable]
    skipped: Counter[str] = Counter(note.reason for a in allocations for note in a.pools)
    verdict_allocation = fitting[0] if fitting else allocations[0]
    verdict = _verdict(allocations, fitting, hints)
    considered = set(nodes)
    others = [n for n in allocator.nodes() if n not in considered]
    return Explanation(subject, list(nodes), allocations, summaries, verdict,
                       verdict_allocation, hints, skipped, others)


def _summaries(allocations: Sequence[Allocation]) -> list[RequestSummary]:
    summaries: dict[tuple[str, str], RequestSummary] = {}
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
            reasons = Counter(o.reason for o in trace.outcomes if o.status == "rejected")
            summary.reasons.update(reasons)
            summary.reason_nodes.update(reasons.keys())
    return list(summaries.values())


def _device_list(allocation: Allocation) -> str:
    parts = []
    for result in allocation.results or []:
        for item in result["devices"]["results"]:
            parts.append(f"{item['request']} -> {item['device']}")
    return ", ".join(parts)


_NO_SUCH_KEY = re.compile(r"no such key: (\w+)")


def _verdict(allocations: Sequence[Allocation], fitting: Sequence[Allocation],
             hints: Sequence[str]) -> str:
    total = len(allocations)
    if fitting:
        first = fitting[0]
        where = f" (fits on {len(fitting)} of {total} nodes)" if total > 1 else ""
        return f"ALLOCATABLE on node {first.node}: {_device_list(first)}{where}"
    reasons = Counter(a.error or a.blocking or "unknown" for a in allocations)
    reason, count = reasons.most_common(1)[0]
    missing = _NO_SUCH_KEY.search(reason)
    if missing is not None:
        for hint in hints:
            if f"'{missing.group(1)}'" in hint and "did you mean" in hint:
                reason += f" ({hint[hint.index('did you mean'):]})"
                break
    if total > 1:
        reason += f" (on {count} of {total} nodes)" if count < total else f" (on all {total} nodes)"
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


# --- output -----------------------------------------------------------------------------

def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _node_range(nodes: Sequence[str]) -> str:
    if len(nodes) == 1:
        return nodes[0]
    if len(nodes) <= 3:
        return ", ".join(nodes)
    return f"{nodes[0]} … {nodes[-1]}"


def render_table(explanation: Explanation) -> list[str]:
    """Human-readable lines; identical reasons are counted, never listed per device."""
    nodes = explanation.nodes
    many = len(nodes) > 1
    lines = [f"{explanation.subject.title}: {_plural(len(nodes), 'node')} ({_node_range(nodes)})"]
    verdict_allocation = explanation.verdict_allocation
    traces = {(t.claim, t.request): t for t in verdict_allocation.requests} \
        if verdict_allocation else {}
    for summary in explanation.requests:
        trace = traces.get((summary.claim, summary.request))
        prefix = f"claim {summary.claim}, " if len(explanation.subject.claims) > 1 else ""
        wanted = "all devices" if summary.wanted == "All" else _plural(int(summary.wanted),
                                                                        "device")
        state = ""
        if "/" in summary.request and trace is not None:
            state = " [selected]" if trace.selected else (
                " [tried]" if trace.tried else " [not tried]")
        lines.append(f"  {prefix}request {summary.request}: {wanted} of class "
                     f"{summary.device_class}{state}")
        if trace is not None and trace.chosen and verdict_allocation is not None:
            names = ", ".join(d[2] for d in trace.chosen)
            lines.append(f"    chosen on {verdict_allocation.node}: {names}")
        on = f" on {_plural(summary.nodes_matching, 'node')}" if many else ""
        lines.append(f"    {_plural(summary.matching, 'device')} usable{on}")
        if summary.reasons:
            lines.append("    not usable:" if not many else "    not usable (devices, nodes):")
            width = len(str(summary.reasons.most_common(1)[0][1]))
            for reason, count in summary.reasons.most_common():
                where = f" on {_plural(summary.reason_nodes[reason], 'node')}" if many else ""
                lines.append(f"      {count:>{width}}{where}  {reason}")
    for reason, count in explanation.skipped_pools.most_common():
        lines.append(f"  pools skipped: {reason}" + (f" ({count})" if count > 1 else ""))
    if explanation.other_nodes:
        lines.append(f"  not considered: devices of {_plural(len(explanation.other_nodes), 'node')}"
                     f" ({_node_range(explanation.other_nodes)}): wrong node")
    for hint in explanation.hints:
        lines.append(f"  hint: {hint}")
    lines.append(explanation.verdict)
    return lines


def _outcome_groups(outcomes: Sequence[DeviceOutcome]) -> dict[str, Any]:
    rejected: dict[str, list[str]] = {}
    for outcome in outcomes:
        if outcome.status == "rejected":
            rejected.setdefault(outcome.reason, []).append(outcome.device[2])
    return {
        "chosen": [o.device[2] for o in outcomes if o.status == "chosen"],
        "matching": [o.device[2] for o in outcomes if o.status == "matches"],
        "rejected": rejected,
    }


def to_json(explanation: Explanation) -> dict[str, Any]:
    """Everything: the summary, the verdict, and each node's allocation and trace."""
    best = explanation.verdict_allocation
    return {
        "subject": explanation.subject.title,
        "claims": [c.get("metadata", {}).get("name") for c in explanation.subject.claims],
        "verdict": explanation.verdict,
        "allocatable": explanation.allocatable,
        "node": best.node if best is not None and best.allocatable else None,
        "results": best.results if best is not None else None,
        "hints": explanation.hints,
        "otherNodes": explanation.other_nodes,
        "requests": [{
            "claim": s.claim, "request": s.request, "deviceClass": s.device_class,
            "wanted": s.wanted, "usable": s.matching, "nodesWithUsable": s.nodes_matching,
            "rejected": [{"reason": r, "devices": n, "nodes": s.reason_nodes[r]}
                         for r, n in s.reasons.most_common()],
        } for s in explanation.requests],
        "nodes": [{
            "node": a.node,
            "allocatable": a.allocatable,
            "error": a.error,
            "blocking": a.blocking,
            "results": a.results,
            "skippedPools": [{"driver": p.driver, "pool": p.pool, "reason": p.reason}
                             for p in a.pools],
            "requests": [{"claim": t.claim, "request": t.request, "tried": t.tried,
                          "selected": t.selected, **_outcome_groups(t.outcomes)}
                         for t in a.requests],
        } for a in explanation.allocations],
    }
