"""An HTTP server that sends one canned answer and then says nothing more: for what the test
API server cannot do (stop half-way through a body, answer 200 with something not JSON)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from gpudra.kube.session import ApiSession


@contextlib.asynccontextmanager
async def canned_answer(answer: bytes) -> AsyncIterator[str]:
    """Serve ``answer`` (raw bytes: status line, headers, some body) to every request, then
    hold the connection open until the client gives up; yields the server's URL."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            await reader.read()  # nothing more is sent; wait for the client to hang up
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def client_of(answer: bytes) -> AsyncIterator[ApiSession]:
    """An API session to a fresh ``canned_answer`` server."""
    async with canned_answer(answer) as url, ApiSession.for_url(url) as session:
        yield session


def http_answer(body: bytes, *, length: int | None = None, status: str = "200 OK") -> bytes:
    """A response head and ``body``; a ``length`` above ``len(body)`` promises more to come."""
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n")
    return head.encode() + body
