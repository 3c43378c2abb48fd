"""One session to one API server: the transport (:mod:`gpudra.kube.http_client`) with the
TLS, proxy and credentials of a :class:`~gpudra.kube.connection.Connection`.

Our own small client instead of ``kubernetes.aio``: the daemon only sends plain JSON
(:mod:`gpudra.kube.raw_api`), and that package is heavy to import and hold. The same
session serves the command-line tools, so the daemon and the CLI reach a cluster alike. The
client is created on first use, inside the running event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from gpudra.kube.connection import Connection, KubeconfigError
from gpudra.kube.http_client import HttpClient, HttpError, Response
from gpudra.kube.resource_versions import ResourceVersions

ConnectionSource = Connection | Callable[[], Connection]
"""A connection, or how to make one on first use (a kubeconfig the ``kubernetes``
package loads: slow, and maybe an exec plugin; in a worker thread)."""


class ApiSession:
    """Requests to one API server, authenticated; close it when done."""

    def __init__(self, connection: ConnectionSource, *,
                 resource_api: str | None = None) -> None:
        """``resource_api``: the resource.k8s.io version to speak (checked against what the
        server serves on the first such call), ``auto`` to take the first it serves of v1,
        v1beta2 and v1beta1, or None for v1 without asking
        (:mod:`gpudra.kube.resource_versions`)."""
        self.resource_versions = ResourceVersions(resource_api)
        self._source = connection
        self._connection = connection if isinstance(connection, Connection) else None
        self._client: HttpClient | None = None
        self._opening = asyncio.Lock()

    @classmethod
    def for_url(cls, url: str, *, resource_api: str | None = None) -> ApiSession:
        """An unauthenticated session (tests, ``kubectl proxy``)."""
        return cls(Connection(server=url.rstrip("/")), resource_api=resource_api)

    async def request(self, method: str, path: str, *,
                      query: Sequence[tuple[str, str]] = (),
                      headers: Mapping[str, str] | None = None, body: bytes | None = None,
                      connect_timeout: float | None,
                      read_timeout: float | None = None) -> Response:
        """Send one request; the caller reads and releases the response. The timeouts are
        :meth:`HttpClient.request`'s; a deadline for the whole call is the caller's."""
        c = self._connection or await self._load()
        if self._client is None:
            self._client = HttpClient(c.server, ssl_context=c.tls,
                                      server_hostname=c.tls_server_name, proxy=c.proxy)
        all_headers = dict(headers or {})
        if c.credentials is not None:
            authorization = await c.credentials.header()
            if authorization is not None:
                all_headers["Authorization"] = authorization
        response = await self._client.request(
            method, path, query=query, headers=all_headers, body=body,
            connect_timeout=connect_timeout, read_timeout=read_timeout)
        if response.status == 401 and c.credentials is not None:
            c.credentials.rejected()
        return response

    async def _load(self) -> Connection:
        async with self._opening:
            if self._connection is None:
                assert callable(self._source)
                try:
                    self._connection = await asyncio.to_thread(self._source)
                except KubeconfigError as exc:  # each call fails with it, and is retried
                    raise HttpError(f"kubeconfig: {exc}") from exc
            return self._connection

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def __aenter__(self) -> ApiSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
