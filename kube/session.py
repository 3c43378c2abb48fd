"""One session to one API server: TLS and credentials from a :class:`Connection`.

Our own small client instead of ``kubernetes.aio``: the daemon only sends plain JSON
(:mod:`gpudra.kube.raw_api`), and that package costs ~50 MB of memory and ~0.5 s to import;
the HTTP itself is :mod:`gpudra.kube.http_client` (aiohttp cost ~9 MiB more). The client is
created on first use, inside the running event loop; the TLS context needs an exec plugin's
client certificate, when there is one, so it is built then too.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpudra.kube.connection import Connection
from gpudra.kube.credentials import Credentials
from gpudra.kube.http_client import HttpClient, Response

if TYPE_CHECKING:
    import ssl


class ApiSession:
    """Requests to one API server, authenticated; close it when done."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._credentials = Credentials(connection)
        self._client: HttpClient | None = None
        self._ssl: ssl.SSLContext | None = None
        self._opening = asyncio.Lock()

    @classmethod
    def for_url(cls, url: str) -> ApiSession:
        """An unauthenticated session (tests, ``kubectl proxy``)."""
        return cls(Connection(server=url.rstrip("/")))

    async def request(self, method: str, path: str, *,
                      query: Sequence[tuple[str, str]] = (),
                      headers: Mapping[str, str] | None = None, body: bytes | None = None,
                      connect_timeout: float | None,
                      read_timeout: float | None = None) -> Response:
        """Send one request; the caller reads and releases the response. The timeouts are
        :meth:`HttpClient.request`'s; a deadline for the whole call is the caller's."""
        client = self._client or await self._open()
        all_headers = dict(headers or {})
        authorization = await self._credentials.header()
        if authorization is not None:
            all_headers["Authorization"] = authorization
        response = await client.request(
            method, path, query=query, headers=all_headers, body=body,
            connect_timeout=connect_timeout, read_timeout=read_timeout)
        if response.status == 401:
            self._credentials.rejected()
        return response

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def __aenter__(self) -> ApiSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _open(self) -> HttpClient:
        async with self._opening:
            if self._client is None:
                tls = None
                if self.connection.server.startswith("https:"):
                    client_pair = None
                    if self.connection.exec_plugin is not None:
                        credential = await self._credentials.exec_credential()
                        client_pair = (credential.client_cert_pem, credential.client_key_pem)
                    tls = self._tls(client_pair)
                self._client = HttpClient(self.connection.server, ssl_context=tls,
                                          server_hostname=self.connection.tls_server_name)
            return self._client

    def _tls(self, client_pair: tuple[str | None, str | None] | None) -> ssl.SSLContext:
        """The session's TLS context; ``client_pair`` is an exec plugin's client certificate
        and key, which take the kubeconfig's place."""
        if self._ssl is None:
            self._ssl = _tls_context(self.connection, client_pair)
        return self._ssl


def _tls_context(c: Connection,
                 client_pair: tuple[str | None, str | None] | None) -> ssl.SSLContext:
    import ssl

    cert, key = c.client_cert_pem, c.client_key_pem
    if client_pair is not None:
        cert, key = client_pair[0] or cert, client_pair[1] or key
    context = ssl.create_default_context(cadata=c.ca_pem or None)
    if c.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert and key:
        _load_chain(context, cert, key)
    return context


def _load_chain(context: ssl.SSLContext, cert_pem: str, key_pem: str) -> None:
    """Load an in-memory certificate and key: ``ssl`` only reads them from files, so
    through a private temporary directory removed at once."""
    import tempfile  # rare (client certificates); it imports shutil and random

    with tempfile.TemporaryDirectory(prefix="gpudra-tls-") as directory:
        cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        for path, text in ((cert, cert_pem), (key, key_pem)):
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(text)
        context.load_cert_chain(cert, key)
