"""Events on a ComputeDomain (``events.k8s.io/v1``), so ``kubectl describe`` says when a
node's daemon failed or the domain became Ready. Best effort: an Event that cannot be
written is logged, never retried."""

from __future__ import annotations

import uuid
from datetime import datetime

import structlog

from gpudra.api import compute_domain as cd
from gpudra.controller.compute_domains.leader import micro_time
from gpudra.controller.compute_domains.resources import DOMAIN_EVENTS
from gpudra.kube.errors import ApiCallError
from gpudra.kube.raw_api import RawApi

log = structlog.get_logger(__name__)

CONTROLLER: str = "gpudra.io/compute-domain-controller"


async def domain_event(api: RawApi, domain: cd.ComputeDomain, *, kind: str, reason: str,
                       note: str, action: str, instance: str, now: datetime) -> None:
    meta = domain.metadata
    body = {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": f"{meta.name[:200]}.{uuid.uuid4().hex[:16]}",
                     "namespace": meta.namespace},
        "eventTime": micro_time(now), "type": kind, "reason": reason, "note": note[:1024],
        "action": action, "reportingController": CONTROLLER,
        "reportingInstance": instance[:128],
        "regarding": {"apiVersion": cd.API_VERSION, "kind": cd.KIND, "name": meta.name,
                      "namespace": meta.namespace, "uid": meta.uid},
    }
    try:
        await api.create(DOMAIN_EVENTS, body, namespace=meta.namespace)
    except ApiCallError as error:
        log.warning("could not write an Event", domain=domain.key, reason=reason,
                    error=str(error))
