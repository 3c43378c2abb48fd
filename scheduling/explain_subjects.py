"""What ``explain`` allocates: claims, templates, and pods with all the claims they use.

A pod's claims are its ``resourceClaims`` plus, for extended resources a DeviceClass
provides (``resources.limits: {nvidia.com/gpu: 1}`` with a class that has
``extendedResourceName: nvidia.com/gpu``), the claim the scheduler makes for them
(``DRAExtendedResource``): one request ``container-<i>-request-<j>`` per container and
resource, as kube-scheduler names them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudra.api.quantity import QuantityError, parse_quantity
from gpudra.scheduling.validate import objects, pod_spec

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
"""Every DeviceClass also provides the extended resource ``<prefix><class name>``."""


class ExplainError(ValueError):
    """The input cannot be explained (nothing to allocate, a dangling reference …)."""


@dataclass
class Subject:
    """Claims the scheduler would allocate together: one claim, or all claims of a pod."""

    title: str
    claims: list[dict[str, Any]]
    unavailable: list[str] = field(default_factory=list)
    """Extended resources the pod asks for that no DeviceClass provides."""
    sources: list[tuple[str, str]] = field(default_factory=list)
    """Per claim: the object it comes from and the path of its ``devices`` in that object
    (``ResourceClaimTemplate ml/t``, ``spec.spec.devices``), for messages."""

    def source(self, index: int) -> tuple[str, str]:
        if index < len(self.sources):
            return self.sources[index]
        claim = self.claims[index]
        return _title("ResourceClaim", claim), "spec.devices"


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "<unnamed>")


def _title(kind: str, obj: Mapping[str, Any]) -> str:
    namespace = (obj.get("metadata") or {}).get("namespace")
    return f"{kind} {namespace + '/' if namespace else ''}{_name(obj)}"


def claim_from_template(template: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    meta = template.get("metadata") or {}
    spec = (template.get("spec") or {}).get("spec") or {}
    metadata = {"name": name or meta.get("name") or "<unnamed>"}
    if meta.get("namespace"):
        metadata["namespace"] = meta["namespace"]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": metadata, "spec": dict(spec)}


# --- extended resources ---------------------------------------------------------------

def extended_resource_classes(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name → DeviceClass name, as the scheduler maps them.

    Every class provides ``deviceclass.resource.kubernetes.io/<name>``; for an explicit
    ``extendedResourceName`` several classes share, the newest wins, then the first name.
    """
    mapping: dict[str, str] = {}
    explicit: dict[str, tuple[str, str]] = {}
    for device_class in classes:
        meta = device_class.get("metadata") or {}
        name = str(meta.get("name", ""))
        mapping[IMPLICIT_PREFIX + name] = name
        resource = (device_class.get("spec") or {}).get("extendedResourceName")
        if not resource:
            continue
        created = str(meta.get("creationTimestamp") or "")
        current = explicit.get(str(resource))
        # RFC 3339 timestamps of one format order as text.
        if current is None or created > current[0] or (created == current[0]
                                                       and name < current[1]):
            explicit[str(resource)] = (created, name)
    mapping.update({resource: name for resource, (_, name) in explicit.items()})
    return mapping


def _is_extended(resource: str) -> bool:
    """``IsDRAExtendedResourceName``: not a native resource (no domain, or kubernetes.io)."""
    if resource.startswith(IMPLICIT_PREFIX):
        return True
    return "/" in resource and "kubernetes.io/" not in resource and \
        not resource.startswith("requests.")


def _requests(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's requests, defaulted from its limits as the API server does."""
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def _count(value: Any) -> int:
    try:
        amount = parse_quantity(value if isinstance(value, int) else str(value))
    except QuantityError:
        return 0
    return int(amount) if amount.denominator == 1 else 0


def extended_resource_claim(pod: Mapping[str, Any], spec: Mapping[str, Any],
                            classes: Mapping[str, str]) -> tuple[dict[str, Any] | None,
                                                                 list[str]]:
    """The claim the scheduler makes for the pod's extended resources (None: no such
    resources), and the extended resources no DeviceClass provides."""
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    requests: list[dict[str, Any]] = []
    unavailable: list[str] = []
    for i, container in enumerate(c for c in containers if isinstance(c, Mapping)):
        wanted = _requests(container)
        for j, resource in enumerate(sorted(wanted)):
            count = _count(wanted[resource])
            if not _is_extended(resource) or count <= 0:
                continue
            if resource not in classes:
                unavailable.append(resource)
                continue
            requests.append({"name": f"container-{i}-request-{j}", "exactly": {
                "deviceClassName": classes[resource], "allocationMode": "ExactCount",
                "count": count}})
    if not requests:
        return None, list(dict.fromkeys(unavailable))
    metadata = {"name": f"{_name(pod)}-extended-resources"}
    namespace = (pod.get("metadata") or {}).get("namespace")
    if namespace:
        metadata["namespace"] = namespace
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
             "spec": {"devices": {"requests": sorted(requests, key=lambda r: r["name"])}}}
    return claim, list(dict.fromkeys(unavailable))


# --- subjects -------------------------------------------------------------------------

def subjects(documents: Iterable[Any], device_classes: Iterable[Mapping[str, Any]] = (),
             ) -> tuple[list[Subject], list[dict[str, Any]]]:
    """The claims to explain and the DeviceClasses found in the documents.

    Pods (and workloads with a pod template) are explained with all their claims together;
    claims and templates a pod uses are not explained a second time on their own.
    ``device_classes`` (the cluster's) and the documents' classes say which extended
    resources DRA provides.
    """
    items = list(objects(documents))
    classes = [dict(o) for o in items if o.get("kind") == "DeviceClass"]
    claims = {_name(o): o for o in items if o.get("kind") == "ResourceClaim"}
    templates = {_name(o): o for o in items if o.get("kind") == "ResourceClaimTemplate"}
    by_name = {_name(c): c for c in [*device_classes, *classes]}
    extended = extended_resource_classes(by_name.values())
    used: set[tuple[str, str]] = set()
    found: list[Subject] = []
    for obj in items:
        spec = _pod_template_spec(obj)
        if spec is None:
            continue
        title = _title(str(obj.get("kind")), obj)
        pod_claims: list[dict[str, Any]] = []
        sources: list[tuple[str, str]] = []
        for entry in spec.get("resourceClaims") or []:
            claim, origin = _pod_claim(obj, entry, claims, templates, used)
            pod_claims.append(claim)
            sources.append(origin)
        extra, unavailable = extended_resource_claim(obj, spec, extended)
        if extra is not None:
            pod_claims.append(extra)
            sources.append((f"the extended resources of {title}", "spec.devices"))
        if pod_claims or unavailable:
            found.append(Subject(title, pod_claims, unavailable, sources))
    for name, claim_obj in claims.items():
        if ("claim", name) not in used:
            title = _title("ResourceClaim", claim_obj)
            found.append(Subject(title, [dict(claim_obj)], sources=[(title, "spec.devices")]))
    for name, template in templates.items():
        if ("template", name) not in used:
            title = _title("ResourceClaimTemplate", template)
            found.append(Subject(title, [claim_from_template(template)],
                                 sources=[(title, "spec.spec.devices")]))
    if not found:
        raise ExplainError("nothing to explain: no ResourceClaim, ResourceClaimTemplate or Pod "
                           "with resourceClaims or extended resources in the input")
    return found, classes


def _pod_template_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The spec of a Pod, or of the pod template of a Deployment, Job … (with or without
    resourceClaims: extended resources need none)."""
    found = pod_spec(obj)
    if found is not None:
        return found
    spec = obj.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    inner = template.get("spec") if isinstance(template, Mapping) else None
    return inner if isinstance(inner, Mapping) and inner.get("containers") else None


def _pod_claim(pod: Mapping[str, Any], entry: Mapping[str, Any],
               claims: Mapping[str, Mapping[str, Any]],
               templates: Mapping[str, Mapping[str, Any]],
               used: set[tuple[str, str]]) -> tuple[dict[str, Any], tuple[str, str]]:
    """The claim a ``resourceClaims`` entry names, and where it comes from."""
    if entry.get("resourceClaimTemplateName"):
        name = str(entry["resourceClaimTemplateName"])
        if name not in templates:
            raise ExplainError(f"{_title(str(pod.get('kind')), pod)} uses ResourceClaimTemplate "
                               f"{name}, which is not in the input")
        used.add(("template", name))
        claim = claim_from_template(templates[name], f"{_name(pod)}-{entry.get('name')}")
        namespace = (pod.get("metadata") or {}).get("namespace")
        if namespace:
            claim["metadata"]["namespace"] = namespace
        return claim, (_title("ResourceClaimTemplate", templates[name]), "spec.spec.devices")
    name = str(entry.get("resourceClaimName", ""))
    if name not in claims:
        raise ExplainError(f"{_title(str(pod.get('kind')), pod)} uses ResourceClaim {name}, "
                           "which is not in the input")
    used.add(("claim", name))
    return dict(claims[name]), (_title("ResourceClaim", claims[name]), "spec.devices")
