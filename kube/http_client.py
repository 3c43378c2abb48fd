"""A small HTTP/1.1 client on asyncio streams: what the daemon and the CLI ask of the API
server.

This client speaks to one server: keep-alive connections in a pool (as many at once as
requests in flight; a watch holds one for its lifetime), bodies framed by Content-Length,
chunked transfer encoding or the connection's end, gzip, https through :mod:`ssl`, and an
HTTP proxy (``CONNECT`` for https, the absolute URL for http; :mod:`gpudra.kube.proxy`).

Limits (:mod:`gpudra.kube.http_framing`): an answer's head, each of its lines, each chunk,
each body (as sent and as unpacked: gzip is unpacked a step at a time) and each line of a
stream are bounded; past a limit the answer is a :class:`TooLarge` and its connection is
closed. Nothing the server sends is held whole before it is counted.

Timeouts: ``connect_timeout`` bounds getting a connection (TCP, proxy and TLS);
``read_timeout``, when given, bounds each wait for the server's next bytes, headers and body
alike (a watch that goes quiet). A deadline for the whole call is the caller's
``asyncio.timeout`` (:class:`gpudra.kube.raw_api.RawApi` sets one over head and body); a
request cut short by one leaves its connection closed, never back in the pool.

Retries: a request sent on a pooled connection that the server closed while it sat idle
(the close crossed the request, and not one byte of an answer came back) is sent once more
on a new connection if its method is idempotent (RFC 9110 9.2.2: GET, HEAD, PUT, DELETE,
OPTIONS), as Go's transport and aiohttp do. A new connection that fails is not retried:
the server did see the request, or could not be reached; the caller's back-off decides.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, TypeVar
from urllib.parse import unquote, urlsplit

from gpudra.kube.http_framing import (
    IDEMPOTENT,
    MAX_BODY,
    MAX_HEAD,
    MAX_HEADERS,
    READ_SIZE,
    BadResponse,
    Framing,
    HttpError,
    Server,
    ServerDisconnected,
    TooLarge,
    add_header,
    chunk_size,
    status_line,
)

if TYPE_CHECKING:
    import ssl

T = TypeVar("T")

__all__ = ["BadResponse", "HttpClient", "HttpError", "Response", "ServerDisconnected",
           "TooLarge"]

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
                 server_hostname: str | None = None, max_body: int = MAX_BODY,
                 proxy: str | None = None) -> None:
        self._proxy = _Proxy(proxy) if proxy else None
        self._server = Server(base_url)
        if self._proxy is not None and not self._server.tls:
            self._server = Server(base_url, absolute=True,
                                  extra_head=self._proxy.authorization)
        self.max_body = max_body
        """Most bytes of one body, as sent and as unpacked, and of one line of a stream."""
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
            reader, writer = await self._connect()
        conn = _Conn(reader, writer)
        if self._closed:  # closed while connecting: nobody else will close it
            writer.transport.abort()
            raise HttpError("the client is closed")
        self._busy.add(conn)
        return conn, False

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new connection to the server: directly, or through the proxy (a ``CONNECT``
        tunnel for https, then TLS with the server inside it)."""
        if self._proxy is None:
            return await asyncio.open_connection(
                *self._server.address, ssl=self._ssl, server_hostname=self._server_hostname)
        reader, writer = await asyncio.open_connection(*self._proxy.address)
        if self._ssl is None:
            return reader, writer
        try:
            host, port = self._server.address
            authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
                         f"{self._proxy.authorization}\r\n".encode("latin-1"))
            line = await _line(reader, None)
            head = _Head()
            head.count(line, field=False)
            _, status, reason = status_line(line)
            await _headers(reader, None, head)
            if status != 200:
                raise HttpError(f"the proxy {self._proxy.address[0]}:{self._proxy.address[1]} "
                                f"refused CONNECT {authority}: {status} {reason}")
            await writer.start_tls(self._ssl, server_hostname=self._server_hostname or host)
        except BaseException:
            writer.transport.abort()
            raise
        return reader, writer

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


class _Proxy:
    """An ``http://`` proxy: where it listens and the ``Proxy-Authorization`` its URL's
    user and password make."""

    __slots__ = ("address", "authorization")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise HttpError(f"proxy {url!r} is not an http:// URL (https and socks proxies "
                            "are not supported)")
        self.address = (parts.hostname, parts.port or 80)
        self.authorization = ""
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.authorization = ("Proxy-Authorization: Basic "
                                  f"{base64.b64encode(pair.encode()).decode()}\r\n")


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
        raise TooLarge("the status line is longer than the limit of "
                       f"{MAX_LINE_TEXT}") from exc
    if not first:
        raise _NoAnswer
    head = _Head()
    while True:
        head.count(first, field=False)
        version, status, reason = status_line(first)
        headers = await _headers(reader, read_timeout, head)
        if not 100 <= status < 200:
            break
        first = await _line(reader, read_timeout)  # an interim answer: the real one follows
    return Response(conn, client, status=status, reason=reason, headers=headers,
                    version=version, method=method, read_timeout=read_timeout)


MAX_LINE_TEXT: Final = "64 KiB"


class _Head:
    """What one answer's head has used of the limits: bytes and header fields."""

    __slots__ = ("bytes", "fields")

    def __init__(self) -> None:
        self.bytes = 0
        self.fields = 0

    def count(self, line: bytes, *, field: bool) -> None:
        self.bytes += len(line)
        self.fields += field
        if self.bytes > MAX_HEAD:
            raise TooLarge(f"the answer's head is larger than the limit of {MAX_HEAD} bytes")
        if self.fields > MAX_HEADERS:
            raise TooLarge(f"the answer has more than {MAX_HEADERS} header fields")


async def _line(reader: asyncio.StreamReader, read_timeout: float | None) -> bytes:
    """One CRLF-ended line of the head or of chunk framing."""
    try:
        line = await _within(read_timeout, reader.readline())
    except ValueError as exc:  # longer than the reader's limit (64 KiB)
        raise TooLarge("a header or chunk-size line is longer than the limit of "
                       f"{MAX_LINE_TEXT}") from exc
    if not line.endswith(b"\n"):
        raise ServerDisconnected("the server closed the connection mid-answer")
    return line


async def _headers(reader: asyncio.StreamReader, read_timeout: float | None,
                   head: _Head) -> dict[str, str]:
    """The header fields, names in lower case; repeated fields joined with commas."""
    headers: dict[str, str] = {}
    while True:
        line = await _line(reader, read_timeout)
        head.count(line, field=line not in (b"\r\n", b"\n"))
        if not add_header(headers, line):
            return headers


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
        self._max_body = client.max_body
        # A head promising too much raises here; request() closes the connection.
        framing = Framing(status=status, headers=headers, version=version, method=method,
                          max_body=self._max_body)
        self._keep_alive = framing.keep_alive
        self._chunked = framing.chunked
        self._remaining = framing.length  # bytes left of a Content-Length body
        self._chunk_left = 0  # data bytes left of the current chunk of a chunked body
        self._framing = framing
        self._done = self._remaining == 0
        self._raw_done = self._done
        self._buffer = b""

    def limit(self, max_body: int) -> None:
        """Accept at most ``max_body`` bytes of the body (of each line, read by lines)
        from now on, if less than the client's limit."""
        self._max_body = min(self._max_body, max_body)

    @property
    def at_eof(self) -> bool:
        """The whole body has been read."""
        return self._done and not self._buffer

    async def read(self) -> bytes:
        """The rest of the body; :class:`TooLarge` past the client's ``max_body``."""
        parts = [self._buffer]
        size = len(self._buffer)
        self._buffer = b""
        while chunk := await self._next():
            size += len(chunk)
            if size > self._max_body:
                self.close()
                raise TooLarge(f"the body is larger than the limit of {self._max_body} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def text(self) -> str:
        return (await self.read()).decode(errors="replace")

    async def readline(self) -> bytes:
        """The body's next line with its ``\\n``; the rest without one at the end; ``b""``
        once the body is over. :class:`TooLarge` for a line past the client's
        ``max_body``."""
        parts: list[bytes] = []
        size = 0
        piece, self._buffer = self._buffer, b""
        while (end := piece.find(b"\n")) < 0:
            parts.append(piece)  # a list, not +=: a long line is not copied over and over
            size += len(piece)
            if size > self._max_body:
                self.close()
                raise TooLarge(f"a line of the stream is longer than the limit of "
                               f"{self._max_body} bytes")
            piece = await self._next()
            if not piece:
                return b"".join(parts)
        parts.append(piece[:end + 1])
        self._buffer = piece[end + 1:]
        return b"".join(parts)

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
        """The next decoded piece of the body, at most READ_SIZE bytes; ``b""`` at its
        end."""
        framing = self._framing
        if framing.gunzip is None:
            data = await self._next_raw() if not self._done else b""
            self._done = self._raw_done
            return data
        while not self._done:
            if framing.inflating:
                data = framing.decoded(b"")
            else:
                raw = await self._next_raw() if not self._raw_done else b""
                data = framing.decoded(raw, last=self._raw_done)
            self._done = self._raw_done and not framing.inflating
            if data:
                return data
        return b""

    async def _next_raw(self) -> bytes:
        """The next piece of the body as sent, at most READ_SIZE bytes; sets
        ``_raw_done`` after the last."""
        if self._conn is None:
            raise HttpError("the response was released")
        reader, timeout = self._conn.reader, self._read_timeout
        if self._chunked:
            if self._chunk_left == 0:
                n = chunk_size(await _line(reader, timeout), self._max_body)
                if n == 0:
                    await _headers(reader, timeout, _Head())  # trailer fields, ignored
                    self._raw_done = True
                    return b""
                self._chunk_left = n
            # A chunk is read a step at a time: its size is the server's word, not memory's.
            data = await self._exactly(min(self._chunk_left, READ_SIZE))
            self._chunk_left -= len(data)
            if self._chunk_left == 0 and await self._exactly(2) != b"\r\n":
                raise BadResponse("a chunk does not end with CRLF")
            return data
        if self._remaining is None:  # until the connection ends
            data = await _within(timeout, reader.read(READ_SIZE))
            self._raw_done = not data
            return data
        data = await _within(timeout, reader.read(min(self._remaining, READ_SIZE)))
        if not data:
            raise ServerDisconnected(
                f"the server closed the connection {self._remaining} bytes short of the body")
        self._remaining -= len(data)
        self._raw_done = self._remaining == 0
        return data

    async def _exactly(self, n: int) -> bytes:
        assert self._conn is not None
        try:
            return await _within(self._read_timeout, self._conn.reader.readexactly(n))
        except asyncio.IncompleteReadError as exc:
            raise ServerDisconnected("the server closed the connection mid-chunk") from exc
