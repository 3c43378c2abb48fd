"""``explain`` for ComputeDomain devices: IMEX channels and daemon slots of the
``compute-domain.nvidia.com`` driver, published per node by ``gpudra compute-domain-node``.

Three things the GPU-centric explanation cannot say on its own:

- **The claim template a ComputeDomain stands for.** A Job names the channel
  ResourceClaimTemplate that ``gpudra controller`` makes from the domain; the input holds
  the domain, not the template. :func:`domain_templates` builds it as the controller does.
- **The wait after the allocation.** Channels carry the binding condition
  ``ComputeDomainReady`` (KEP-5007): the scheduler reserves the channel, then binds the pod
  only once the controller says the domain's IMEX daemon on that node is Ready.
- **Why a channel does not fit, in the domain's words:** no compute-domain pool on the node
  (the node daemon is not running), an empty pool (the NVLink fabric is not ready, or the
  node is in no multi-node NVLink clique), every channel or daemon slot taken, or a
  ``matchAttribute`` on ``cliqueID`` that devices of several cliques (or devices without the
  attribute) cannot meet.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpudra.scheduling.allocation_trace import Allocation, RequestTrace, is_usable
from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.explain_subjects import ExplainError, Subject
from gpudra.scheduling.validate import objects

# gpudra.api.compute_domain's names, repeated: that module loads pydantic, which explain
# imports only for an input that holds a ComputeDomain (tests pin these equal to it).
DRIVER_NAME = "compute-domain.nvidia.com"
CHANNEL_DEVICE_CLASS = "compute-domain-default-channel.nvidia.com"
DAEMON_DEVICE_CLASS = "compute-domain-daemon.nvidia.com"
DEVICE_TYPE_CHANNEL = "channel"
DEVICE_TYPE_DAEMON = "daemon"
ATTRIBUTE_TYPE = "type"
ATTRIBUTE_CLIQUE_ID = "cliqueID"
_GROUP, _KIND = "resource.nvidia.com", "ComputeDomain"

_KINDS = {CHANNEL_DEVICE_CLASS: DEVICE_TYPE_CHANNEL,
          DAEMON_DEVICE_CLASS: DEVICE_TYPE_DAEMON}
_WORDS = {DEVICE_TYPE_CHANNEL: "IMEX channel", DEVICE_TYPE_DAEMON: "IMEX daemon slot"}
_PLACEHOLDER_UIDS = uuid.UUID("5d0c7a52-1b1e-4f43-9a4e-2f6b4f0d9c11")
"""Namespace of the uids given to input ComputeDomains that have none (not yet created)."""


def device_classes() -> list[dict[str, Any]]:
    """The two DeviceClasses the chart ships with ``computeDomains.enabled``."""
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
             "metadata": {"name": name},
             "spec": {"selectors": [{"cel": {"expression": (
                 f"device.driver == '{DRIVER_NAME}' && device.attributes"
                 f"['{DRIVER_NAME}'].{ATTRIBUTE_TYPE} == '{kind}'")}}]}}
            for name, kind in _KINDS.items()]


def domain_templates(documents: Iterable[Any]) -> list[dict[str, Any]]:
    """The channel ResourceClaimTemplate of every ComputeDomain in the documents (as
    ``gpudra controller`` creates it), unless the documents hold one of that name."""
    items = list(objects(documents))
    domains = [o for o in items if o.get("kind") == _KIND
               and str(o.get("apiVersion", "")).startswith(_GROUP + "/")]
    if not domains:
        return []
    from gpudra.api import compute_domain as cd
    from gpudra.controller.compute_domains.objects import Settings, channel_template

    have = {str((o.get("metadata") or {}).get("name")) for o in items
            if o.get("kind") == "ResourceClaimTemplate"}
    made: list[dict[str, Any]] = []
    for obj in domains:
        meta = dict(obj.get("metadata") or {})
        namespace = str(meta.get("namespace") or "")
        # Not created yet: a stable stand-in uid (the controller's template carries the
        # domain's uid in its config); the namespace only matters for the model.
        meta.setdefault("uid", str(uuid.uuid5(_PLACEHOLDER_UIDS,
                                              f"{namespace}/{meta.get('name')}")))
        meta["namespace"] = namespace or "default"
        try:
            domain = cd.parse_compute_domain({**obj, "metadata": meta})
        except cd.ComputeDomainError as exc:
            raise ExplainError(str(exc)) from exc
        template = channel_template(domain, Settings(namespace="", daemon_image=""))
        name = str(template["metadata"]["name"])
        if name in have:
            continue
        have.add(name)
        template["metadata"] = {"name": name, **({"namespace": namespace} if namespace else {})}
        made.append(template)
    return made


# --- the verdict, in ComputeDomain words ---------------------------------------------------

def _kind_of(trace: RequestTrace, allocator: Allocator) -> str | None:
    """channel/daemon when the request's class selects compute-domain devices."""
    if trace.device_class in _KINDS:
        return _KINDS[trace.device_class]
    selectors = ((allocator.classes.get(trace.device_class) or {}).get("spec") or {}).get(
        "selectors") or []
    text = " ".join(str((s.get("cel") or {}).get("expression", "")) for s in selectors)
    if DRIVER_NAME not in text:
        return None
    for kind in (DEVICE_TYPE_CHANNEL, DEVICE_TYPE_DAEMON):
        if f"'{kind}'" in text:
            return kind
    return DEVICE_TYPE_CHANNEL


def _devices(allocator: Allocator, node: str) -> list[Mapping[str, Any]] | None:
    """The node's compute-domain devices; None when it has no such pool."""
    found: list[Mapping[str, Any]] | None = None
    for pool in allocator.index.pools:
        if pool.driver != DRIVER_NAME or pool.name != node:
            continue
        found = found or []
        for obj in pool.slices:
            found.extend((obj.get("spec") or {}).get("devices") or [])
    return found


def _attribute(device: Mapping[str, Any], name: str) -> Any:
    value = (device.get("attributes") or {}).get(name) or {}
    return next(iter(value.values()), None) if isinstance(value, Mapping) else None


def _why_not(trace: RequestTrace, kind: str, node: str, allocator: Allocator) -> str | None:
    """This node's reason, in ComputeDomain words; None when the reason lies elsewhere."""
    if trace.device_class in _KINDS and trace.device_class not in allocator.classes:
        return (f"DeviceClass {trace.device_class} does not exist: the chart installs it, "
                "and runs gpudra compute-domain-node, with computeDomains.enabled")
    devices = _devices(allocator, node)
    word = _WORDS[kind]
    if devices is None:
        return (f"no {DRIVER_NAME} devices on the node: gpudra compute-domain-node does "
                "not run there (chart: computeDomains.enabled), or its GPUs have no "
                "multi-node NVLink (not a GB200-class node)")
    if not any(_attribute(d, ATTRIBUTE_TYPE) == kind for d in devices):
        return (f"the node publishes no {word}s: its NVLink fabric is not ready, or it is in "
                "no multi-node NVLink clique (gpudra compute-domain-node publishes them only "
                "once the fabric manager has registered the node's GPUs in a clique)")
    outcomes = [o for o in trace.outcomes if o.device[0] == DRIVER_NAME]
    if any(is_usable(o) for o in outcomes):
        return _clique_constraint(trace)
    taken = [o for o in outcomes if o.code == "allocated"]
    mine = [d for d in devices if _attribute(d, ATTRIBUTE_TYPE) == kind]
    if taken and len(taken) >= len(mine):
        if kind == DEVICE_TYPE_DAEMON:
            return (f"all {len(mine)} IMEX daemon slots of the node are taken: as many "
                    "ComputeDomains already have an IMEX daemon there (--daemons of gpudra "
                    "compute-domain-node)")
        return (f"all {len(mine)} IMEX channels of the node are allocated to other claims "
                "(--channels of gpudra compute-domain-node)")
    return None


def _clique_constraint(trace: RequestTrace) -> str | None:
    """A matchAttribute on cliqueID that rejected usable devices: channels of two cliques,
    or devices of another driver (GPUs tied to a channel's clique publish no cliqueID)."""
    for outcome in trace.outcomes:
        if outcome.code == "constraint" and ATTRIBUTE_CLIQUE_ID in outcome.reason:
            return (f"matchAttribute on {DRIVER_NAME}/{ATTRIBUTE_CLIQUE_ID} cannot be "
                    f"met: the devices are in different NVLink cliques, or some publish no "
                    f"cliqueID ({outcome.reason})")
    return None


def _binding(allocation: Allocation, allocator: Allocator) -> list[str]:
    """The allocated devices that make the scheduler wait before binding."""
    raw: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for pool in allocator.index.pools:
        if pool.driver == DRIVER_NAME and pool.name == allocation.node:
            for obj in pool.slices:
                for device in (obj.get("spec") or {}).get("devices") or []:
                    raw[(pool.driver, pool.name, str(device.get("name")))] = device
    waits = []
    for result in allocation.results or []:
        for item in result["devices"]["results"]:
            device = raw.get((item["driver"], item["pool"], item["device"]))
            if device is None or not device.get("bindingConditions"):
                continue
            ready = ", ".join(device["bindingConditions"])
            failed = ", ".join(device.get("bindingFailureConditions") or [])
            waits.append(
                f"{item['device']} of node {allocation.node} ({DRIVER_NAME}, published by "
                f"gpudra compute-domain-node) has binding conditions {ready}: the scheduler "
                f"reserves it, then binds the pod only once gpudra controller sets {ready} on "
                f"the claim, when the ComputeDomain's IMEX daemon on {allocation.node} is Ready"
                + (f" ({failed} instead ends the wait with the daemon's failure)"
                   if failed else ""))
    return waits


def compute_domain_verdict(allocations: Sequence[Allocation], fitting: Sequence[Allocation],
                           allocator: Allocator, verdict: str) -> tuple[str, list[str]]:
    """The verdict and hints, told in ComputeDomain words when the claims ask for
    compute-domain devices (the traces say which requests do); unchanged otherwise."""
    if fitting:
        waits = _binding(fitting[0], allocator)
        if not waits or not verdict.startswith("ALLOCATABLE"):
            return verdict, waits
        return (f"{verdict}; then WAITS for ComputeDomainReady (the ComputeDomain's IMEX "
                f"daemon on {fitting[0].node} Ready) before the pod binds"), waits
    reasons: Counter[str] = Counter()
    for allocation in allocations:
        found = None
        for trace in allocation.requests:
            kind = _kind_of(trace, allocator)
            found = (_why_not(trace, kind, allocation.node, allocator) if kind is not None
                     else _clique_constraint(trace))
            if found:
                break
        if found:
            reasons[found] += 1
    if not reasons:
        return verdict, []
    reason, count = reasons.most_common(1)[0]
    total = len(allocations)
    where = "" if total == 1 else (f" (on {count} of {total} nodes)" if count < total
                                   else f" (on all {total} nodes)")
    hints = [f"{r} (on {n} node{'s' if n != 1 else ''})" for r, n in reasons.most_common()[1:]]
    scheduler = verdict.removeprefix("NOT ALLOCATABLE: ")
    hints.append(f"the allocator's own words: {scheduler}")
    return f"NOT ALLOCATABLE: {reason}{where}", hints


# --- the configs, as the node side reads them at prepare ------------------------------------

_CONFIG_KINDS = {DEVICE_TYPE_CHANNEL: "ComputeDomainChannelConfig",
                 DEVICE_TYPE_DAEMON: "ComputeDomainDaemonConfig"}
_API_VERSION = f"{_GROUP}/v1beta1"


def _config_problem(params: Any, kind: str, where: str) -> str | None:
    """What ``gpudra compute-domain-node`` says of one config at prepare, if it refuses."""
    wanted = _CONFIG_KINDS[kind]
    if not isinstance(params, Mapping) or params.get("apiVersion") != _API_VERSION:
        return f"{where}: expected apiVersion {_API_VERSION}"
    if params.get("kind") != wanted:
        return (f"{where}.kind: {params.get('kind')!r} does not configure {kind} devices "
                f"(want {wanted})")
    from gpudra.api import compute_domain as cd

    try:
        (cd.parse_channel_config if kind == DEVICE_TYPE_CHANNEL else cd.parse_daemon_config)(
            dict(params))
    except cd.ComputeDomainError as exc:
        return f"{where}: {exc}"
    return None


def config_problems(subject: Subject, allocation: Allocation) -> list[str]:
    """Per claim with compute-domain devices in the allocation: the one config naming its
    domain, as the node side wants it (a claim written by hand often has none)."""
    found: list[str] = []
    for index, (claim, result) in enumerate(zip(subject.claims, allocation.results or [],
                                                strict=False)):
        title, prefix = subject.source(index)
        wanted: dict[str, set[str]] = {}
        for item in result["devices"]["results"]:
            if item["driver"] == DRIVER_NAME:
                kind = str(item["device"]).partition("-")[0]
                if kind in _CONFIG_KINDS:
                    wanted.setdefault(kind, set()).add(str(item["request"]).split("/")[0])
        configs = ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
        for kind, requests in sorted(wanted.items()):
            domains, problems = set(), []
            for i, config in enumerate(configs):
                opaque = config.get("opaque") if isinstance(config, Mapping) else None
                if not isinstance(opaque, Mapping) or opaque.get("driver") != DRIVER_NAME:
                    continue
                applies = {str(r).split("/")[0] for r in config.get("requests") or []}
                if applies and not applies & requests:
                    continue
                params = opaque.get("parameters")
                problem = _config_problem(params, kind, f"{prefix}.config[{i}].opaque."
                                                        "parameters")
                if problem:
                    problems.append(f"{title}: {problem}")
                elif isinstance(params, Mapping):
                    domains.add(str(params.get("domainID")))
            found.extend(problems)
            if not problems and not domains:
                found.append(
                    f"{title}: {prefix}.config: no {_CONFIG_KINDS[kind]} for driver "
                    f"{DRIVER_NAME} and request {', '.join(sorted(requests))} (which "
                    "ComputeDomain?): " + (
                        "use the ResourceClaimTemplate the ComputeDomain names"
                        if kind == DEVICE_TYPE_CHANNEL else
                        "daemon claims come from the template gpudra controller makes"))
            elif len(domains) > 1:
                found.append(f"{title}: {prefix}.config: its configs name several "
                             f"ComputeDomains ({', '.join(sorted(domains))})")
    return found
