"""One aiohttp session to one API server: TLS and credentials from a :class:`Connection`.

Our own small client instead of ``kubernetes.aio``: the daemon only sends plain JSON
(:mod:`gpudra.kube.raw_api`), and that package costs ~50 MB of memory and ~0.5 s to import.
The session is created on first use, inside the running event loop; the TLS context needs
an exec plugin's client certificate, when there is one, so it is built then too.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from gpudra.kube.connection import Connection
from gpudra.kube.credentials import Credentials

if TYPE_CHECKING:
    import ssl


class ApiSession:
    """Requests to one API server, authenticated; close it when done."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._credentials = Credentials(connection)
        self._session: aiohttp.ClientSession | None = None
        self._opening = asyncio.Lock()

    @classmethod
    def for_url(cls, url: str) -> ApiSession:
        """An unauthenticated session (tests, ``kubectl proxy``)."""
        return cls(Connection(server=url.rstrip("/")))

    async def request(self, method: str, path: str, *,
                      query: Sequence[tuple[str, str]] = (),
                      headers: Mapping[str, str] | None = None, body: bytes | None = None,
                      client_timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """Send one request; the caller reads and releases the response."""
        session = self._session or await self._open()
        all_headers = dict(headers or {})
        authorization = await self._credentials.header()
        if authorization is not None:
            all_headers["Authorization"] = authorization
        response = await session.request(
            method, self.connection.server + path, params=list(query), headers=all_headers,
            data=body, timeout=client_timeout, server_hostname=self.connection.tls_server_name)
        if response.status == 401:
            self._credentials.rejected()
        return response

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> ApiSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _open(self) -> aiohttp.ClientSession:
        async with self._opening:
            if self._session is None:
                ssl_context: ssl.SSLContext | bool = True
                if self.connection.server.startswith("https:"):
                    ssl_context = await self._ssl_context()
                connector = aiohttp.TCPConnector(ssl=ssl_context, limit=0)
                # The API server's own deadlines apply; aiohttp's 5-minute default does not.
                self._session = aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                    auto_decompress=True)
            return self._session

    async def _ssl_context(self) -> ssl.SSLContext:
        import ssl

        c = self.connection
        cert, key = c.client_cert_pem, c.client_key_pem
        if c.exec_plugin is not None:
            credential = await self._credentials.exec_credential()
            cert = credential.client_cert_pem or cert
            key = credential.client_key_pem or key
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
    with tempfile.TemporaryDirectory(prefix="gpudra-tls-") as directory:
        cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        for path, text in ((cert, cert_pem), (key, key_pem)):
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(text)
        context.load_cert_chain(cert, key)
