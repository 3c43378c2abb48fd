"""``explain`` as text (identical reasons counted, never listed per device) and as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpudra.scheduling.allocation_trace import DeviceOutcome
from gpudra.scheduling.explain import Explanation, RequestSummary, SelectorDetail
from gpudra.scheduling.selector_why import shorten

_VALUE_LINES = 3
"""Distinct "what the selector read" lines shown per reason (the rest are counted)."""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _node_range(nodes: Sequence[str]) -> str:
    if len(nodes) == 1:
        return nodes[0]
    if len(nodes) <= 3:
        return ", ".join(nodes)
    return f"{nodes[0]} … {nodes[-1]}"


def _detail_lines(detail: SelectorDetail, indent: int) -> list[str]:
    pad = " " * indent
    lines = [f"{pad}{shorten(detail.expression)}"]
    values = detail.values.most_common()
    if len(values) == 1:
        return [*lines, f"{pad}{values[0][0]}"]
    for text, count in values[:_VALUE_LINES]:
        lines.append(f"{pad}{_plural(count, 'device')}: {text}")
    if len(values) > _VALUE_LINES:
        lines.append(f"{pad}… and {len(values) - _VALUE_LINES} other values")
    return lines


def _request_lines(explanation: Explanation, summary: RequestSummary) -> list[str]:
    many = len(explanation.nodes) > 1
    verdict_allocation = explanation.verdict_allocation
    traces = {(t.claim, t.request): t for t in verdict_allocation.requests} \
        if verdict_allocation else {}
    trace = traces.get((summary.claim, summary.request))
    prefix = f"claim {summary.claim}, " if len(explanation.subject.claims) > 1 else ""
    wanted = "all devices" if summary.wanted == "All" else _plural(int(summary.wanted),
                                                                    "device")
    state = ""
    if "/" in summary.request and trace is not None:
        state = " [selected]" if trace.selected else (
            " [tried]" if trace.tried else " [not tried]")
    lines = [f"  {prefix}request {summary.request}: {wanted} of class "
             f"{summary.device_class}{state}"]
    if trace is not None and trace.chosen and verdict_allocation is not None:
        names = ", ".join(d[2] for d in trace.chosen)
        lines.append(f"    chosen on {verdict_allocation.node}: {names}")
    on = f" on {_plural(summary.nodes_matching, 'node')}" if many and summary.matching else ""
    lines.append(f"    {_plural(summary.matching, 'device')} usable{on}")
    if summary.conflicts:
        lines.append("    usable, but not chosen:")
        width = len(str(summary.conflicts.most_common(1)[0][1]))
        lines.extend(f"      {count:>{width}}  {reason}"
                     for reason, count in summary.conflicts.most_common())
    if summary.reasons:
        lines.append("    not usable:" if not many else "    not usable (devices, nodes):")
        width = len(str(summary.reasons.most_common(1)[0][1]))
        for reason, count in summary.reasons.most_common():
            where = f" on {_plural(summary.reason_nodes[reason], 'node')}" if many else ""
            lines.append(f"      {count:>{width}}{where}  {reason}")
            detail = summary.details.get(reason)
            if detail is not None:
                lines.extend(_detail_lines(detail, 6 + width + len(where) + 2))
    return lines


def render_table(explanation: Explanation) -> list[str]:
    """Human-readable lines; identical reasons are counted, never listed per device."""
    nodes = explanation.nodes
    lines = [f"{explanation.subject.title}: {_plural(len(nodes), 'node')} ({_node_range(nodes)})"]
    for summary in explanation.requests:
        lines.extend(_request_lines(explanation, summary))
    for reason, count in explanation.skipped_pools.most_common():
        lines.append(f"  pools skipped: {reason}" + (f" ({count})" if count > 1 else ""))
    if explanation.other_nodes:
        lines.append(f"  not considered: devices of {_plural(len(explanation.other_nodes), 'node')}"
                     f" ({_node_range(explanation.other_nodes)}): wrong node")
    for error in explanation.config_errors:
        lines.append(f"  config: {error}")
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


def _rejected(summary: RequestSummary, reason: str, devices: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"reason": reason, "devices": devices,
                             "nodes": summary.reason_nodes[reason]}
    detail = summary.details.get(reason)
    if detail is not None:
        entry["expression"] = detail.expression
        entry["values"] = [{"devices": n, "why": text}
                           for text, n in detail.values.most_common()]
    return entry


def to_json(explanation: Explanation) -> dict[str, Any]:
    """Everything: the summary, the verdict, and each node's allocation and trace."""
    best = explanation.verdict_allocation
    return {
        "subject": explanation.subject.title,
        "claims": [c.get("metadata", {}).get("name") for c in explanation.subject.claims],
        "verdict": explanation.verdict,
        "allocatable": explanation.allocatable,
        "ok": explanation.ok,
        "node": best.node if best is not None and best.allocatable else None,
        "results": best.results if best is not None else None,
        "configErrors": explanation.config_errors,
        "unavailableResources": explanation.subject.unavailable,
        "hints": explanation.hints,
        "otherNodes": explanation.other_nodes,
        "requests": [{
            "claim": s.claim, "request": s.request, "deviceClass": s.device_class,
            "wanted": s.wanted, "usable": s.matching, "nodesWithUsable": s.nodes_matching,
            "notChosen": [{"reason": r, "devices": n} for r, n in s.conflicts.most_common()],
            "rejected": [_rejected(s, r, n) for r, n in s.reasons.most_common()],
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
