"""Whole lists read from a cluster, page by page, for the command-line tools: through the
same loader (:func:`gpudra.kube.kubeconfig.resolve`) and transport as the node daemon."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gpudra.kube.kubeconfig import ClusterAccess
from gpudra.kube.objects import Obj
from gpudra.kube.raw_api import RawApi, Resource
from gpudra.kube.session import ApiSession

PAGE = 250
"""Objects per LIST page: a page stays well inside the client's body limit."""


def read_lists(access: ClusterAccess, resources: Sequence[Resource], *,
               timeout: float = 30.0) -> list[list[Obj]]:
    """Every object of each resource (of every namespace), raw JSON; an
    :class:`~gpudra.kube.errors.ApiCallError` when a call fails."""
    return asyncio.run(_read(access, resources, timeout))


async def _read(access: ClusterAccess, resources: Sequence[Resource],
                per_call: float) -> list[list[Obj]]:
    # auto: a 1.32 or 1.33 cluster's slices and claims are read in the version it serves,
    # and come back in v1's shape like a newer cluster's.
    async with ApiSession(access.connection, resource_api="auto") as session:
        api = RawApi(session, timeout=per_call)
        return [await _all(api, resource) for resource in resources]


async def _all(api: RawApi, resource: Resource) -> list[Obj]:
    items: list[Obj] = []
    token = ""
    while True:
        body = await api.list(resource, limit=PAGE, continue_from=token)
        items.extend(i for i in body.get("items") or [] if isinstance(i, dict))
        token = str((body.get("metadata") or {}).get("continue") or "")
        if not token:
            return items
