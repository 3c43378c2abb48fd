"""A blocking HTTP/1.1 client for threads that must not wait on the event loop.

A kubelet call runs in its own thread (:mod:`gpudra.kubeletplugin.core_server`); sending
its claim GET through the event loop costs two thread hand-offs and a task per call, about
a tenth of a prepare. This client sends it from the calling thread instead, speaking the
same HTTP as the asyncio client (:mod:`gpudra.kube.http_framing`): keep-alive connections
shared by all threads, Content-Length, chunked and until-close bodies, gzip, and https
through the session's :class:`ssl.SSLContext`.

Only whole answers: a request returns once its body has been read (no streams, no
watches). One ``timeout`` bounds the whole request, connecting included. The retry rule is
the asyncio client's: a request on a pooled connection that the server closed while it sat
idle goes once more on a new connection if its method is idempotent.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gpudra.kube.http_framing import (
    IDEMPOTENT,
    MAX_HEADERS,
    MAX_LINE,
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

MAX_IDLE: Final = 8
"""Unused connections kept: one per call thread busy at once is plenty."""
IDLE_TIMEOUT: Final = 15.0
"""Seconds an unused connection is trusted; older ones are closed at the next request
(the asyncio client's limit; the API server keeps them longer)."""


@dataclass(frozen=True)
class Answer:
    """A whole answer: status, header fields (names in lower case) and decoded body."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


class _NoAnswer(Exception):
    """Internal: the connection ended before the first byte of an answer."""


class _Conn:
    """One connection, the bytes read from it but not yet used, and when it went idle."""

    __slots__ = ("buffer", "cut", "idle_since", "sock", "want_read")

    def __init__(self, sock: socket.socket, want_read: tuple[type[OSError], ...]) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.idle_since = 0.0
        self.want_read = want_read
        """What a non-blocking read raises when there is nothing to read."""
        self.cut = False
        """The client was closed while this connection was in use."""

    def send(self, data: bytes, deadline: float) -> None:
        self.sock.settimeout(_left(deadline))
        self.sock.sendall(data)

    def readline(self, deadline: float) -> bytes:
        """One line with its ``\\n``; what is left, without one, if the server closes."""
        start = 0
        while (end := self.buffer.find(b"\n", start)) < 0:
            if len(self.buffer) >= MAX_LINE:
                raise BadResponse("a status, header or chunk-size line is too long")
            start = len(self.buffer)
            if not self._fill(deadline):
                line = bytes(self.buffer)
                self.buffer.clear()
                return line
        line = bytes(self.buffer[:end + 1])
        del self.buffer[:end + 1]
        return line

    def read(self, n: int, deadline: float) -> bytes:
        """Up to ``n`` bytes, as soon as there are any; ``b""`` once the server closed."""
        if not self.buffer and not self._fill(deadline):
            return b""
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def _fill(self, deadline: float) -> bool:
        """Wait for more bytes; False when the server has closed the connection."""
        if self.cut:
            raise HttpError("the client is closed")
        self.sock.settimeout(_left(deadline))
        data = self.sock.recv(READ_SIZE)
        if self.cut:  # woken by close(): what recv() saw is not the server's answer
            raise HttpError("the client is closed")
        self.buffer += data
        return bool(data)

    def cut_off(self) -> None:
        """Wake a thread blocked reading this connection (close() from another thread)."""
        self.cut = True
        # The plain socket's shutdown: SSLSocket.shutdown() also drops the TLS state, and a
        # recv() in flight would then read the TLS records as if they were the answer.
        with contextlib.suppress(OSError):  # already closed by the server
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)

    def idle_and_open(self) -> bool:
        """Nothing to read and not closed by the server: fit for the next request."""
        try:
            self.sock.settimeout(0.0)
            self.sock.recv(1)  # a TLS socket handles records (tickets) in here
        except self.want_read:
            return True
        except OSError:
            return False
        return False  # closed (b"") or something unasked for: either way not usable

    def close(self) -> None:
        self.sock.close()


class BlockingHttpClient:
    """Blocking requests to the server at ``base_url``, from any thread."""

    def __init__(self, base_url: str, *, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str | None = None) -> None:
        self._server = Server(base_url)
        self._ssl: ssl.SSLContext | None = None
        self._want_read: tuple[type[OSError], ...] = (BlockingIOError,)
        if self._server.tls:
            import ssl  # only for https (tests and `kubectl proxy` speak http)

            self._ssl = ssl_context or ssl.create_default_context()
            self._want_read = (BlockingIOError, ssl.SSLWantReadError)
        self._server_hostname = server_hostname or self._server.address[0]
        self._lock = threading.Lock()
        self._idle: list[_Conn] = []
        self._busy: set[_Conn] = set()
        self._closed = False

    def request(self, method: str, path: str, *, query: Sequence[tuple[str, str]] = (),
                headers: Mapping[str, str] | None = None, body: bytes | None = None,
                timeout: float) -> Answer:
        """Send one request and read its whole answer within ``timeout`` seconds
        (TimeoutError after that); transport failures are :class:`HttpError` or OSError."""
        if self._closed:
            raise HttpError("the client is closed")
        deadline = time.monotonic() + timeout
        head = self._server.head(method, path, query, headers, body)
        pooled = True
        while True:
            conn, reused = self._acquire(deadline, pooled=pooled)
            try:
                try:
                    conn.send(head + body if body else head, deadline)
                except TimeoutError:
                    raise
                except OSError as exc:  # reset: the server closed it; same as no answer
                    raise _NoAnswer from exc
                answer, keep = _read_answer(conn, method, deadline)
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
            if keep and not conn.buffer:  # bytes beyond the answer: not to the next one
                self._release(conn)
            else:
                self._discard(conn)
            return answer

    def close(self) -> None:
        """Close every connection; requests still in flight fail at once."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
        for conn in idle:
            conn.close()
        for conn in busy:
            conn.cut_off()  # the thread using it closes it

    def _acquire(self, deadline: float, *, pooled: bool) -> tuple[_Conn, bool]:
        """A pooled connection (True), if ``pooled`` allows, or a new one (False); busy."""
        while pooled:
            with self._lock:
                stale = self._stale()
                conn = self._idle.pop() if self._idle else None
            for old in stale:
                old.close()
            if conn is None:
                break
            if conn.idle_and_open():
                with self._lock:
                    closed = self._closed  # while it was out of both sets: not woken
                    if not closed:
                        self._busy.add(conn)
                if not closed:
                    return conn, True
            conn.close()
        if self._closed:  # close() cut the request short: no resend on a new connection
            raise HttpError("the client is closed")
        conn = _Conn(self._connect(deadline), self._want_read)
        with self._lock:
            if self._closed:  # closed while connecting: nobody else will close it
                conn.close()
                raise HttpError("the client is closed")
            self._busy.add(conn)
        return conn, False

    def _connect(self, deadline: float) -> socket.socket:
        """A connection to the server, TCP and TLS, within ``deadline`` (each address
        the name resolves to is tried in turn; the name lookup itself cannot be bounded:
        the API server is usually an address, the service's or a kubeconfig's)."""
        host, port = self._server.address
        try:
            addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot resolve {host}: {exc.strerror or exc}") from exc
        failure: OSError | None = None
        for family, kind, proto, _, address in addresses:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(_left(deadline))
                sock.connect(address)
                break
            except TimeoutError:
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                failure = exc
        else:
            reason = (failure.strerror or str(failure)) if failure else "no address"
            raise OSError(getattr(failure, "errno", None),
                          f"cannot connect to {host}:{port}: {reason}") from failure
        try:
            # Requests are one small write each: do not wait for an ACK (asyncio does the
            # same for its connections).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is None:
                return sock
            sock.settimeout(_left(deadline))
            return self._ssl.wrap_socket(sock, server_hostname=self._server_hostname)
        except BaseException:
            sock.close()
            raise

    def _release(self, conn: _Conn) -> None:
        """Back to the pool after a complete answer that keeps the connection open."""
        conn.idle_since = time.monotonic()
        with self._lock:
            self._busy.discard(conn)
            if self._closed:
                spare = [conn]
            else:
                self._idle.append(conn)
                spare = self._stale()
                if len(self._idle) > MAX_IDLE:
                    # The oldest goes: the least likely to be used again.
                    spare.append(self._idle.pop(0))
        for old in spare:
            old.close()

    def _stale(self) -> list[_Conn]:
        """Take the connections idle for longer than IDLE_TIMEOUT out of the pool (held
        lock); the caller closes them. The pool is oldest first."""
        cutoff = time.monotonic() - IDLE_TIMEOUT
        n = 0
        while n < len(self._idle) and self._idle[n].idle_since <= cutoff:
            n += 1
        stale, self._idle[:n] = self._idle[:n], []
        return stale

    def _discard(self, conn: _Conn) -> None:
        with self._lock:
            self._busy.discard(conn)
        conn.close()


def _read_answer(conn: _Conn, method: str, deadline: float) -> tuple[Answer, bool]:
    """The answer to the request just sent, and whether its connection can be reused."""
    try:
        first = conn.readline(deadline)
    except TimeoutError:
        raise
    except OSError as exc:  # reset, or a TLS connection cut short
        raise _NoAnswer from exc
    if not first:
        raise _NoAnswer
    while True:
        version, status, reason = status_line(first)
        headers = _headers(conn, deadline)
        if not 100 <= status < 200:
            break
        first = _line(conn, deadline)  # an interim answer: the real one follows
    framing = Framing(status=status, headers=headers, version=version, method=method)
    body = _body(conn, framing, deadline)
    if framing.gunzip is not None:
        body = framing.decoded(body) + framing.decoded(b"")
    return Answer(status, reason, headers, body), framing.keep_alive


def _line(conn: _Conn, deadline: float) -> bytes:
    line = conn.readline(deadline)
    if not line.endswith(b"\n"):
        raise ServerDisconnected("the server closed the connection mid-answer")
    return line


def _headers(conn: _Conn, deadline: float) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        if not add_header(headers, _line(conn, deadline)):
            return headers
    raise BadResponse(f"more than {MAX_HEADERS} header fields")


def _body(conn: _Conn, framing: Framing, deadline: float) -> bytes:
    """The body as sent (before gunzip)."""
    parts: list[bytes] = []
    if framing.chunked:
        while n := chunk_size(_line(conn, deadline)):
            data = _exactly(conn, n + 2, deadline)
            if not data.endswith(b"\r\n"):
                raise BadResponse("a chunk does not end with CRLF")
            parts.append(data[:-2])
        _headers(conn, deadline)  # trailer fields, ignored
    elif framing.length is None:  # until the connection ends
        while data := conn.read(READ_SIZE, deadline):
            parts.append(data)
    else:
        remaining = framing.length
        while remaining:
            data = conn.read(remaining, deadline)
            if not data:
                raise ServerDisconnected(f"the server closed the connection {remaining} "
                                         "bytes short of the body")
            parts.append(data)
            remaining -= len(data)
    return b"".join(parts)


def _exactly(conn: _Conn, n: int, deadline: float) -> bytes:
    parts: list[bytes] = []
    while n:
        data = conn.read(n, deadline)
        if not data:
            raise ServerDisconnected("the server closed the connection mid-chunk")
        parts.append(data)
        n -= len(data)
    return b"".join(parts)


def _left(deadline: float) -> float:
    """Seconds until ``deadline``; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request's deadline passed")
    return left
