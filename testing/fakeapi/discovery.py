"""Discovery documents (``/api``, ``/apis``, ``/apis/<g>``, ``/apis/<g>/<v>``, ``/version``):
minimal but valid for the client's models, derived from the resource registry."""

from __future__ import annotations

from typing import Any

from gpudra.testing.fakeapi.resources import REGISTRY, VERBS, ResourceType
from gpudra.testing.fakeapi.versions import GROUP, HUB, MODES, Served

Obj = dict[str, Any]

KUBERNETES_VERSION = MODES["v1"].kubernetes


def _groups(served: Served) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for rt in REGISTRY:
        if not rt.group:
            continue
        versions = groups.setdefault(rt.group, [])
        if rt.group == GROUP:
            # Most preferred first: the first listed is the group's preferredVersion.
            versions.extend(v for v in served.versions if v not in versions)
        elif rt.version not in versions:
            versions.append(rt.version)
    return groups


def _served_types(served: Served, group: str, version: str) -> list[ResourceType]:
    """The types ``group/version`` lists: a beta of resource.k8s.io lists the v1 types it
    serves under its own version."""
    stored = HUB if group == GROUP else version
    return [rt for rt in REGISTRY if (rt.group, rt.version) == (group, stored)
            and served.serves(group, version, rt.plural)]


def _api_group(name: str, versions: list[str]) -> Obj:
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def document(path: str, address: str, served: Served = MODES["v1"]) -> Obj | None:
    """The discovery document at ``path``, or None if there is none."""
    path = "/" + path.strip("/")
    if path == "/version":
        major, minor = served.kubernetes
        return {"major": major, "minor": minor, "emulationMajor": major, "emulationMinor": minor,
                "gitVersion": f"v{major}.{minor}.0-fakeapi", "gitCommit": "",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.25.0", "compiler": "gc", "platform": "linux/amd64"}
    if path == "/api":
        return {"kind": "APIVersions", "apiVersion": "v1", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                "serverAddress": address}]}
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1",
                "groups": [_api_group(g, vs) for g, vs in _groups(served).items()]}
    parts = path.strip("/").split("/")
    groups = _groups(served)
    if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
        return {"kind": "APIGroup", "apiVersion": "v1", **_api_group(parts[1], groups[parts[1]])}
    if path == "/api/v1":
        return _resource_list(served, "", "v1")
    if len(parts) == 3 and parts[0] == "apis" and parts[2] in groups.get(parts[1], []):
        return _resource_list(served, parts[1], parts[2])
    return None


def _resource_list(served: Served, group: str, version: str) -> Obj:
    resources: list[Obj] = []
    for rt in _served_types(served, group, version):
        entry: Obj = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                      "kind": rt.kind, "verbs": VERBS}
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        resources.append(entry)
        for sub in rt.subresources:
            resources.append({"name": f"{rt.plural}/{sub}", "singularName": "",
                              "namespaced": rt.namespaced, "kind": rt.kind,
                              "verbs": ["get", "patch", "update"]})
    group_version = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": resources}
