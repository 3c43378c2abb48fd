"""An HTTPS front for the test API server, and an HTTP ``CONNECT`` proxy, on 127.0.0.1 in a
thread of their own: what a client sent is recorded (the TLS server name it asked for, the
client certificate it showed, each request's ``Authorization``; the proxy's tunnels), and
the bytes go on to the plain-HTTP stand-in. For tests that run a client in-process
(``asyncio.run`` of their own) or as another process."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Seen:
    """What the front and the proxy saw since the last :meth:`Front.clear`."""

    server_names: list[str | None] = field(default_factory=list)
    client_subjects: list[str | None] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    """One per request: its header, or None."""
    tunnels: list[str] = field(default_factory=list)
    """The proxy's ``CONNECT`` targets."""


class Front:
    """Start with ``with Front(tls, backend_port) as front:``; ``front.port`` is the HTTPS
    port, ``front.proxy_port`` the proxy's, which tunnels every target to the front."""

    def __init__(self, tls: ssl.SSLContext, backend_port: int) -> None:
        self._tls = tls
        self._backend = backend_port
        self.seen = Seen()
        self._lock = threading.Lock()
        self._active = 0
        self._idle = threading.Condition(self._lock)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-front",
                                        daemon=True)
        self._servers: list[asyncio.Server] = []
        self.port = self.proxy_port = 0
        tls.sni_callback = self._sni

    def __enter__(self) -> Front:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def clear(self) -> None:
        with self._lock:
            self.seen = Seen()

    def settled(self, timeout: float = 10.0) -> Seen:
        """What was seen, once every connection has ended."""
        with self._idle:
            assert self._idle.wait_for(lambda: self._active == 0, timeout), "still connected"
            return self.seen

    async def _start(self) -> None:
        front = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._tls)
        proxy = await asyncio.start_server(self._tunnel, "127.0.0.1", 0)
        self._servers = [front, proxy]
        self.port = front.sockets[0].getsockname()[1]
        self.proxy_port = proxy.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()

    def _sni(self, sock: ssl.SSLObject | ssl.SSLSocket, name: str | None,
             context: ssl.SSLContext) -> None:
        with self._lock:
            self.seen.server_names.append(name)

    def _count(self, delta: int) -> None:
        with self._idle:
            self._active += delta
            self._idle.notify_all()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._count(1)
        sent = bytearray()
        try:
            peer = writer.get_extra_info("peercert") or {}
            subject = dict(x[0] for x in peer.get("subject", ())).get("commonName")
            with self._lock:
                self.seen.client_subjects.append(subject)
            back_reader, back_writer = await asyncio.open_connection("127.0.0.1", self._backend)
            await _pipe_both(reader, writer, back_reader, back_writer, sent)
        finally:
            with self._lock:
                self.seen.authorizations.extend(_authorizations(bytes(sent)))
            self._count(-1)

    async def _tunnel(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self._count(1)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
            with self._lock:
                self.seen.tunnels.append(f"{method} {target}")
            if method != "CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            back_reader, back_writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await _pipe_both(reader, writer, back_reader, back_writer, bytearray())
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._count(-1)


def _authorizations(stream: bytes) -> list[str | None]:
    """Each request's ``Authorization`` in a connection's bytes (bodies by length)."""
    found: list[str | None] = []
    position = 0
    while (end := stream.find(b"\r\n\r\n", position)) >= 0:
        fields = {k.strip().lower(): v.strip() for k, _, v in (
            line.partition(":") for line in
            stream[position:end].decode("latin-1").split("\r\n")[1:])}
        found.append(fields.get("authorization"))
        position = end + 4 + int(fields.get("content-length") or 0)
    return found


async def _pipe_both(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     back_reader: asyncio.StreamReader, back_writer: asyncio.StreamWriter,
                     sent: bytearray) -> None:
    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                   copy: bytearray | None) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
            while data := await src.read(65536):
                if copy is not None:
                    copy += data
                dst.write(data)
                await dst.drain()
        dst.close()

    await asyncio.gather(pipe(reader, back_writer, sent), pipe(back_reader, writer, None))


@contextlib.contextmanager
def front(tls: ssl.SSLContext, backend_port: int) -> Iterator[Front]:
    with Front(tls, backend_port) as started:
        yield started
