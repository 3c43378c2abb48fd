"""A small scripted HTTP/1.1 server on 127.0.0.1 for the HTTP clients' tests: it answers
each request with the bytes (and pauses) a test gives, for the edges the test API server
cannot show (stale keep-alive connections, broken framing, stalls)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

Piece = bytes | float
"""What a scripted server sends: bytes, or a pause of so many seconds (cut short if the
client hangs up)."""
CLOSE: Piece = b""
"""As the last piece: the server closes the connection after answering, without a word."""


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    connection: int
    """Which connection (0, 1, ...) it came on."""


@dataclass
class Scripted:
    """A local HTTP/1.1 server that answers each request with ``answer(request, index)``:
    pieces (a list, or a generator for an answer that never ends), then keeps the
    connection open for the next request, unless the answer says ``Connection: close``
    or is None (closed without a word)."""

    answer: Callable[[Seen, int], Iterable[Piece] | None]
    """(the request, how many came before it) -> the answer; None: close, no answer."""
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    closed_by_client: int = 0
    sent: int = 0
    """Bytes of answers written so far."""
    url: str = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number, self.connections = self.connections, self.connections + 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ")
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                request = Seen(method, target, headers, body, number)
                self.seen.append(request)
                pieces = self.answer(request, len(self.seen) - 1)
                if pieces is None:
                    break
                close = False
                for piece in pieces:
                    if isinstance(piece, float):
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(piece):
                                if not await reader.read(1):  # clients never pipeline
                                    self.closed_by_client += 1
                                    return
                    else:
                        close = close or piece == CLOSE or b"Connection: close" in piece
                        writer.write(piece)
                        self.sent += len(piece)
                        await writer.drain()
                if close:
                    break
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                self.closed_by_client += 1
        except ConnectionError:
            self.closed_by_client += 1
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def scripted(answer: Callable[[Seen, int], Iterable[Piece] | None], *,
                   tls: ssl.SSLContext | None = None) -> AsyncIterator[Scripted]:
    """A :class:`Scripted` server on 127.0.0.1, speaking https through ``tls`` if given."""
    server = Scripted(answer)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=tls)
    scheme = "https" if tls else "http"
    server.url = f"{scheme}://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        yield server
    finally:
        listener.close()
        await listener.wait_closed()


def ok(body: bytes = b"{}", *extra: str) -> list[Piece]:
    head = "".join(f"{h}\r\n" for h in extra)
    return [f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body]


def chunked(*chunks: bytes, pause: float = 0.0, head: bytes = b"") -> list[Piece]:
    pieces: list[Piece] = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n%s\r\n" % head]
    for chunk in chunks:
        pieces += [b"%x;ext=1\r\n%s\r\n" % (len(chunk), chunk), pause]
    return [*pieces, b"0\r\nX-Trailer: t\r\n\r\n"]


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"not within {within:g} s"
        await asyncio.sleep(0.01)
