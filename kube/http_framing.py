"""HTTP/1.1 as bytes, without I/O: the request head we send, how an answer is framed, and
the limits an answer must keep (a server is not trusted to be small).

The I/O is :mod:`gpudra.kube.http_client`'s.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Final
from urllib.parse import urlencode, urlsplit

IDEMPOTENT: Final = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
"""Methods sent once more on a new connection when a pooled one turns out stale
(RFC 9110 9.2.2; Go's transport and aiohttp do the same)."""
MAX_HEADERS: Final = 128
"""Header fields of one answer (interim 1xx answers and trailers count too)."""
MAX_LINE: Final = 65536
"""Longest status, header or chunk-size line (asyncio's stream limit)."""
MAX_HEAD: Final = 1 << 20
"""Bytes of one answer's head: status lines and header fields, interim answers included."""
MAX_BODY: Final = 64 << 20
"""Default for the bytes of one body, as sent and as unpacked, and of one line of a
stream: an object is at most ~1.5 MiB in etcd, and a list is read in pages."""
READ_SIZE: Final = 65536
"""Most bytes read, or unpacked, in one step."""
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


class HttpError(Exception):
    """No usable answer: the connection closed early, the answer is not HTTP/1.1, or the
    server's URL is not one to send requests to."""


class ServerDisconnected(HttpError):
    """The server closed the connection before the answer was complete."""


class BadResponse(HttpError):
    """The answer breaks HTTP/1.1 framing (status line, headers, chunk sizes)."""


class TooLarge(BadResponse):
    """The answer is larger than the client accepts: a head, a line, a chunk or a body,
    as sent or unpacked."""


class Server:
    """Where requests go (``base_url``'s path is a prefix of every request's) and the
    head each one starts with."""

    __slots__ = ("_common", "_origin", "address", "prefix", "tls")

    def __init__(self, base_url: str, *, absolute: bool = False,
                 extra_head: str = "") -> None:
        """``absolute``: request targets are whole URLs (to an HTTP proxy);
        ``extra_head``: header lines (CRLF-ended) every request carries."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpError(f"server {base_url!r} is not an http or https URL")
        self.tls = parts.scheme == "https"
        self.address = (parts.hostname, parts.port or (443 if self.tls else 80))
        self.prefix = parts.path.rstrip("/")
        self._origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}" if absolute else ""
        # What every request's head says after its request line.
        self._common = (f"\r\nHost: {parts.netloc.rpartition('@')[2]}\r\nUser-Agent: gpudra"
                        "\r\nAccept-Encoding: gzip" + (f"\r\n{extra_head.rstrip()}"
                                                         if extra_head else ""))

    def head(self, method: str, path: str, query: Sequence[tuple[str, str]],
             headers: Mapping[str, str] | None, body: bytes | None) -> bytes:
        """The request line and header fields, ending with the blank line."""
        target = self._origin + self.prefix + path + (f"?{urlencode(query)}" if query else "")
        lines = [f"{method} {target} HTTP/1.1{self._common}"]
        for name, value in (headers or {}).items():
            if "\n" in value or "\r" in value:  # a token read from a file, say
                raise HttpError(f"the {name} header has a line break in it")
            if not value.isascii():  # HTTP/1.1 field values are bytes; tokens are ASCII
                raise HttpError(f"the {name} header has a character that is not ASCII")
            lines.append(f"{name}: {value}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def status_line(line: bytes) -> tuple[str, int, str]:
    """(version, status, reason) of an answer's first line."""
    version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not (code.isdigit() and len(code) == 3):
        raise BadResponse(f"not an HTTP/1.1 status line: {line[:80]!r}")
    return version, int(code), reason


def add_header(headers: dict[str, str], line: bytes) -> bool:
    """Add one header line to ``headers`` (names in lower case, repeated fields joined
    with commas); False at the blank line that ends the head."""
    if line in (b"\r\n", b"\n"):
        return False
    name, colon, value = line.decode("latin-1").partition(":")
    if not colon or not name or name != name.strip():
        raise BadResponse(f"not a header field: {line[:80]!r}")
    name, value = name.lower(), value.strip()
    headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return True


def chunk_size(line: bytes, limit: int) -> int:
    """The size a chunked body's size line gives (extensions ignored): hexadecimal digits
    only (no sign, no ``0x``), at most ``limit``."""
    size = line.split(b";", 1)[0].strip()
    if not _CHUNK_SIZE.fullmatch(size):
        raise BadResponse(f"not a chunk size: {line[:40]!r}")
    n = int(size, 16)
    if n > limit:
        raise TooLarge(f"a chunk of {n} bytes is larger than the limit of {limit} bytes")
    return n


class Framing:
    """How an answer's body is delimited, from its head: chunks, a length, or the
    connection's end; and whether the connection can carry another request after it."""

    __slots__ = ("_more", "chunked", "gunzip", "keep_alive", "length")

    def __init__(self, *, status: int, headers: Mapping[str, str], version: str,
                 method: str, max_body: int = MAX_BODY) -> None:
        connection = headers.get("connection", "").lower()
        self.keep_alive = ("close" not in connection if version == "HTTP/1.1"
                           else "keep-alive" in connection)
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.length: int | None = None
        """Bytes of a Content-Length body; None: chunked, or until the connection ends."""
        if method == "HEAD" or status in (204, 304):
            self.length = 0
        elif not self.chunked:
            length = headers.get("content-length")
            if length is None:
                self.keep_alive = False  # the body ends with the connection
            elif not (length.isascii() and length.isdigit()):
                raise BadResponse(f"Content-Length {length[:40]!r} is not a number")
            elif len(length) > 20 or int(length) > max_body:
                raise TooLarge(f"a body of {length[:40]} bytes (Content-Length) is larger "
                               f"than the limit of {max_body} bytes")
            else:
                self.length = int(length)
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding not in ("identity", "gzip"):
            raise BadResponse(f"Content-Encoding {encoding!r} was not asked for")
        self.gunzip = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
        self._more = False

    @property
    def inflating(self) -> bool:
        """Bytes already received still have more to unpack: call :meth:`decoded` with
        ``b""`` before reading more."""
        return self._more

    def decoded(self, data: bytes, *, last: bool = False) -> bytes:
        """At most READ_SIZE bytes of the gzip body unpacked from ``data`` and what earlier
        calls left over (a few bytes can unpack to gigabytes: never all at once); ``last``:
        the body has ended."""
        gunzip = self.gunzip
        assert gunzip is not None
        try:
            out = gunzip.decompress(gunzip.unconsumed_tail + data, READ_SIZE)
            self._more = bool(gunzip.unconsumed_tail) or len(out) == READ_SIZE
            if last and not self._more and not gunzip.eof:
                out += gunzip.flush(READ_SIZE)
            return out
        except zlib.error as exc:
            raise BadResponse(f"the gzip body is corrupt ({exc})") from exc
