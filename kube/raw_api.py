"""Kubernetes API calls with plain JSON bodies, over a ``kubernetes.aio`` ApiClient.

Objects travel as dicts both ways. Client-37 models are strict pydantic models that drop
fields they do not know, so a slice read through them and written back would lose whatever a
newer apiserver added; the typed ``create_*``/``replace_*`` methods would also convert our
dicts into those models on the way out. The ApiClient still supplies the configuration,
authentication and the aiohttp session. Every call is counted in ``API_CALLS`` and every
failure, HTTP or not, is an ``ApiCallError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import aiohttp
from kubernetes.aio import client

from gpudra.kube.metrics import API_CALLS

Obj = dict[str, Any]

_MAX_MESSAGE: Final = 512  # a 422 can quote a whole slice; logs need the gist, not 200 KB


@dataclass(frozen=True)
class Resource:
    plural: str
    """The resource as audit logs and our metrics name it."""
    path: str
    """The collection's URL path."""

    def item(self, name: str) -> str:
        return f"{self.path}/{quote(name, safe='')}"


NODES: Final = Resource("nodes", "/api/v1/nodes")
RESOURCE_SLICES: Final = Resource("resourceslices", "/apis/resource.k8s.io/v1/resourceslices")


class ApiCallError(Exception):
    """An API call that did not succeed. ``status`` 0: no HTTP answer (refused, reset,
    timed out); ``retry_after``: what the server asked us to wait, in seconds."""

    def __init__(self, verb: str, resource: str, name: str | None, *, status: int,
                 reason: str, message: str, retry_after: float | None = None) -> None:
        self.verb = verb
        self.resource = resource
        self.name = name
        self.status = status
        self.reason = reason
        self.message = message[:_MAX_MESSAGE]
        self.retry_after = retry_after
        target = f"{resource}/{name}" if name else resource
        code = f"HTTP {status} {reason}" if status else reason
        super().__init__(f"{verb} {target}: {code}: {self.message}")

    @property
    def outcome(self) -> str:
        return outcome(self.status, self.reason)


def outcome(status: int, reason: str = "") -> str:
    """A small, bounded metric label for a response."""
    if status == 0:
        return "timeout" if reason == "Timeout" else "unreachable"
    if status < 300:
        return "ok"
    return {404: "not_found", 409: "conflict", 410: "expired", 422: "invalid",
            429: "throttled"}.get(status, "server_error" if status >= 500 else "error")


def _status_fields(body: bytes) -> tuple[str, str, float | None]:
    """(reason, message, retryAfterSeconds) from a ``Status`` body, or its raw text."""
    try:
        status = json.loads(body)
    except ValueError:
        return "", body[:_MAX_MESSAGE].decode(errors="replace"), None
    if not isinstance(status, dict):
        return "", str(status)[:_MAX_MESSAGE], None
    retry = (status.get("details") or {}).get("retryAfterSeconds")
    return (str(status.get("reason") or ""), str(status.get("message") or ""),
            float(retry) if isinstance(retry, int | float) else None)


def _retry_after(headers: Mapping[str, str], fallback: float | None) -> float | None:
    value = headers.get("Retry-After")
    try:
        return float(value) if value is not None else fallback
    except ValueError:  # an HTTP date; the apiserver only sends seconds
        return fallback


class RawApi:
    """GET, LIST, WATCH, POST, PUT and DELETE of plain JSON objects; one seam to the server."""

    def __init__(self, api_client: client.ApiClient, *, timeout: float = 10.0) -> None:
        self._client = api_client
        self.timeout = timeout

    async def _open(self, verb: str, resource: Resource, name: str | None, method: str,
                    path: str, *, query: Sequence[tuple[str, str]] = (),
                    body: Obj | None = None,
                    client_timeout: aiohttp.ClientTimeout | None = None,
                    ) -> aiohttp.ClientResponse:
        """Send one request; return the response once its status is a success."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            params = await self._client.param_serialize(
                method=method, resource_path=path, query_params=list(query),
                header_params=headers, body=body, auth_settings=["BearerToken"])
            answer = await self._client.call_api(
                *params, _request_timeout=client_timeout or aiohttp.ClientTimeout(
                    total=self.timeout), _preload_content=False)
            response: aiohttp.ClientResponse = answer.response
        except TimeoutError as exc:
            raise self._failed(verb, resource, name, status=0, reason="Timeout",
                               message=f"no answer within {self.timeout:g}s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise self._failed(verb, resource, name, status=0, reason=type(exc).__name__,
                               message=str(exc) or repr(exc)) from exc
        if response.status >= 300:
            try:
                data = await response.read()
            except (aiohttp.ClientError, OSError, TimeoutError):
                data = b""
            finally:
                response.release()
            reason, message, retry = _status_fields(data)
            raise self._failed(verb, resource, name, status=response.status,
                               reason=reason or str(response.reason or ""), message=message,
                               retry_after=_retry_after(response.headers, retry))
        API_CALLS.labels(verb, resource.plural, "ok").inc()
        return response

    def _failed(self, verb: str, resource: Resource, name: str | None, *, status: int,
                reason: str, message: str, retry_after: float | None = None) -> ApiCallError:
        error = ApiCallError(verb, resource.plural, name, status=status, reason=reason,
                             message=message, retry_after=retry_after)
        API_CALLS.labels(verb, resource.plural, error.outcome).inc()
        return error

    async def _call(self, verb: str, resource: Resource, name: str | None, method: str,
                    path: str, *, query: Sequence[tuple[str, str]] = (),
                    body: Obj | None = None) -> Obj:
        response = await self._open(verb, resource, name, method, path, query=query, body=body)
        try:
            data = await response.read()
        except TimeoutError as exc:
            raise ApiCallError(verb, resource.plural, name, status=0, reason="Timeout",
                               message="answer cut short") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise ApiCallError(verb, resource.plural, name, status=0,
                               reason=type(exc).__name__, message=str(exc)) from exc
        finally:
            response.release()
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise ApiCallError(verb, resource.plural, name, status=response.status,
                               reason="BadJSON",
                               message="the server answered with invalid JSON") from exc
        if not isinstance(obj, dict):
            raise ApiCallError(verb, resource.plural, name, status=response.status,
                               reason="BadJSON",
                               message=f"expected an object, got {type(obj).__name__}")
        return obj

    async def get(self, resource: Resource, name: str) -> Obj:
        return await self._call("get", resource, name, "GET", resource.item(name))

    async def list(self, resource: Resource, *, field_selector: str = "") -> Obj:
        query = [("fieldSelector", field_selector)] if field_selector else []
        return await self._call("list", resource, None, "GET", resource.path, query=query)

    async def create(self, resource: Resource, body: Obj) -> Obj:
        name = (body.get("metadata") or {}).get("name")
        return await self._call("create", resource, name, "POST", resource.path, body=body)

    async def replace(self, resource: Resource, name: str, body: Obj) -> Obj:
        return await self._call("update", resource, name, "PUT", resource.item(name), body=body)

    async def delete(self, resource: Resource, name: str, *,
                     preconditions: Mapping[str, str] | None = None) -> None:
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions:
            options["preconditions"] = dict(preconditions)
        await self._call("delete", resource, name, "DELETE", resource.item(name), body=options)

    async def watch(self, resource: Resource, *, field_selector: str, resource_version: str,
                    timeout_seconds: int) -> WatchStream:
        """Open a watch from ``resource_version``; the server ends it after
        ``timeout_seconds``. A quiet connection is given up a little after that."""
        query = [("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(timeout_seconds))]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        if resource_version:
            query.append(("resourceVersion", resource_version))
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout,
                                        sock_read=timeout_seconds + self.timeout)
        response = await self._open("watch", resource, None, "GET", resource.path,
                                    query=query, client_timeout=timeout)
        return WatchStream(response, resource)


class WatchStream:
    """The events of one open watch, one JSON object per line."""

    def __init__(self, response: aiohttp.ClientResponse, resource: Resource) -> None:
        self._response = response
        self._resource = resource

    async def next(self) -> Obj | None:
        """The next event (``{"type": ..., "object": ...}``), or ``None`` at a clean end."""
        while True:
            try:
                line = await self._response.content.readline()
            except TimeoutError as exc:
                raise ApiCallError("watch", self._resource.plural, None, status=0,
                                   reason="Timeout", message="watch went quiet") from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise ApiCallError("watch", self._resource.plural, None, status=0,
                                   reason=type(exc).__name__,
                                   message=str(exc) or repr(exc)) from exc
            if not line:
                return None
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError as exc:
                raise ApiCallError("watch", self._resource.plural, None, status=200,
                                   reason="BadJSON",
                                   message=f"undecodable watch event {line[:80]!r}") from exc
            if isinstance(event, dict):
                return event

    def close(self) -> None:
        if self._response.content.at_eof():
            self._response.release()  # a finished stream leaves a reusable connection
        else:
            self._response.close()  # an unfinished chunked stream cannot be reused

    async def __aenter__(self) -> WatchStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
