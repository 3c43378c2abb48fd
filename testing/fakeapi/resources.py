"""The resource types this server serves: URL names, kinds, scope, field labels, quantity
fields, and the validation / preparation hooks of each.

Adding a resource is one ``ResourceType`` entry; routing, discovery, storage, watch and
patching are generic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudra.testing.fakeapi import quantity
from gpudra.testing.fakeapi.claim_validation import (
    validate_claim,
    validate_claim_status,
    validate_claim_template,
    validate_device_class,
)
from gpudra.testing.fakeapi.crd_validation import (
    validate_compute_domain,
    validate_compute_domain_status,
)
from gpudra.testing.fakeapi.errors import FieldError
from gpudra.testing.fakeapi.selectors import FieldGetter, path_getter
from gpudra.testing.fakeapi.slice_validation import validate_resource_slice

Obj = dict[str, Any]
Validator = Callable[[Obj, Obj | None], list[FieldError]]
StatusValidator = Callable[[Obj, Obj], list[FieldError]]
Preparer = Callable[[Obj, Obj | None, str], None]

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    field_labels: Mapping[str, FieldGetter] = field(default_factory=dict)
    # Paths of quantity fields; "*" walks every map value, "[]" every list item.
    quantity_paths: tuple[tuple[str, ...], ...] = ()
    validate: Validator | None = None
    validate_status: StatusValidator | None = None
    prepare: Preparer | None = None  # strategy PrepareForCreate/Update (server-set fields)
    reset_status_on_create: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        return f"{self.group}/{self.plural}"

    @property
    def qualified_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def gvr(self) -> str:
        return f"{self.api_version}, Resource={self.plural}"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def field_getters(self) -> dict[str, FieldGetter]:
        getters = {"metadata.name": path_getter("metadata", "name")}
        if self.namespaced:
            getters["metadata.namespace"] = path_getter("metadata", "namespace")
        getters.update(self.field_labels)
        return getters

    def canonicalize(self, obj: Obj) -> None:
        """Rewrite quantity fields in place as the apiserver stores them (may raise)."""
        for path in self.quantity_paths:
            _rewrite(obj, path, quantity.canonical)


def _rewrite(node: Any, path: tuple[str, ...], fn: Callable[[Any], str]) -> None:
    if not path:
        return
    head, rest = path[0], path[1:]
    children: list[tuple[Any, Any]]
    if head == "[]":
        children = list(enumerate(node)) if isinstance(node, list) else []
    elif head == "*":
        children = list(node.items()) if isinstance(node, dict) else []
    else:
        children = [(head, node[head])] if isinstance(node, dict) and head in node else []
    for key, child in children:
        if not rest:
            if child is not None:
                node[key] = fn(child)
        else:
            _rewrite(child, rest, fn)


def _prepare_slice(obj: Obj, old: Obj | None, now: str) -> None:
    """Taints get ``timeAdded`` from the server when the client left it out.

    An unchanged taint keeps the time it had, so updates don't make taints look new.
    """
    old_devices = {d.get("name"): d for d in ((old or {}).get("spec") or {}).get("devices") or []
                   if isinstance(d, dict)}
    for device in (obj.get("spec") or {}).get("devices") or []:
        if not isinstance(device, dict):
            continue
        old_taints = (old_devices.get(device.get("name")) or {}).get("taints") or []
        for taint in device.get("taints") or []:
            if not isinstance(taint, dict) or taint.get("timeAdded"):
                continue
            same = [t for t in old_taints if isinstance(t, dict) and all(
                t.get(k) == taint.get(k) for k in ("key", "value", "effect"))]
            taint["timeAdded"] = (same[0].get("timeAdded") if same else None) or now


_CLAIM_QUANTITIES = (
    ("spec", "devices", "requests", "[]", "exactly", "capacity", "requests", "*"),
    ("spec", "devices", "requests", "[]", "firstAvailable", "[]", "capacity", "requests", "*"),
    ("status", "allocation", "devices", "results", "[]", "consumedCapacity", "*"),
)

_DEVICE = ("spec", "devices", "[]")
RESOURCE_SLICES = ResourceType(
    "resource.k8s.io", "v1", "resourceslices", "resourceslice", "ResourceSlice", False,
    field_labels={"spec.driver": path_getter("spec", "driver"),
                  "spec.nodeName": path_getter("spec", "nodeName"),
                  "spec.pool.name": path_getter("spec", "pool", "name")},
    quantity_paths=(
        (*_DEVICE, "capacity", "*", "value"),
        (*_DEVICE, "capacity", "*", "requestPolicy", "default"),
        (*_DEVICE, "capacity", "*", "requestPolicy", "validValues", "[]"),
        (*_DEVICE, "capacity", "*", "requestPolicy", "validRange", "min"),
        (*_DEVICE, "capacity", "*", "requestPolicy", "validRange", "max"),
        (*_DEVICE, "capacity", "*", "requestPolicy", "validRange", "step"),
        (*_DEVICE, "consumesCounters", "[]", "counters", "*", "value"),
        ("spec", "sharedCounters", "[]", "counters", "*", "value"),
    ),
    validate=validate_resource_slice,
    prepare=_prepare_slice,
)
RESOURCE_CLAIMS = ResourceType(
    "resource.k8s.io", "v1", "resourceclaims", "resourceclaim", "ResourceClaim", True,
    subresources=("status",), quantity_paths=_CLAIM_QUANTITIES, validate=validate_claim,
    validate_status=validate_claim_status, reset_status_on_create=True)
RESOURCE_CLAIM_TEMPLATES = ResourceType(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "resourceclaimtemplate",
    "ResourceClaimTemplate", True,
    quantity_paths=tuple(("spec", *p) for p in _CLAIM_QUANTITIES[:2]),
    validate=validate_claim_template)
DEVICE_CLASSES = ResourceType(
    "resource.k8s.io", "v1", "deviceclasses", "deviceclass", "DeviceClass", False,
    validate=validate_device_class)
DEVICE_TAINT_RULES = ResourceType(
    "resource.k8s.io", "v1", "devicetaintrules", "devicetaintrule", "DeviceTaintRule", False,
    subresources=("status",))
NODES = ResourceType(
    "", "v1", "nodes", "node", "Node", False, subresources=("status",), short_names=("no",),
    field_labels={"spec.unschedulable": path_getter("spec", "unschedulable")},
    quantity_paths=(("status", "capacity", "*"), ("status", "allocatable", "*")))
PODS = ResourceType(
    "", "v1", "pods", "pod", "Pod", True, subresources=("status",), short_names=("po",),
    field_labels={"spec.nodeName": path_getter("spec", "nodeName"),
                  "spec.schedulerName": path_getter("spec", "schedulerName"),
                  "spec.serviceAccountName": path_getter("spec", "serviceAccountName"),
                  "status.phase": path_getter("status", "phase"),
                  "status.podIP": path_getter("status", "podIP"),
                  "status.nominatedNodeName": path_getter("status", "nominatedNodeName")})
NAMESPACES = ResourceType(
    "", "v1", "namespaces", "namespace", "Namespace", False, subresources=("status",),
    short_names=("ns",), field_labels={"status.phase": path_getter("status", "phase")})
CORE_EVENTS = ResourceType(
    "", "v1", "events", "event", "Event", True, short_names=("ev",),
    field_labels={f"involvedObject.{k}": path_getter("involvedObject", k)
                  for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion",
                            "fieldPath")}
    | {"reason": path_getter("reason"), "type": path_getter("type"),
       "reportingComponent": path_getter("reportingComponent"),
       "source": path_getter("source", "component")})
EVENTS = ResourceType(
    "events.k8s.io", "v1", "events", "event", "Event", True, short_names=("ev",),
    field_labels={f"regarding.{k}": path_getter("regarding", k)
                  for k in ("kind", "namespace", "name", "uid", "apiVersion")}
    | {"reason": path_getter("reason"), "type": path_getter("type"),
       "reportingController": path_getter("reportingController")})
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "lease", "Lease", True)
COMPUTE_DOMAINS = ResourceType(
    "resource.nvidia.com", "v1beta1", "computedomains", "computedomain", "ComputeDomain", True,
    subresources=("status",), validate=validate_compute_domain,
    validate_status=validate_compute_domain_status)

REGISTRY: tuple[ResourceType, ...] = (
    RESOURCE_SLICES, RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES, DEVICE_CLASSES,
    DEVICE_TAINT_RULES, NODES, PODS, NAMESPACES, CORE_EVENTS, EVENTS, LEASES,
    COMPUTE_DOMAINS,
)


def find(group: str, version: str, plural: str) -> ResourceType | None:
    for rt in REGISTRY:
        if (rt.group, rt.version, rt.plural) == (group, version, plural):
            return rt
    return None


def lookup(name: str) -> ResourceType:
    """Resolve a test helper's ``kind`` argument: Kind, plural, singular or "plural.group".

    ``Event`` / ``events`` mean the core/v1 events; use ``events.events.k8s.io`` for the other.
    """
    for rt in REGISTRY:
        if name in (rt.kind, rt.plural, rt.singular, rt.qualified_resource, rt.key):
            return rt
    raise KeyError(f"unknown resource {name!r}; known: "
                   + ", ".join(rt.qualified_resource for rt in REGISTRY))
