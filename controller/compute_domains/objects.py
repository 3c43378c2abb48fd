"""The objects a ComputeDomain owns, built from the domain and the controller's settings.

* the channel ResourceClaimTemplate, in the domain's namespace, under the name the spec
  gives, owned by the domain (ownerReference: the garbage collector removes it with it);
* the daemon ResourceClaimTemplate, in the driver namespace (``imex-<uid>``);
* one IMEX daemon Pod per (domain, node), in the driver namespace, pinned to its node by
  required node affinity on ``metadata.name`` as the DaemonSet controller pins pods: a Pod
  created with ``spec.nodeName`` would skip the scheduler, and nothing would allocate its
  daemon claim.

Objects outside the domain's namespace cannot have it as owner, so every object carries the
domain's uid in the label ``resource.nvidia.com/computeDomain`` and the controller deletes
by that label.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Final

from gpudra.api import compute_domain as cd
from gpudra.api.name_formats import label_value_errors

Obj = dict[str, Any]

CHANNEL_REQUEST: Final = "channel"
DAEMON_REQUEST: Final = "daemon"
DAEMON_CLAIM: Final = "daemon"
DAEMON_CONTAINER: Final = "imex-daemon"
NODE_ANNOTATION: Final = cd.LABEL_NODE
"""The node's full name (a label value holds at most 63 characters; a node name more)."""
COMPONENT: Final = "imex-daemon"


@dataclass(frozen=True)
class Settings:
    """What the controller was told about the objects it makes and how long it waits."""

    namespace: str
    """The driver namespace: daemon pods and their claim templates live here."""
    daemon_image: str
    daemon_service_account: str = ""
    daemon_priority_class: str = ""
    """The daemon pods' PriorityClass: they should not queue behind the very workload pods
    that wait for them."""
    image_pull_policy: str = "IfNotPresent"
    daemon_command: tuple[str, ...] = ("gpudra", "compute-domain-daemon")
    ready_timeout: float = 300.0
    """Seconds a node's daemon may take to get Ready before its claims fail; under the
    scheduler's binding timeout (600 s by default), so a claim fails with a reason before
    the scheduler gives up without one."""
    crash_restarts: int = 3
    """Restarts after which a daemon container counts as crash-looping (0: never)."""
    restart_delay: float = 30.0
    """Seconds a Failed daemon pod is kept (its failure on the claims) before it is
    replaced."""
    labels: dict[str, str] = field(default_factory=dict)
    """Extra labels on every object the controller makes (the chart's)."""
    writes_at_once: int = 16
    """Independent writes of one reconcile (pod creates and deletes, claim status applies)
    in flight at once: a domain of hundreds of nodes is not brought up one API round trip
    after another, nor does it flood the API server."""


def daemon_template_name(domain_uid: str) -> str:
    return f"imex-{domain_uid}"


def node_hash(node: str) -> str:
    return hashlib.sha256(node.encode()).hexdigest()[:10]


def daemon_pod_name(domain_uid: str, node: str) -> str:
    return f"imex-{domain_uid}-{node_hash(node)}"


def node_label(node: str) -> str:
    """The node as a label value: its name when it fits, else its hash."""
    return node if not label_value_errors(node) else f"sha256-{node_hash(node)}"


def _labels(settings: Settings, domain: cd.ComputeDomain) -> dict[str, str]:
    return {**settings.labels, cd.LABEL_DOMAIN: domain.uid}


def channel_template(domain: cd.ComputeDomain, settings: Settings) -> Obj:
    spec = domain.spec.channel
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": spec.resource_claim_template.name,
            "namespace": domain.metadata.namespace,
            "labels": _labels(settings, domain),
            "ownerReferences": [{"apiVersion": cd.API_VERSION, "kind": cd.KIND,
                                 "name": domain.metadata.name, "uid": domain.uid,
                                 "controller": True}]},
        "spec": {"spec": {"devices": {
            "requests": [{"name": CHANNEL_REQUEST,
                          "exactly": {"deviceClassName": cd.CHANNEL_DEVICE_CLASS}}],
            "config": [{"requests": [CHANNEL_REQUEST], "opaque": {
                "driver": cd.DRIVER_NAME,
                "parameters": cd.channel_config(domain.uid, spec.allocation_mode)}}]}}},
    }


def daemon_template(domain: cd.ComputeDomain, settings: Settings) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": daemon_template_name(domain.uid), "namespace": settings.namespace,
                     "labels": _labels(settings, domain)},
        "spec": {"spec": {"devices": {
            "requests": [{"name": DAEMON_REQUEST,
                          "exactly": {"deviceClassName": cd.DAEMON_DEVICE_CLASS}}],
            "config": [{"requests": [DAEMON_REQUEST], "opaque": {
                "driver": cd.DRIVER_NAME, "parameters": cd.daemon_config(domain.uid)}}]}}},
    }


def _field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def daemon_pod(domain: cd.ComputeDomain, node: str, settings: Settings) -> Obj:
    meta = domain.metadata
    command = [*settings.daemon_command, "--domain-uid", domain.uid, "--domain-namespace",
               meta.namespace, "--domain-name", meta.name, "--node", node]
    spec: Obj = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
        # The daemon must run wherever the domain's workload landed, taints or not.
        "tolerations": [{"operator": "Exists"}],
        "restartPolicy": "Always",
        "containers": [{
            "name": DAEMON_CONTAINER, "image": settings.daemon_image,
            "imagePullPolicy": settings.image_pull_policy, "command": command,
            "env": [_field_env("NODE_NAME", "spec.nodeName"),
                    _field_env("POD_IP", "status.podIP"),
                    _field_env("POD_NAME", "metadata.name"),
                    _field_env("POD_NAMESPACE", "metadata.namespace")],
            "resources": {"claims": [{"name": DAEMON_CLAIM}]}}],
        "resourceClaims": [{"name": DAEMON_CLAIM,
                            "resourceClaimTemplateName": daemon_template_name(domain.uid)}],
    }
    if settings.daemon_service_account:
        spec["serviceAccountName"] = settings.daemon_service_account
    if settings.daemon_priority_class:
        spec["priorityClassName"] = settings.daemon_priority_class
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": daemon_pod_name(domain.uid, node), "namespace": settings.namespace,
            "labels": {**_labels(settings, domain), cd.LABEL_NODE: node_label(node),
                       "app.kubernetes.io/component": COMPONENT},
            "annotations": {NODE_ANNOTATION: node}},
        "spec": spec,
    }
