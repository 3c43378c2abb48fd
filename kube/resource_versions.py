"""Which ``resource.k8s.io`` version to speak, and the older versions' shapes.

Everything above this layer reads and writes ``resource.k8s.io`` objects in the ``v1``
shape (Kubernetes 1.34+). A cluster that still runs 1.33 serves ``v1beta2`` (and
``v1beta1``), one that runs 1.32 only ``v1beta1``. The session learns once, on its first
``resource.k8s.io`` call, which of them the server serves (``GET /apis/resource.k8s.io``)
and takes the first of ``v1``, ``v1beta2``, ``v1beta1`` that it does (the order the Go
client and NVIDIA's chart use), or the one the admin pinned (``--resource-api-version``,
chart value ``resourceApiVersion``). :class:`~gpudra.kube.raw_api.RawApi` then sends to
that version and converts bodies both ways, so callers never see the difference.

Shapes (``k8s.io/api/resource/{v1beta1,v1beta2,v1}/types.go``): v1beta2 and v1 are the
same JSON; v1beta1 keeps a device's fields under ``basic`` and a request's fields (which
v1beta2 put under ``exactly``) at the request's own level.

Features: a server whose newest version is a beta lacks what came after it. 1.32 has no
partitionable devices, device taints, consumable capacity or binding conditions at all;
1.33 has partitionable devices and taints as alpha features, off unless the cluster's admin
turned them on, and the rest not at all. So on v1beta2 and v1beta1 none of them is
published (:data:`NEWER_FEATURES`; the controller leaves them out with one warning, see
``gpudra.controller.slice_features``), whatever a 1.33 cluster's gates say: a field a
disabled gate drops would change what a slice means (a MIG placement without its counters
overlaps its neighbours), so only what every such server keeps is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpudra.kube.objects import Obj

GROUP: Final = "resource.k8s.io"
STORED: Final = "v1"
"""The shape the rest of the code speaks."""
VERSIONS: Final = ("v1", "v1beta2", "v1beta1")
"""The versions gpudra speaks, most preferred first."""
CHOICES: Final = ("auto", *VERSIONS)
V1_PATH: Final = f"/apis/{GROUP}/{STORED}"

PARTITIONABLE: Final = "partitionable devices"
TAINTS: Final = "device taints"
CONSUMABLE_CAPACITY: Final = "consumable capacity"
BINDING_CONDITIONS: Final = "binding conditions"
NEWER_FEATURES: Final = frozenset({PARTITIONABLE, TAINTS, CONSUMABLE_CAPACITY,
                                   BINDING_CONDITIONS})
"""What a server serving only betas does not get (see the module docstring)."""


class UnsupportedServer(Exception):
    """The server serves no version we speak, or not the one asked for."""


@dataclass(frozen=True)
class ResourceApi:
    """The ``resource.k8s.io`` version in use, and how its bodies convert to v1's."""

    version: str = STORED
    served: tuple[str, ...] = ()
    """What discovery found, most preferred first (empty when pinned without asking)."""

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"resource API version {self.version!r}: expected one of "
                             f"{', '.join(VERSIONS)}")

    @property
    def lacks(self) -> frozenset[str]:
        """Features the server is taken not to have (nothing on v1)."""
        return frozenset() if self.version == STORED else NEWER_FEATURES

    @property
    def path(self) -> str:
        return f"/apis/{GROUP}/{self.version}"

    @property
    def converts(self) -> bool:
        return self.version != STORED

    def outgoing(self, plural: str, body: Obj) -> Obj:
        """A v1-shaped body as this version takes it (a copy when it differs)."""
        if not self.converts:
            return body
        out = dict(body)
        if out.get("apiVersion") == f"{GROUP}/{STORED}":
            out["apiVersion"] = f"{GROUP}/{self.version}"
        if self.version == "v1beta1":
            out = _convert_lists(plural, out, to_v1=False)
        return out

    def incoming(self, plural: str, answer: Obj) -> Obj:
        """An answer of this version (an object or a list of them) in the v1 shape."""
        if not self.converts:
            return answer
        if isinstance(answer.get("items"), list) and str(answer.get("kind", "")).endswith(
                "List"):
            return {**_v1_api_version(answer, self.version),
                    "items": [self.incoming(plural, item) if isinstance(item, dict) else item
                              for item in answer["items"]]}
        if answer.get("kind") == "Status":
            return answer
        out = _v1_api_version(answer, self.version)
        if self.version == "v1beta1":
            out = _convert_lists(plural, out, to_v1=True)
        return out

    def event(self, plural: str, event: Obj) -> Obj:
        """A watch event with its object in the v1 shape (ERROR events as they are)."""
        obj = event.get("object")
        if not self.converts or event.get("type") == "ERROR" or not isinstance(obj, dict):
            return event
        return {**event, "object": self.incoming(plural, obj)}


def _v1_api_version(obj: Obj, version: str) -> Obj:
    if obj.get("apiVersion") == f"{GROUP}/{version}":
        obj = {**obj, "apiVersion": f"{GROUP}/{STORED}"}
    return obj


# ---- v1beta1 <-> v1 ------------------------------------------------------------------------

_LISTS: Final[Mapping[str, tuple[str, ...]]] = {
    "resourceslices": ("spec", "devices"),
    "resourceclaims": ("spec", "devices", "requests"),
    "resourceclaimtemplates": ("spec", "spec", "devices", "requests"),
}


def _convert_lists(plural: str, obj: Obj, *, to_v1: bool) -> Obj:
    """``obj`` with the items of its device or request list converted. The dicts on the way
    to the list are copied, nothing else: the input is never changed (a caller's body may
    share its leaves with other objects), and the cost stays that of the list."""
    path = _LISTS.get(plural)
    if path is None:
        return obj
    fn: Callable[[Obj], Obj]
    if plural == "resourceslices":
        fn = _device_to_v1 if to_v1 else _device_from_v1
    else:
        fn = _request_to_v1 if to_v1 else _request_from_v1
    converted: Obj = _along(obj, path, fn)
    return converted


def _along(node: Any, path: tuple[str, ...], fn: Callable[[Obj], Obj]) -> Any:
    if not isinstance(node, dict) or path[0] not in node:
        return node
    head, rest = path[0], path[1:]
    if rest:
        return {**node, head: _along(node[head], rest, fn)}
    items = node[head]
    if not isinstance(items, list):
        return node
    return {**node, head: [fn(item) if isinstance(item, dict) else item for item in items]}


def _device_to_v1(device: Obj) -> Obj:
    basic = device.get("basic")
    out = {k: v for k, v in device.items() if k != "basic"}
    if isinstance(basic, dict):
        out.update(basic)
    return out


def _device_from_v1(device: Obj) -> Obj:
    return {"name": device.get("name"),
            "basic": {k: v for k, v in device.items() if k != "name"}}


def _request_to_v1(request: Obj) -> Obj:
    if request.get("firstAvailable"):
        # A v1beta1 request with alternatives has nothing else set (the fields it sends
        # without omitempty, e.g. deviceClassName, are empty).
        return {"name": request.get("name"), "firstAvailable": request["firstAvailable"]}
    exactly = {k: v for k, v in request.items() if k not in ("name", "firstAvailable")}
    return {"name": request.get("name"), "exactly": exactly}


def _request_from_v1(request: Obj) -> Obj:
    out = {k: v for k, v in request.items() if k != "exactly"}
    exactly = request.get("exactly")
    if isinstance(exactly, dict):
        out.update(exactly)
    return out


# ---- choosing ------------------------------------------------------------------------------

def choose(requested: str, served: tuple[str, ...]) -> ResourceApi:
    """The version to use given what the server serves; UnsupportedServer if none fits."""
    if requested not in CHOICES:
        raise ValueError(f"resource API version {requested!r}: expected one of "
                         f"{', '.join(CHOICES)}")
    have = ", ".join(served) or "none"
    if requested != "auto":
        if requested not in served:
            raise UnsupportedServer(
                f"--resource-api-version {requested}: the API server does not serve "
                f"{GROUP}/{requested} (it serves: {have})")
        return ResourceApi(requested, served)
    for version in VERSIONS:
        if version in served:
            return ResourceApi(version, served)
    raise UnsupportedServer(
        f"the API server serves no {GROUP} version gpudra speaks ({', '.join(VERSIONS)}); "
        f"it serves: {have}. DRA needs Kubernetes 1.32 or later with {GROUP} enabled "
        f"(1.32 and 1.33: the DynamicResourceAllocation feature gate and "
        f"--runtime-config={GROUP}/v1beta1)")


def served_versions(group: Obj) -> tuple[str, ...]:
    """The versions an ``APIGroup`` document lists, preferred first, as the server orders
    them."""
    found: list[str] = []
    for entry in group.get("versions") or []:
        version = entry.get("version") if isinstance(entry, dict) else None
        if isinstance(version, str) and version not in found:
            found.append(version)
    return tuple(found)


Discover = Callable[[], Awaitable[Obj | None]]
"""``GET /apis/resource.k8s.io``: the ``APIGroup`` document, None when not found."""


class ResourceVersions:
    """One session's choice, found out once by discovery (retried after a failure, kept
    after a success): the first version served (``auto``), or the one asked for, checked.
    ``None`` speaks v1 without asking (a library default for callers that know)."""

    def __init__(self, requested: str | None = None) -> None:
        if requested is not None and requested not in CHOICES:
            raise ValueError(f"resource API version {requested!r}: expected one of "
                             f"{', '.join(CHOICES)}")
        self.requested = requested
        self._chosen: ResourceApi | None = ResourceApi() if requested is None else None
        self._choosing = asyncio.Lock()

    @property
    def chosen(self) -> ResourceApi | None:
        """The version in use, once known."""
        return self._chosen

    async def resolve(self, discover: Discover) -> ResourceApi:
        """The version to use; asks the server the first time. Raises what ``discover``
        raises, or UnsupportedServer. Says nothing: the command-line tools share this
        layer, and their output is theirs (the daemon's publisher logs the choice)."""
        if self._chosen is not None:
            return self._chosen
        async with self._choosing:
            if self._chosen is None:
                group = await discover()
                chosen = choose(self.requested or "auto", served_versions(group or {}))
                self._chosen = chosen
            return self._chosen
