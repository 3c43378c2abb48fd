"""A small HTTP/1.1 client on asyncio streams: what the daemon asks of the API server.

aiohttp did this before and cost ~9 MiB of the daemon's memory for features it never used.
This client speaks to one server: keep-alive connections in a pool (as many at once as
requests in flight; a watch holds one for its lifetime), bodies framed by Content-Length,
chunked transfer encoding or the connection's end, gzip, and https through :mod:`ssl`.

Timeouts: ``connect_timeout`` bounds getting a connection (TCP and TLS); ``read_timeout``,
when given, bounds each wait for the server's next bytes, headers and body alike (a watch
that goes quiet). A deadline for the whole call is the caller's ``asyncio.timeout``; a
request cut short by one leaves its connection closed, never back in the pool.

Retries: a request sent on a pooled connection that the server closed while it sat idle
(the close crossed the request, and not one byte of an answer came back) is sent once more
on a new connection if its method is idempotent (RFC 9110 9.2.2: GET, HEAD, PUT, DELETE,
OPTIONS), as Go's transport and aiohttp do. A new connection that fails is not retried:
the server did see the request, or could not be reached; the caller's back-off decides.

The HTTP itself (request head, status line, header fields, body framing) is
:mod:`gpudra.kube.http_framing`, shared with the blocking client of threads that must not
wait for the event loop (:mod:`gpudra.kube.blocking_http`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from gpudra.kube.http_framing import (
    IDEMPOTENT,
    MAX_HEADERS,
    READ_SIZE,
    BadResponse,
    Framing,
    HttpError,
    Server,
    ServerDisconnected,
    add_header,
    chunk_size,
    status_line,
)

if TYPE_CHECKING:
    import ssl

T = TypeVar("T")

__all__ = ["BadResponse", "HttpClient", "HttpError", "Response", "ServerDisconnected"]

IDLE_TIMEOUT: Final = 15.0
"""Seconds an unused connection stays open (aiohttp's default; the API server's is longer,
so we close first and rarely meet a connection it closed)."""
MAX_IDLE: Final = 64
"""Unused connections kept; a prepare of 64 claims opens as many at once."""


class _Conn:
    """One connection and when it last went idle."""

    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self) -> bool:
        """Still open from both ends: a server that closed it while idle shows EOF here."""
        return (not self.writer.is_closing() and not self.reader.at_eof()
                and self.reader.exception() is None)

    async def closed(self) -> None:
        """Close it and wait until it is (a TLS connection says goodbye first); cancelled,
        drop it at once."""
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass  # reset or TLS error on the way out: closed all the same
        except asyncio.CancelledError:
            self.writer.transport.abort()
            raise


class HttpClient:
    """Requests to the server at ``base_url`` (its path is a prefix of every request's)."""

    def __init__(self, base_url: str, *, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str | None = None) -> None:
        self._server = Server(base_url)
        if self._server.tls and ssl_context is None:
            import ssl

            ssl_context = ssl.create_default_context()
        self._ssl = ssl_context if self._server.tls else None
        self._server_hostname = server_hostname if self._ssl else None
        self._idle: list[_Conn] = []
        self._busy: set[_Conn] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    async def request(self, method: str, path: str, *,
                      query: Sequence[tuple[str, str]] = (),
                      headers: Mapping[str, str] | None = None, body: bytes | None = None,
                      connect_timeout: float | None,
                      read_timeout: float | None = None) -> Response:
        """Send one request and read the answer's head; the caller reads the body, then
        releases the response."""
        if self._closed:
            raise HttpError("the client is closed")
        head = self._server.head(method, path, query, headers, body)
        pooled = True
        while True:
            conn, reused = await self._acquire(connect_timeout, pooled=pooled)
            try:
                conn.writer.write(head + body if body else head)
                return await _read_head(conn, self, method, read_timeout)
            except _NoAnswer as exc:
                self._discard(conn)
                if reused and method in IDEMPOTENT:
                    pooled = False  # a stale keep-alive connection: once more on a new one
                    continue
                raise ServerDisconnected(
                    "the server closed the connection without answering") from exc.__cause__
            except BaseException:
                self._discard(conn)
                raise

    async def close(self) -> None:
        """Close every connection, idle or in use, and wait until they are closed."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in [*self._idle, *self._busy]:
            self._discard(conn)
        self._idle = []
        if self._closing:
            # A TLS peer that never answers our close_notify is not waited for long.
            _, late = await asyncio.wait(self._closing, timeout=1.0)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def _acquire(self, connect_timeout: float | None, *,
                       pooled: bool) -> tuple[_Conn, bool]:
        """A pooled connection (True), if ``pooled`` allows, or a new one (False); busy."""
        while pooled and self._idle:
            conn = self._idle.pop()
            if conn.usable():
                self._busy.add(conn)
                return conn, True
            self._discard(conn)
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_connection(
                *self._server.address, ssl=self._ssl, server_hostname=self._server_hostname)
        conn = _Conn(reader, writer)
        if self._closed:  # closed while connecting: nobody else will close it
            writer.transport.abort()
            raise HttpError("the client is closed")
        self._busy.add(conn)
        return conn, False

    def _release(self, conn: _Conn) -> None:
        """Back to the pool after a complete answer that keeps the connection open."""
        self._busy.discard(conn)
        if self._closed or not conn.usable():
            self._discard(conn)
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)
        if len(self._idle) > MAX_IDLE:
            self._discard(self._idle.pop(0))  # the oldest: the least likely to be used again
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(IDLE_TIMEOUT, self._sweep)

    def _discard(self, conn: _Conn) -> None:
        """Close ``conn``; ``close()`` waits for the ones still closing."""
        self._busy.discard(conn)
        task = asyncio.get_running_loop().create_task(conn.closed())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _sweep(self) -> None:
        """Close connections idle for longer than IDLE_TIMEOUT."""
        self._sweeper = None
        cutoff = time.monotonic() - IDLE_TIMEOUT
        stale = [c for c in self._idle if c.idle_since <= cutoff]
        self._idle = [c for c in self._idle if c.idle_since > cutoff]
        for conn in stale:
            self._discard(conn)
        if self._idle:
            delay = self._idle[0].idle_since + IDLE_TIMEOUT - time.monotonic()
            self._sweeper = asyncio.get_running_loop().call_later(max(delay, 0.1), self._sweep)


class _NoAnswer(Exception):
    """Internal: the connection ended before the first byte of an answer."""


def _within(seconds: float | None, awaitable: Awaitable[T]) -> Awaitable[T]:
    """``awaitable``, given at most ``seconds`` (None: as long as it takes; then
    ``awaitable`` itself, without a coroutine around it)."""
    if seconds is None:
        return awaitable
    return _bounded(seconds, awaitable)


async def _bounded(seconds: float, awaitable: Awaitable[T]) -> T:
    async with asyncio.timeout(seconds):
        return await awaitable


async def _read_head(conn: _Conn, client: HttpClient, method: str,
                     read_timeout: float | None) -> Response:
    reader = conn.reader
    try:
        # Usually the whole request went out in write(): nothing to wait for. A connection
        # lost meanwhile shows in the read below, as it would in drain().
        if conn.writer.transport.get_write_buffer_size():
            await _within(read_timeout, conn.writer.drain())
        first = await _within(read_timeout, reader.readline())
    except TimeoutError:
        raise
    except OSError as exc:  # reset, or a TLS connection cut short
        raise _NoAnswer from exc
    except ValueError as exc:  # longer than the reader's limit
        raise BadResponse("the status line is too long") from exc
    if not first:
        raise _NoAnswer
    while True:
        version, status, reason = status_line(first)
        headers = await _headers(reader, read_timeout)
        if not 100 <= status < 200:
            break
        first = await _line(reader, read_timeout)  # an interim answer: the real one follows
    return Response(conn, client, status=status, reason=reason, headers=headers,
                    version=version, method=method, read_timeout=read_timeout)


async def _line(reader: asyncio.StreamReader, read_timeout: float | None) -> bytes:
    """One CRLF-ended line of the head or of chunk framing."""
    try:
        line = await _within(read_timeout, reader.readline())
    except ValueError as exc:  # longer than the reader's limit (64 KiB)
        raise BadResponse("a header or chunk-size line is too long") from exc
    if not line.endswith(b"\n"):
        raise ServerDisconnected("the server closed the connection mid-answer")
    return line


async def _headers(reader: asyncio.StreamReader, read_timeout: float | None) -> dict[str, str]:
    """The header fields, names in lower case; repeated fields joined with commas."""
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        if not add_header(headers, await _line(reader, read_timeout)):
            return headers
    raise BadResponse(f"more than {MAX_HEADERS} header fields")


class Response:
    """An answer whose head has been read; its body is read through :meth:`read` or, line
    by line, :meth:`readline`. ``release()`` it when done (``async with`` does)."""

    def __init__(self, conn: _Conn, client: HttpClient, *, status: int, reason: str,
                 headers: dict[str, str], version: str, method: str,
                 read_timeout: float | None) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        """Names in lower case."""
        self._conn: _Conn | None = conn
        self._client = client
        self._read_timeout = read_timeout
        framing = Framing(status=status, headers=headers, version=version, method=method)
        self._keep_alive = framing.keep_alive
        self._chunked = framing.chunked
        self._remaining = framing.length  # bytes left of a Content-Length body
        self._framing = framing
        self._done = self._remaining == 0
        self._buffer = b""

    @property
    def at_eof(self) -> bool:
        """The whole body has been read."""
        return self._done and not self._buffer

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = [self._buffer]
        self._buffer = b""
        while chunk := await self._next():
            parts.append(chunk)
        return b"".join(parts)

    async def text(self) -> str:
        return (await self.read()).decode(errors="replace")

    async def readline(self) -> bytes:
        """The body's next line with its ``\\n``; the rest without one at the end; ``b""``
        once the body is over."""
        while (end := self._buffer.find(b"\n")) < 0:
            chunk = await self._next()
            if not chunk:
                line, self._buffer = self._buffer, b""
                return line
            self._buffer += chunk
        line, self._buffer = self._buffer[:end + 1], self._buffer[end + 1:]
        return line

    def release(self) -> None:
        """Give the connection back for the next request if the answer was read to its
        end and the server keeps it open; else close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep_alive:
            self._client._release(conn)
        else:
            self._client._discard(conn)

    def close(self) -> None:
        """Close the connection, whatever is left of the body."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._client._discard(conn)

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    async def _next(self) -> bytes:
        """The next decoded piece of the body; ``b""`` at its end."""
        while not self._done:
            data = await self._next_raw()
            if self._framing.gunzip is None:
                return data
            data = self._framing.decoded(data)
            if data:
                return data
        return b""

    async def _next_raw(self) -> bytes:
        """The next piece of the body as sent; sets ``_done`` after the last."""
        if self._conn is None:
            raise HttpError("the response was released")
        reader, timeout = self._conn.reader, self._read_timeout
        if self._chunked:
            n = chunk_size(await _line(reader, timeout))
            if n == 0:
                await _headers(reader, timeout)  # trailer fields, ignored
                self._done = True
                return b""
            data = await self._exactly(n + 2)
            if not data.endswith(b"\r\n"):
                raise BadResponse("a chunk does not end with CRLF")
            return data[:-2]
        if self._remaining is None:  # until the connection ends
            data = await _within(timeout, reader.read(READ_SIZE))
            self._done = not data
            return data
        data = await _within(timeout, reader.read(min(self._remaining, READ_SIZE)))
        if not data:
            raise ServerDisconnected(
                f"the server closed the connection {self._remaining} bytes short of the body")
        self._remaining -= len(data)
        self._done = self._remaining == 0
        return data

    async def _exactly(self, n: int) -> bytes:
        assert self._conn is not None
        try:
            return await _within(self._read_timeout, self._conn.reader.readexactly(n))
        except asyncio.IncompleteReadError as exc:
            raise ServerDisconnected("the server closed the connection mid-chunk") from exc
