"""The pure core of the controller: given a domain, its channel claims and its daemon pods,
what should exist and what status the domain and each claim should have.

Everything is keyed by (domain, node): a node may serve several domains (one daemon pod
each) and a domain spans several nodes, in one clique or several. Nothing here reads a clock
or calls the API: ``now`` and what the reconciler observed earlier (when a node was first
seen not Ready, when a pod was first seen failed) come in, and the plan says when to look
again (``recheck_at``) because a bound will expire.

A node's daemon is Ready when its ``status.nodes`` entry says Ready *and* its pod is there
and not failing: a daemon that crashed cannot take back the Ready it wrote, so its pod's
state decides. It is failing when its pod Failed or crash-loops, or when it has not become
Ready within ``ready_timeout`` (peers unreachable, the pod never scheduled, ...). The claims
on that node then get ``ComputeDomainFailed`` True with the reason, so the scheduler gives
up on the binding at once instead of at its own timeout, without a word.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpudra.api import compute_domain as cd
from gpudra.controller.compute_domains import objects
from gpudra.controller.compute_domains.claims import ChannelUse, ClaimKey
from gpudra.controller.compute_domains.pods import DaemonPod

Obj = dict[str, Any]

REASON_READY: Final = "DaemonReady"
REASON_WAITING: Final = "WaitingForDaemon"
REASON_FAILED: Final = "DaemonFailed"
REASON_NO_DOMAIN: Final = "ComputeDomainNotFound"
REASON_FOREIGN: Final = "ForeignNamespace"
REASON_OK: Final = "NoFailure"
MESSAGE_MAX: Final = 1024


@dataclass(frozen=True)
class NodeState:
    node: str
    ready: bool
    failure: str = ""
    waiting: str = ""


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


@dataclass
class DomainPlan:
    templates: list[Obj] = field(default_factory=list)
    """Templates the domain needs (created when missing)."""
    create_pods: list[Obj] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    status: str = cd.STATUS_NOT_READY
    prune_nodes: list[str] = field(default_factory=list)
    """``status.nodes`` entries of nodes the domain has left."""
    conditions: dict[ChannelUse, tuple[Condition, Condition]] = field(default_factory=dict)
    """Per channel use: (ComputeDomainReady, ComputeDomainFailed)."""
    nodes: dict[str, NodeState] = field(default_factory=dict)
    recheck_at: float | None = None


@dataclass(frozen=True)
class Observed:
    """What the reconciler saw before: monotonic times, by node and by pod name."""

    not_ready_since: Mapping[str, float] = field(default_factory=dict)
    failed_since: Mapping[str, float] = field(default_factory=dict)


def _short(text: str) -> str:
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 3] + "..."


def _conditions(domain: str, state: NodeState) -> tuple[Condition, Condition]:
    if state.ready:
        return (Condition(cd.CONDITION_READY, True, REASON_READY,
                          f"the IMEX daemon of ComputeDomain {domain} is Ready on node "
                          f"{state.node}"),
                Condition(cd.CONDITION_FAILED, False, REASON_OK, ""))
    if state.failure:
        message = _short(f"ComputeDomain {domain}, node {state.node}: {state.failure}")
        return (Condition(cd.CONDITION_READY, False, REASON_FAILED, message),
                Condition(cd.CONDITION_FAILED, True, REASON_FAILED, message))
    return (Condition(cd.CONDITION_READY, False, REASON_WAITING,
                      _short(f"ComputeDomain {domain}, node {state.node}: {state.waiting}")),
            Condition(cd.CONDITION_FAILED, False, REASON_OK, ""))


def no_domain_conditions(use: ChannelUse) -> tuple[Condition, Condition]:
    """A claim whose config names a domain that does not exist (deleted, or a typo)."""
    message = (f"no ComputeDomain with uid {use.domain_uid} (deleted?); node {use.node} "
               "will not run its IMEX daemon")
    return (Condition(cd.CONDITION_READY, False, REASON_NO_DOMAIN, message),
            Condition(cd.CONDITION_FAILED, True, REASON_NO_DOMAIN, message))


def foreign_conditions(use: ChannelUse, domain: cd.ComputeDomain) -> tuple[Condition,
                                                                          Condition]:
    message = (f"claim {use.claim} names ComputeDomain {domain.key}, of another namespace; "
               "a claim can only join a domain of its own namespace")
    return (Condition(cd.CONDITION_READY, False, REASON_FOREIGN, message),
            Condition(cd.CONDITION_FAILED, True, REASON_FOREIGN, message))


def _node_state(node: str, pod: DaemonPod | None, entry: cd.NodeEntry | None, *, now: float,
                seen: Observed, settings: objects.Settings) -> tuple[NodeState, float | None]:
    """The node's state, and when it changes by itself (a bound expiring), if it will."""
    # The message stays the same from the pod's creation to the daemon's first report, so
    # a claim's waiting condition is written once, not once per step of the pod's start.
    if pod is not None and pod.failure:
        return NodeState(node, False, failure=pod.failure), None
    ready = pod is not None and not pod.deleting and entry is not None and \
        entry.status == cd.STATUS_READY
    if pod is not None and pod.deleting:
        waiting = "the IMEX daemon pod is being replaced"
    elif entry is None or pod is None:
        waiting = "waiting for the IMEX daemon to start and report"
    else:
        waiting = f"the IMEX daemon on the node reports {entry.status}"
    if ready:
        return NodeState(node, True), None
    since = seen.not_ready_since.get(node, now)
    deadline = since + settings.ready_timeout
    if now >= deadline:
        return NodeState(node, False, failure=(
            f"the IMEX daemon is not Ready after {settings.ready_timeout:g}s: {waiting}")), None
    return NodeState(node, False, waiting=waiting), deadline


def plan_domain(domain: cd.ComputeDomain, uses: Iterable[ChannelUse],
                pods: Sequence[DaemonPod], *, templates: Iterable[tuple[str, str]],
                now: float, seen: Observed, settings: objects.Settings) -> DomainPlan:
    """What ``domain`` needs now. ``templates`` are the (namespace, name) of the domain's
    claim templates that exist."""
    out = DomainPlan()
    have = set(templates)
    for template in (objects.channel_template(domain, settings),
                     objects.daemon_template(domain, settings)):
        meta = template["metadata"]
        if (meta["namespace"], meta["name"]) not in have:
            out.templates.append(template)
    uses = list(uses)
    # A claim joins only a domain of its own namespace: a domain's uid copied into another
    # tenant's claim must not put that tenant's pod into the domain's shared memory.
    foreign = [u for u in uses if u.claim.namespace != domain.metadata.namespace]
    uses = [u for u in uses if u.claim.namespace == domain.metadata.namespace]
    for use in foreign:
        out.conditions[use] = foreign_conditions(use, domain)
    wanted = sorted({u.node for u in uses})
    by_node: dict[str, list[DaemonPod]] = {}
    for each in sorted(pods, key=lambda p: p.name):
        by_node.setdefault(each.node, []).append(each)
    entries = {e.name: e for e in domain.status.nodes}
    deadlines: list[float] = []
    for node in wanted:
        mine = [p for p in by_node.get(node, []) if p.name == objects.daemon_pod_name(
            domain.uid, node)]
        pod: DaemonPod | None = mine[0] if mine else None
        if pod is None:
            out.create_pods.append(objects.daemon_pod(domain, node, settings))
        elif pod.failure and pod.phase == "Failed" and not pod.deleting:
            # Replaced as a DaemonSet would, after its failure has been on the claims a while.
            replace_at = seen.failed_since.get(pod.name, now) + settings.restart_delay
            if now >= replace_at:
                out.delete_pods.append(pod.name)
            else:
                deadlines.append(replace_at)
        state, deadline = _node_state(node, pod, entries.get(node), now=now, seen=seen,
                                      settings=settings)
        out.nodes[node] = state
        if deadline is not None:
            deadlines.append(deadline)
    for node, node_pods in by_node.items():
        for extra in node_pods:
            stray = node not in out.nodes or extra.name != objects.daemon_pod_name(
                domain.uid, node)
            if stray and not extra.deleting:
                out.delete_pods.append(extra.name)
    out.prune_nodes = sorted(n for n in entries if n not in out.nodes and n not in by_node)
    ready = [n for n, s in out.nodes.items() if s.ready]
    if domain.spec.num_nodes > 0:
        out.status = cd.STATUS_READY if len(ready) >= domain.spec.num_nodes else \
            cd.STATUS_NOT_READY
    else:
        out.status = cd.STATUS_READY if wanted and len(ready) == len(wanted) else \
            cd.STATUS_NOT_READY
    for use in uses:
        out.conditions[use] = _conditions(domain.key, out.nodes[use.node])
    out.recheck_at = min(deadlines) if deadlines else None
    return out


def condition_json(condition: Condition, previous: Mapping[str, Any] | None,
                   stamp: str) -> Obj:
    """A ``metav1.Condition``; its transition time kept while its status does not change."""
    status = "True" if condition.status else "False"
    since = previous.get("lastTransitionTime") if previous and \
        previous.get("status") == status else None
    return {"type": condition.type, "status": status, "reason": condition.reason,
            "message": condition.message, "lastTransitionTime": since or stamp}


def same_conditions(current: Mapping[str, Obj], wanted: Sequence[Condition]) -> bool:
    """True when the entry already says exactly this (no write needed)."""
    for condition in wanted:
        have = current.get(condition.type)
        if have is None or have.get("status") != ("True" if condition.status else "False") \
                or have.get("reason") != condition.reason \
                or (have.get("message") or "") != condition.message:
            return False
    return True


def claim_uses(uses: Iterable[ChannelUse]) -> dict[ClaimKey, list[ChannelUse]]:
    out: dict[ClaimKey, list[ChannelUse]] = {}
    for use in uses:
        out.setdefault(use.claim, []).append(use)
    return out
