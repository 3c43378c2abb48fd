"""URL paths → (resource, namespace, name, subresource), and the Kubernetes verb of a request.

Paths are the real ones: ``/api/v1/...`` for the core group, ``/apis/<group>/<version>/...``
otherwise; ``namespaces/<ns>/<plural>`` for namespaced resources.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudra.testing.fakeapi.errors import method_not_allowed, page_not_found
from gpudra.testing.fakeapi.resources import ResourceType, find
from gpudra.testing.fakeapi.versions import HUB, MODES, Served


@dataclass(frozen=True)
class Route:
    resource: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    view: str | None = None
    """The ``resource.k8s.io`` version asked for when it is not the stored one (v1beta*)."""

    @property
    def audit_resource(self) -> str:
        """The resource as audit logs and RBAC name it: ``plural[/subresource]``."""
        sub = f"/{self.subresource}" if self.subresource else ""
        return self.resource.plural + sub


def parse(path: str, served: Served = MODES["v1"]) -> Route | None:
    """Route a resource path; None when it is not one (discovery, health, unknown).

    A ``resource.k8s.io`` version ``served`` lists is routed to the stored (v1) type, with
    the version asked for as the route's ``view``; one it does not list is not found."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    view = served.view(group, version)
    plural = rest[2] if rest[0] == "namespaces" and len(rest) >= 3 else rest[0]
    if not served.serves(group, version, plural):
        raise page_not_found()
    if view is not None:
        version = HUB
    route = _parse(group, version, rest)
    return Route(route.resource, route.namespace, route.name, route.subresource, view)


def _parse(group: str, version: str, rest: list[str]) -> Route:
    # namespaces/<ns>/<plural>/... is namespaced, unless <plural> is really a subresource of
    # the Namespace object itself (namespaces/<ns>/status).
    if rest[0] == "namespaces" and len(rest) >= 3:
        rt = find(group, version, rest[2])
        if rt is not None and rt.namespaced:
            return _route(rt, rest[1], rest[3:])
    rt = find(group, version, rest[0])
    if rt is None:
        raise page_not_found()
    if rt.namespaced:
        if len(rest) > 1:
            raise page_not_found()  # a named namespaced object needs its namespace
        return Route(rt, None, None, None)
    return _route(rt, "", rest[1:])


def _route(rt: ResourceType, namespace: str, rest: list[str]) -> Route:
    if len(rest) > 2:
        raise page_not_found()
    name = rest[0] if rest else None
    sub = rest[1] if len(rest) == 2 else None
    if sub is not None and sub not in rt.subresources:
        raise page_not_found()
    return Route(rt, namespace if rt.namespaced else None, name, sub)


def verb(method: str, route: Route, watch: bool) -> str:
    """The Kubernetes verb, or 405 for a method the path does not allow."""
    named = route.name is not None
    if method == "GET":
        if named:
            return "watch" if watch else "get"
        return "watch" if watch else "list"
    if method == "POST" and not named and route.subresource is None:
        if route.resource.namespaced and route.namespace is None:
            raise method_not_allowed(method, route.audit_resource)
        return "create"
    if method == "PUT" and named:
        return "update"
    if method == "PATCH" and named:
        return "patch"
    if method == "DELETE":
        if named and route.subresource is None:
            return "delete"
        if not named and not (route.resource.namespaced and route.namespace is None):
            return "deletecollection"
    raise method_not_allowed(method, route.audit_resource)
