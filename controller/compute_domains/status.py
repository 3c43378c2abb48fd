"""Status writes that never lose someone else's concurrent update.

* A ComputeDomain's status is shared: every node's IMEX daemon writes its own entry of
  ``status.nodes`` while the controller writes ``status.status`` and removes entries of nodes
  that left. The controller reads the object, changes only its own parts and PUTs it back to
  ``/status`` with the resourceVersion it read; a 409 (someone wrote in between) means read
  and change again. Nothing written by a daemon in between is overwritten.
* A claim's binding conditions go out by server-side apply to ``resourceclaims/status``
  under the controller's field manager: ``status.devices`` is a map keyed by (driver, pool,
  device, shareID), so other writers' entries and fields are left alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import structlog

from gpudra.controller.compute_domains.claims import ClaimKey
from gpudra.controller.compute_domains.resources import CLAIMS, COMPUTE_DOMAINS
from gpudra.kube.backoff import Backoff
from gpudra.kube.errors import Conflict, NotFound
from gpudra.kube.objects import Obj
from gpudra.kube.raw_api import RawApi

log = structlog.get_logger(__name__)

FIELD_MANAGER: Final = "gpudra-compute-domain-controller"
CONFLICT_ATTEMPTS: Final = 50
"""Tries of one status change against concurrent writers: each retry follows another
writer's success, so this bounds how many writes may overtake ours, not time."""

Mutation = Callable[[Obj], bool]
"""Changes a status in place; False when nothing needed to change (no write)."""


class StatusConflicts(Exception):
    """Other writers won ``CONFLICT_ATTEMPTS`` times in a row; the reconcile is retried."""


async def update_domain_status(api: RawApi, namespace: str, name: str, change: Mutation, *,
                               sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                               backoff: Backoff | None = None) -> Obj | None:
    """Apply ``change`` to the domain's current status and write it conditionally; the
    stored object, or None if the domain is gone."""
    backoff = backoff or Backoff(initial=0.005, cap=0.5)
    for _ in range(CONFLICT_ATTEMPTS):
        try:
            current = await api.get(COMPUTE_DOMAINS, name, namespace=namespace)
        except NotFound:
            return None
        status = dict(current.get("status") or {})
        if not change(status):
            return current
        try:
            return await api.replace(COMPUTE_DOMAINS, name, {**current, "status": status},
                                     namespace=namespace, subresource="status")
        except NotFound:
            return None
        except Conflict:
            await sleep(backoff.next())
    raise StatusConflicts(f"computedomain {namespace}/{name}: status write lost "
                          f"{CONFLICT_ATTEMPTS} races in a row")


def set_domain_status(wanted: str, prune: Iterable[str]) -> Mutation:
    """The controller's part of a domain's status: ``status.status`` and the removal of
    entries of nodes the domain has left."""
    gone = set(prune)

    def change(status: Obj) -> bool:
        nodes = status.get("nodes")
        kept = [n for n in nodes if not (isinstance(n, dict) and n.get("name") in gone)] \
            if isinstance(nodes, list) else nodes
        if status.get("status") == wanted and kept == nodes:
            return False
        status["status"] = wanted
        if isinstance(nodes, list):
            status["nodes"] = kept
        return True

    return change


async def apply_claim_devices(api: RawApi, claim: ClaimKey, entries: list[Obj]) -> Obj | None:
    """Server-side apply of the controller's ``status.devices`` entries of one claim; None
    if the claim is gone. The uid makes it a precondition: a claim deleted and made again
    under the same name is not written to."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
            "status": {"devices": entries}}
    try:
        return await api.apply(CLAIMS, claim.name, body, field_manager=FIELD_MANAGER,
                               namespace=claim.namespace, subresource="status", force=True)
    except NotFound:
        return None
