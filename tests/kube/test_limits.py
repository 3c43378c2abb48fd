"""A hostile API server cannot make the client hold more than its limits, or wait past its
deadline (issue 27 item 4): bodies as sent and as unpacked, chunks, heads and their lines,
stream lines, and answers that never end. Each is a typed API error naming the limit,
against a real local HTTP server that sends exactly those bytes."""

from __future__ import annotations

import tracemalloc
import zlib
from collections.abc import Iterator

import pytest

from gpudra.kube.errors import BadAnswer, Unreachable
from gpudra.kube.http_client import HttpClient, TooLarge
from gpudra.kube.http_framing import MAX_BODY, MAX_HEAD, MAX_HEADERS
from gpudra.kube.raw_api import MAX_OBJECT, NODES, RESOURCE_SLICES, RawApi
from gpudra.kube.session import ApiSession
from tests.kube.scripted_server import Piece, chunked, ok, scripted

MiB = 1 << 20
GiB = 1 << 30


def gzip_bomb(inflated: int = GiB) -> bytes:
    """A gzip body of about 1 MiB that unpacks to ``inflated`` bytes of zeros: after a full
    flush, deflate forgets its history, so every MiB of zeros packs to the same bytes."""
    zeros = bytes(MiB)
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    first = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(inflated // MiB):
        crc = zlib.crc32(zeros, crc)
    trailer = b"\x03\x00" + crc.to_bytes(4, "little") + (inflated % (1 << 32)).to_bytes(
        4, "little")
    return first + again * (inflated // MiB - 1) + trailer


def test_the_bomb_is_what_it_says():
    bomb = gzip_bomb(64 * MiB)
    assert len(bomb) < 128 * 1024
    unpacker = zlib.decompressobj(16 + zlib.MAX_WBITS)
    total = 0
    data = bomb
    while data or not unpacker.eof:
        total += len(unpacker.decompress(data, 8 * MiB))
        data = unpacker.unconsumed_tail
    assert total == 64 * MiB and unpacker.eof


async def get_through_raw_api(url: str, deadline: float = 5.0) -> Exception:
    async with ApiSession.for_url(url) as session:
        with pytest.raises((BadAnswer, Unreachable)) as caught:
            await RawApi(session, timeout=deadline).get(NODES, "node-a")
    return caught.value


async def test_a_gzip_bomb_is_refused_at_the_limit_with_memory_bounded():
    bomb = gzip_bomb()  # 1 GiB unpacked
    assert len(bomb) < 1.1 * MiB
    limit = 8 * MiB
    async with scripted(lambda r, i: ok(bomb, "Content-Encoding: gzip")) as server:
        client = HttpClient(server.url, max_body=limit)
        try:
            tracemalloc.start()
            try:
                response = await client.request("GET", "/x", connect_timeout=2)
                with pytest.raises(TooLarge) as caught:
                    await response.read()
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        finally:
            await client.close()
    assert str(caught.value) == f"the body is larger than the limit of {limit} bytes"
    # The parts read so far, one more step, and their joining never happened: not 1 GiB.
    assert peak < 3 * limit


async def test_a_gzip_bomb_through_the_raw_api_is_a_bad_answer_naming_the_limit():
    bomb = gzip_bomb()
    async with scripted(lambda r, i: ok(bomb, "Content-Encoding: gzip")) as server:
        error = await get_through_raw_api(server.url)
    assert isinstance(error, BadAnswer) and error.reason == "TooLarge"
    assert str(error) == (f"get nodes/node-a: TooLarge: the body is larger than the limit of "
                          f"{MAX_OBJECT} bytes")


def endless(piece: bytes) -> Iterator[Piece]:
    while True:
        yield piece


async def test_one_huge_chunk_is_refused_at_its_size_line():
    size = 3 * GiB // 2

    def answer(request: object, index: int) -> Iterator[Piece]:
        yield b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % size
        yield from endless(bytes(64 * 1024))

    async with scripted(answer) as server:
        error = await get_through_raw_api(server.url)
    assert isinstance(error, BadAnswer) and error.reason == "TooLarge"
    assert error.message == (f"a chunk of {size} bytes is larger than the limit of "
                             f"{MAX_OBJECT} bytes")


async def test_a_huge_content_length_is_refused_before_the_body():
    size = 3 * GiB // 2
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size

    def answer(request: object, index: int) -> Iterator[Piece]:
        yield head
        yield from endless(bytes(64 * 1024))

    async with scripted(answer) as server:
        error = await get_through_raw_api(server.url)
    assert isinstance(error, BadAnswer) and error.reason == "TooLarge"
    assert error.message == (f"a body of {size} bytes (Content-Length) is larger than the "
                             f"limit of {MAX_BODY} bytes")


async def test_many_small_chunks_are_counted_together():
    async with scripted(lambda r, i: chunked(*[bytes(MiB)] * 3)) as server:
        client = HttpClient(server.url, max_body=2 * MiB)
        try:
            response = await client.request("GET", "/x", connect_timeout=2)
            with pytest.raises(TooLarge, match="the body is larger than the limit of 2097152"):
                await response.read()
        finally:
            await client.close()


@pytest.mark.parametrize("size_line", [b"-5", b"0x10", b"+5", b" ", b"1" * 17, b"5 5"])
async def test_a_chunk_size_that_is_not_hexadecimal_digits_is_a_typed_error(size_line):
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size_line + b"\r\n{}"
    async with scripted(lambda r, i: [answer, 5.0]) as server:
        error = await get_through_raw_api(server.url)
    assert isinstance(error, Unreachable) and error.reason == "BadResponse"
    assert error.message.startswith("not a chunk size: ")


@pytest.mark.parametrize(("head", "message"), [
    (b"X-Many: 1\r\n" * (MAX_HEADERS + 1),
     f"the answer has more than {MAX_HEADERS} header fields"),
    (b"X-Big: " + b"a" * 70_000 + b"\r\n",
     "a header or chunk-size line is longer than the limit of 64 KiB"),
    ((b"X-Wide: " + b"b" * 60_000 + b"\r\n") * 20,
     f"the answer's head is larger than the limit of {MAX_HEAD} bytes"),
    (b"", "the status line is longer than the limit of 64 KiB"),
], ids=["fields", "line", "block", "status-line"])
async def test_huge_heads_and_lines_are_refused(head, message):
    first = b"HTTP/1.1 200 OK" + (b"" if head else b" " + b"x" * 70_000) + b"\r\n"
    async with scripted(lambda r, i: [first + head + b"Content-Length: 2\r\n\r\n{}"]) as server:
        error = await get_through_raw_api(server.url)
    assert isinstance(error, BadAnswer) and error.reason == "TooLarge"
    assert error.message == message


async def test_endless_interim_answers_are_a_head_too_large():
    answer = endless(b"HTTP/1.1 100 Continue\r\n\r\n")
    async with scripted(lambda r, i: answer) as server:
        error = await get_through_raw_api(server.url)
    assert isinstance(error, BadAnswer) and error.reason == "TooLarge"
    assert error.message == f"the answer's head is larger than the limit of {MAX_HEAD} bytes"


async def test_a_slow_endless_answer_ends_at_the_deadline_of_the_whole_call():
    # A byte every 20 ms: each wait for bytes is short, the whole never ends.
    def answer(request: object, index: int) -> Iterator[Piece]:
        yield b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        while True:
            yield b"1\r\n \r\n"
            yield 0.02

    async with scripted(answer) as server:
        error = await get_through_raw_api(server.url, deadline=0.5)
        assert server.closed_by_client == 1  # the client hung up; the server did not stop
    assert isinstance(error, Unreachable) and error.reason == "Timeout"
    assert error.message == "no answer within 0.5s"


async def test_a_fast_endless_answer_ends_at_the_limit():
    def answer(request: object, index: int) -> Iterator[Piece]:
        yield b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
        yield from endless(bytes(64 * 1024))

    async with scripted(answer) as server:
        error = await get_through_raw_api(server.url)
        async with ApiSession.for_url(server.url) as session:
            with pytest.raises(BadAnswer) as listed:
                await RawApi(session, timeout=5).list(NODES)
    assert isinstance(error, BadAnswer) and error.reason == "TooLarge"
    assert error.message == f"the body is larger than the limit of {MAX_OBJECT} bytes"
    # A list's page may be larger than an object, up to the client's own limit.
    assert listed.value.message == f"the body is larger than the limit of {MAX_BODY} bytes"


async def test_a_watch_line_past_the_limit_is_a_bad_answer():
    def answer(request: object, index: int) -> Iterator[Piece]:
        yield b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        yield from endless(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")  # never a newline

    async with scripted(answer) as server, ApiSession.for_url(server.url) as session:
        api = RawApi(session, timeout=5)
        async with await api.watch(RESOURCE_SLICES, field_selector="", resource_version="1",
                                   timeout_seconds=30) as stream:
            with pytest.raises(BadAnswer) as caught:
                await stream.next()
    assert caught.value.reason == "TooLarge"
    assert caught.value.message == (f"a line of the stream is longer than the limit of "
                                    f"{MAX_OBJECT} bytes")


async def test_a_watch_stream_longer_than_the_limit_is_fine_line_by_line():
    line = b'{"type": "BOOKMARK", "object": {}}\n'
    lines = 4 * 1024
    async with scripted(lambda r, i: chunked(*[line * 256] * (lines // 256))) as server:
        client = HttpClient(server.url, max_body=64 * 1024)  # less than the whole stream
        try:
            response = await client.request("GET", "/w", connect_timeout=2)
            count = 0
            while await response.readline():
                count += 1
            response.release()
        finally:
            await client.close()
    assert count == lines and len(line) * lines > 64 * 1024
