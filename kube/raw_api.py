"""Kubernetes API calls with plain JSON bodies, over our own :class:`ApiSession`.

Objects travel as dicts both ways. Client-37 models are strict pydantic models that drop
fields they do not know, so a slice read through them and written back would lose whatever a
newer apiserver added; so no ``kubernetes`` client here at all: the session
(:mod:`gpudra.kube.session`) supplies the connection and authentication. Every call is
counted in ``API_CALLS`` and every failure, HTTP or not, is an ``ApiCallError`` of the
class ``gpudra.kube.errors`` gives its status (``NotFound``, ``Conflict``, ...).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Final
from urllib.parse import quote

from gpudra.api import bounded_json
from gpudra.kube.errors import MAX_MESSAGE, ApiCallError, BadAnswer, NotFound, api_error
from gpudra.kube.http_client import HttpError, Response, TooLarge
from gpudra.kube.metrics import API_CALLS
from gpudra.kube.objects import Obj
from gpudra.kube.resource_versions import GROUP, V1_PATH, ResourceApi, UnsupportedServer
from gpudra.kube.session import ApiSession

if TYPE_CHECKING:
    from prometheus_client import Counter


@dataclass(frozen=True)
class Resource:
    plural: str
    """The resource as audit logs and our metrics name it."""
    group_version: str
    """The URL path of its API group and version: ``/api/v1``, ``/apis/<group>/<version>``."""
    namespaced: bool = False

    def collection(self, namespace: str | None = None) -> str:
        """The collection's URL path; of every namespace when a namespaced resource is
        given none."""
        if namespace is None:
            return f"{self.group_version}/{self.plural}"
        if not self.namespaced:
            raise ValueError(f"{self.plural} are cluster-scoped: no namespace {namespace!r}")
        return f"{self.group_version}/namespaces/{quote(namespace, safe='')}/{self.plural}"

    def item(self, name: str, namespace: str | None = None) -> str:
        if self.namespaced and namespace is None:
            raise ValueError(f"{self.plural} are namespaced: {name!r} needs a namespace")
        return f"{self.collection(namespace)}/{quote(name, safe='')}"


NODES: Final = Resource("nodes", "/api/v1")
# resource.k8s.io resources are named by their v1 path; RawApi sends to the version the
# server serves (``resource_versions``) and converts bodies both ways.
RESOURCE_SLICES: Final = Resource("resourceslices", V1_PATH)
DEVICE_CLASSES: Final = Resource("deviceclasses", V1_PATH)
RESOURCE_CLAIMS: Final = Resource("resourceclaims", V1_PATH, namespaced=True)
EVENTS: Final = Resource("events", "/apis/events.k8s.io/v1", namespaced=True)
_RESOURCE_GROUP: Final = Resource(GROUP, "/apis/" + GROUP)
"""The group's discovery document (``APIGroup``), which lists the versions served."""

_ACCEPT_JSON: Final[Mapping[str, str]] = {"Accept": "application/json"}

MAX_OBJECT: Final = 8 << 20
"""Bytes of one object's answer (or one watch event): etcd keeps at most ~1.5 MiB of an
object; the client's own limit (64 MiB) is for a page of a list."""

APPLY_PATCH: Final = "application/apply-patch+yaml"
"""Server-side apply; JSON is YAML, so the body stays JSON."""


def _target(name: str | None, namespace: str | None) -> str | None:
    """How errors name the object: ``name``, or ``namespace/name``."""
    return f"{namespace}/{name}" if name is not None and namespace is not None else name


def _status_fields(body: bytes) -> tuple[str, str, float | None]:
    """(reason, message, retryAfterSeconds) from a ``Status`` body, or its raw text."""
    try:
        status = bounded_json.loads(body)
    except ValueError:
        return "", body[:MAX_MESSAGE].decode(errors="replace"), None
    if not isinstance(status, dict):
        return "", str(status)[:MAX_MESSAGE], None
    retry = (status.get("details") or {}).get("retryAfterSeconds")
    return (str(status.get("reason") or ""), str(status.get("message") or ""),
            float(retry) if isinstance(retry, int | float) else None)


def _retry_after(headers: Mapping[str, str], fallback: float | None) -> float | None:
    """The ``Retry-After`` header (``headers`` has lower-case names), else ``fallback``."""
    value = headers.get("retry-after")
    try:
        return float(value) if value is not None else fallback
    except ValueError:  # an HTTP date; the apiserver only sends seconds
        return fallback


def _counted(error: ApiCallError) -> ApiCallError:
    API_CALLS.labels(error.verb, error.resource, error.outcome).inc()
    return error


@functools.cache
def _succeeded(verb: str, resource: str) -> Counter:
    """``API_CALLS`` of successful calls, looked up once per verb and resource
    (``labels()`` takes a lock and builds a key each time)."""
    return API_CALLS.labels(verb, resource, "ok")


def _refused(verb: str, resource: Resource, name: str | None, *, status: int, reason: str,
             headers: Mapping[str, str], body: bytes) -> ApiCallError:
    """The counted error for an answer whose status is not a success."""
    status_reason, message, retry = _status_fields(body)
    return _counted(api_error(verb, resource.plural, name, status=status,
                              reason=status_reason or reason, message=message,
                              retry_after=_retry_after(headers, retry)))


def _decoded(verb: str, resource: Resource, name: str | None, status: int,
             body: bytes) -> Obj:
    """A successful answer's JSON object, counted; BadAnswer if it is not one."""
    try:
        obj = bounded_json.loads(body)  # nesting bounded: the answer is untrusted
    except ValueError as exc:
        deep = f": {exc}" if isinstance(exc, bounded_json.JsonTooDeep) else ""
        raise _counted(BadAnswer(verb, resource.plural, name, status=status,
                                 reason="BadJSON",
                                 message=f"the server answered with invalid JSON{deep}")) from exc
    if not isinstance(obj, dict):
        raise _counted(BadAnswer(verb, resource.plural, name, status=status,
                                 reason="BadJSON",
                                 message=f"expected an object, got {type(obj).__name__}"))
    _succeeded(verb, resource.plural).inc()
    return obj


class _NoAnswer:
    """``with``: turn the transport's failures (no HTTP answer) into a counted
    ``Unreachable``. A class, not a generator: it wraps every call."""

    __slots__ = ("_name", "_resource", "_timeout", "_verb")

    def __init__(self, verb: str, resource: Resource, name: str | None,
                 timeout: float) -> None:
        self._verb = verb
        self._resource = resource
        self._name = name
        self._timeout = timeout

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, TimeoutError):
            raise _counted(api_error(self._verb, self._resource.plural, self._name, status=0,
                                     reason="Timeout",
                                     message=f"no answer within {self._timeout:g}s")) from exc
        if isinstance(exc, TooLarge):
            raise _counted(BadAnswer(self._verb, self._resource.plural, self._name, status=0,
                                     reason="TooLarge", message=str(exc))) from exc
        if isinstance(exc, HttpError | OSError):
            raise _counted(api_error(self._verb, self._resource.plural, self._name, status=0,
                                     reason=type(exc).__name__,
                                     message=str(exc) or repr(exc))) from exc


class RawApi:
    """GET, LIST, WATCH, POST, PUT and DELETE of plain JSON objects; one seam to the server.

    Each call is counted once in ``API_CALLS``, with how it ended."""

    def __init__(self, session: ApiSession, *, timeout: float = 10.0) -> None:
        self._session = session
        self.timeout = timeout

    async def _open(self, verb: str, resource: Resource, name: str | None, method: str,
                    path: str, *, query: Sequence[tuple[str, str]] = (),
                    body: Obj | None = None, read_timeout: float | None = None,
                    content_type: str = "application/json") -> Response:
        """Send one request; return the response once its status is a success. Transport
        failures pass through for the caller, who knows the deadline they belong to."""
        headers = _ACCEPT_JSON if body is None else {**_ACCEPT_JSON, "Content-Type": content_type}
        response = await self._session.request(
            method, path, query=query, headers=headers,
            body=None if body is None else json.dumps(body).encode(),
            connect_timeout=self.timeout, read_timeout=read_timeout)
        if response.status >= 300:
            try:
                data = await response.read()
            except (HttpError, OSError, TimeoutError):
                data = b""
            finally:
                response.release()
            raise _refused(verb, resource, name, status=response.status,
                           reason=response.reason, headers=response.headers, body=data)
        return response

    async def resource_version(self, verb: str = "get", resource: str = GROUP,
                               name: str | None = None) -> ResourceApi:
        """The resource.k8s.io version in use: asked of the server the first time when
        ``auto``; an ``ApiCallError`` (of ``verb`` on ``resource``) when that fails or the
        server serves none that fits (:mod:`gpudra.kube.resource_versions`)."""
        try:
            return await self._session.resource_versions.resolve(self._discover_group)
        except UnsupportedServer as exc:
            raise _counted(ApiCallError(verb, resource, name, status=404,
                                        reason="VersionNotServed", message=str(exc))) from exc

    async def _version(self, verb: str, resource: Resource,
                       name: str | None) -> ResourceApi | None:
        """The version to speak when ``resource`` is of resource.k8s.io and the server is
        not spoken to in v1 (the shape callers use); else None."""
        if resource.group_version != V1_PATH:
            return None
        chosen = await self.resource_version(verb, resource.plural, name)
        return chosen if chosen.converts else None

    async def _discover_group(self) -> Obj | None:
        try:
            return await self._call("get", _RESOURCE_GROUP, None, "GET",
                                    _RESOURCE_GROUP.group_version)
        except NotFound:
            return None

    async def _call(self, verb: str, resource: Resource, name: str | None, method: str,
                    path: str, *, query: Sequence[tuple[str, str]] = (),
                    body: Obj | None = None, content_type: str = "application/json") -> Obj:
        version = await self._version(verb, resource, name)
        if version is not None:
            path = version.path + path.removeprefix(V1_PATH)
            if body is not None and verb != "delete":
                body = version.outgoing(resource.plural, body)
        answer = await self._send(verb, resource, name, method, path, query=query, body=body,
                                  content_type=content_type)
        return answer if version is None else version.incoming(resource.plural, answer)

    async def _send(self, verb: str, resource: Resource, name: str | None, method: str,
                    path: str, *, query: Sequence[tuple[str, str]] = (),
                    body: Obj | None = None, content_type: str = "application/json") -> Obj:
        with _NoAnswer(verb, resource, name, self.timeout):
            # One deadline for headers and body: a stalled body must not hang the call.
            async with asyncio.timeout(self.timeout):
                response = await self._open(
                    verb, resource, name, method, path, query=query, body=body,
                    content_type=content_type)
                if verb != "list":
                    response.limit(MAX_OBJECT)
                try:
                    data = await response.read()
                finally:
                    response.release()
        return _decoded(verb, resource, name, response.status, data)

    async def get(self, resource: Resource, name: str, *,
                  namespace: str | None = None) -> Obj:
        return await self._call("get", resource, _target(name, namespace), "GET",
                                resource.item(name, namespace))

    async def list(self, resource: Resource, *, namespace: str | None = None,
                   field_selector: str = "", limit: int = 0, continue_from: str = "") -> Obj:
        """One LIST; ``limit`` and ``continue_from`` page through a long one."""
        query = [("fieldSelector", field_selector)] if field_selector else []
        if limit:
            query.append(("limit", str(limit)))
        if continue_from:
            query.append(("continue", continue_from))
        return await self._call("list", resource, None, "GET", resource.collection(namespace),
                                query=query)

    async def create(self, resource: Resource, body: Obj, *,
                     namespace: str | None = None) -> Obj:
        name = (body.get("metadata") or {}).get("name")
        return await self._call("create", resource, _target(name, namespace), "POST",
                                resource.collection(namespace), body=body)

    async def replace(self, resource: Resource, name: str, body: Obj, *,
                      namespace: str | None = None, subresource: str = "") -> Obj:
        """PUT ``body`` (to ``subresource``, e.g. ``status``); its
        ``metadata.resourceVersion`` makes it conditional (409 Conflict when stale)."""
        path = resource.item(name, namespace) + (f"/{subresource}" if subresource else "")
        return await self._call("update", resource, _target(name, namespace), "PUT", path,
                                body=body)

    async def apply(self, resource: Resource, name: str, body: Obj, *, field_manager: str,
                    namespace: str | None = None, subresource: str = "",
                    force: bool = False) -> Obj:
        """Server-side apply of ``body`` as ``field_manager`` (to ``subresource``, e.g.
        ``status``); ``force`` takes over fields another manager owns."""
        path = resource.item(name, namespace) + (f"/{subresource}" if subresource else "")
        query = [("fieldManager", field_manager)] + ([("force", "true")] if force else [])
        return await self._call("patch", resource, _target(name, namespace), "PATCH", path,
                                query=query, body=body, content_type=APPLY_PATCH)

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
                     preconditions: Mapping[str, str] | None = None) -> None:
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions:
            options["preconditions"] = dict(preconditions)
        await self._call("delete", resource, _target(name, namespace), "DELETE",
                         resource.item(name, namespace), body=options)

    async def watch(self, resource: Resource, *, namespace: str | None = None,
                    field_selector: str, resource_version: str,
                    timeout_seconds: int) -> WatchStream:
        """Open a watch from ``resource_version``; the server ends it after
        ``timeout_seconds``. A quiet connection is given up a little after that."""
        query = [("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(timeout_seconds))]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        if resource_version:
            query.append(("resourceVersion", resource_version))
        version = await self._version("watch", resource, None)
        path = resource.collection(namespace)
        if version is not None:
            path = version.path + path.removeprefix(V1_PATH)
        with _NoAnswer("watch", resource, None, self.timeout):
            # No deadline for the whole stream; each read waits until a little after the
            # server should have ended it.
            response = await self._open("watch", resource, None, "GET", path, query=query,
                                        read_timeout=timeout_seconds + self.timeout)
        _succeeded("watch", resource.plural).inc()
        response.limit(MAX_OBJECT)  # per event: a watch stream has no end to bound
        return WatchStream(response, resource, version)


class WatchStream:
    """The events of one open watch, one JSON object per line."""

    def __init__(self, response: Response, resource: Resource,
                 version: ResourceApi | None = None) -> None:
        self._response = response
        self._resource = resource
        self._version = version  # events of an older resource.k8s.io version: to v1's shape

    async def next(self) -> Obj | None:
        """The next event (``{"type": ..., "object": ...}``), or ``None`` at a clean end."""
        while True:
            try:
                line = await self._response.readline()
            except TimeoutError as exc:
                raise api_error("watch", self._resource.plural, None, status=0,
                                reason="Timeout", message="watch went quiet") from exc
            except TooLarge as exc:
                raise BadAnswer("watch", self._resource.plural, None, status=200,
                                reason="TooLarge", message=str(exc)) from exc
            except (HttpError, OSError) as exc:
                raise api_error("watch", self._resource.plural, None, status=0,
                                reason=type(exc).__name__,
                                message=str(exc) or repr(exc)) from exc
            if not line:
                return None
            if not line.strip():
                continue
            try:
                event = bounded_json.loads(line)
            except ValueError as exc:
                raise BadAnswer("watch", self._resource.plural, None, status=200,
                                reason="BadJSON",
                                message=f"undecodable watch event {line[:80]!r}") from exc
            if isinstance(event, dict):
                if self._version is not None:
                    return self._version.event(self._resource.plural, event)
                return event

    def close(self) -> None:
        # A finished stream leaves a reusable connection; an unfinished one is closed.
        self._response.release()

    async def __aenter__(self) -> WatchStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
