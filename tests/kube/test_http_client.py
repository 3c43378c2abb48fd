"""Our HTTP/1.1 client, over real sockets: to the test API server for what it can show
(keep-alive, concurrency, query strings, dropped connections) and to small scripted servers
on 127.0.0.1 for the edges (chunked streams, stale keep-alive connections, framing, gzip,
timeouts, closing)."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Iterator

import pytest

from gpudra.kube import http_client
from gpudra.kube.errors import Unreachable
from gpudra.kube.http_client import BadResponse, HttpClient, HttpError, ServerDisconnected
from gpudra.kube.raw_api import NODES, RESOURCE_CLAIMS, RESOURCE_SLICES, RawApi
from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.kube.scripted_server import CLOSE, Piece, Seen, chunked, eventually, ok, scripted


async def get(client: HttpClient) -> tuple[int, bytes]:
    async with await client.request("GET", "/x", connect_timeout=2) as response:
        return response.status, await response.read()


# --- keep-alive and the pool -----------------------------------------------------------------

async def test_sequential_requests_share_one_connection():
    async with scripted(lambda r, i: ok(b'{"n": %d}' % i)) as server:
        client = HttpClient(server.url)
        try:
            assert [await get(client) for _ in range(3)] == [
                (200, b'{"n": 0}'), (200, b'{"n": 1}'), (200, b'{"n": 2}')]
        finally:
            await client.close()
    assert server.connections == 1
    assert server.seen[0].headers["host"] == server.url.removeprefix("http://")


async def test_requests_in_flight_at_once_each_get_a_connection_then_reuse_them():
    def answer(request: Seen, index: int) -> Iterator[Piece]:
        name = request.target.partition("?")[0].rpartition("/")[2]
        body = json.dumps({"kind": "ResourceClaim", "metadata": {"name": name}}).encode()
        # The first 16 are answered only once all 16 have arrived: requests sent one after
        # the other would never get there (and fail on their 5 s timeout).
        while index < 16 and len(server.seen) < 16:
            yield 0.005
        yield from ok(body)

    async with scripted(answer) as server, ApiSession.for_url(server.url) as session:
        api = RawApi(session, timeout=5)
        got = await asyncio.gather(*(api.get(RESOURCE_CLAIMS, f"c{i}", namespace="default")
                                     for i in range(16)))
        assert [g["metadata"]["name"] for g in got] == [f"c{i}" for i in range(16)]
        client = session._client
        assert client is not None and len(client._idle) == 16 and not client._busy
        await api.get(RESOURCE_CLAIMS, "c0", namespace="default")
        assert len(client._idle) == 16  # reused one, opened none
    assert server.connections == 16


async def test_query_strings_are_encoded(fake_api: FakeApiServer):
    selector = "spec.nodeName=node a&b=c/ü+%"
    async with ApiSession.for_url(fake_api.url) as session:
        await RawApi(session, timeout=5).list(RESOURCE_SLICES, field_selector=selector)
    assert fake_api.requests[-1].query["fieldSelector"] == selector


# --- dropped and stale connections -----------------------------------------------------------

async def test_a_pooled_connection_dropped_by_the_server_is_resent_once(
        fake_api: FakeApiServer):
    """A drop on a connection that served a request before is what a keep-alive connection
    the server closed while idle looks like: GET resends once, on a new connection."""
    async with ApiSession.for_url(fake_api.url) as session:
        api = RawApi(session, timeout=5)
        await api.list(NODES)  # a connection in the pool
        fake_api.drop_next(1, verb="get")
        fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
        assert (await api.get(NODES, "node-a"))["metadata"]["name"] == "node-a"
        fake_api.drop_next(2, verb="get")  # the resend fails too: the caller sees it
        with pytest.raises(Unreachable) as caught:
            await api.get(NODES, "node-a")
        assert caught.value.reason == "ServerDisconnected"
    assert fake_api.calls["get", "nodes"] == 4


async def test_a_drop_on_a_fresh_connection_is_final_on_a_pooled_one_resent_once():
    async with scripted(lambda r, i: None if i in (0, 2) else ok()) as server:
        client = HttpClient(server.url)
        try:
            with pytest.raises(ServerDisconnected):
                await get(client)  # request 0, on a new connection: the server saw it
            assert await get(client) == (200, b"{}")  # 1, on a new connection again
            assert await get(client) == (200, b"{}")  # 2 on the pooled one, dropped: 3
        finally:
            await client.close()
    assert [s.connection for s in server.seen] == [0, 1, 1, 2]


async def test_a_stale_connection_is_not_resent_for_a_post():
    async with scripted(lambda r, i: ok() if i == 0 else None) as server:
        client = HttpClient(server.url)
        try:
            await get(client)
            with pytest.raises(ServerDisconnected):
                await client.request("POST", "/x", body=b"{}", connect_timeout=2)
        finally:
            await client.close()
    assert [s.method for s in server.seen] == ["GET", "POST"]


async def test_a_connection_the_server_closed_while_idle_is_not_used():
    async with scripted(lambda r, i: [*ok(), CLOSE]) as server:
        client = HttpClient(server.url)
        try:
            assert await get(client) == (200, b"{}")
            await asyncio.sleep(0.05)  # the server's FIN arrives while the connection idles
            # A POST is never resent: it only succeeds if the closed connection is skipped.
            response = await client.request("POST", "/x", body=b"{}", connect_timeout=2)
            assert (response.status, await response.read()) == (200, b"{}")
            response.release()
        finally:
            await client.close()
    assert [s.connection for s in server.seen] == [0, 1]


# --- framing, encodings, statuses ------------------------------------------------------------

async def test_a_chunked_stream_reads_line_by_line_and_leaves_a_reusable_connection():
    events = [json.dumps({"type": "ADDED", "object": {"n": i}}).encode() + b"\n"
              for i in range(3)]
    # Chunks that split lines anywhere: half an event, one and a half, the rest.
    stream = b"".join(events)
    pieces = [stream[:10], stream[10:70], stream[70:]]
    async with scripted(lambda r, i: chunked(*pieces, pause=0.01) if i == 0 else ok()) as server:
        client = HttpClient(server.url)
        try:
            response = await client.request("GET", "/w", connect_timeout=2, read_timeout=2)
            lines = []
            while line := await response.readline():
                lines.append(line)
            assert lines == events and response.at_eof
            response.release()
            assert await get(client) == (200, b"{}")
        finally:
            await client.close()
    assert server.connections == 1


async def test_a_watch_through_the_raw_api_ends_cleanly_at_the_stream_end():
    events = [b'{"type": "ADDED", "object": {"kind": "ResourceSlice"}}\n',
              b"\n", b'{"type": "BOOKMARK", "object": {}}\n']
    async with (scripted(lambda r, i: chunked(*events)) as server,
                ApiSession.for_url(server.url) as session):
        api = RawApi(session, timeout=2)
        async with await api.watch(RESOURCE_SLICES, field_selector="spec.nodeName=n",
                                   resource_version="5", timeout_seconds=30) as stream:
            assert (await stream.next() or {})["type"] == "ADDED"
            assert (await stream.next() or {})["type"] == "BOOKMARK"
            assert await stream.next() is None
    target = server.seen[0].target
    assert target.startswith("/apis/resource.k8s.io/v1/resourceslices?watch=true&")
    assert "fieldSelector=spec.nodeName%3Dn" in target and "resourceVersion=5" in target


async def test_a_body_that_ends_with_the_connection_and_a_gzip_body():
    packed = gzip.compress(b'{"kind": "NodeList"}')
    answers: list[list[Piece]] = [
        [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b'{"a":', 0.01, b" 1}"],
        ok(packed, "Content-Encoding: gzip"),
        chunked(packed[:5], packed[5:], head=b"Content-Encoding: gzip\r\n"),
        [b"HTTP/1.1 204 No Content\r\n\r\n"],
        [b"HTTP/1.1 100 Continue\r\n\r\n", *ok(b"{}")],
    ]
    async with scripted(lambda r, i: answers[i]) as server:
        client = HttpClient(server.url)
        try:
            assert await get(client) == (200, b'{"a": 1}')
            assert await get(client) == (200, b'{"kind": "NodeList"}')
            assert await get(client) == (200, b'{"kind": "NodeList"}')
            assert await get(client) == (204, b"")
            assert await get(client) == (200, b"{}")
        finally:
            await client.close()
    assert server.seen[0].headers["accept-encoding"] == "gzip"
    assert server.connections == 2  # the first answer ended its connection


@pytest.mark.parametrize(("answer", "error"), [
    (b"SSH-2.0-OpenSSH\r\n\r\n", BadResponse),
    (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", BadResponse),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", BadResponse),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n{}", ServerDisconnected),
], ids=["not-http", "bad-length", "bad-chunk", "short-body"])
async def test_broken_answers_are_errors_and_unreachable_through_the_raw_api(answer, error):
    async with scripted(lambda r, i: [answer, CLOSE]) as server:
        client = HttpClient(server.url)
        try:
            with pytest.raises(error):
                await get(client)
        finally:
            await client.close()
        async with ApiSession.for_url(server.url) as session:
            with pytest.raises(Unreachable) as caught:
                await RawApi(session, timeout=2).get(NODES, "node-a")
        assert caught.value.reason == error.__name__


async def test_requests_carry_their_body_and_headers():
    async with scripted(lambda r, i: ok()) as server:
        client = HttpClient(server.url + "/prefix/")
        try:
            response = await client.request(
                "PATCH", "/apis/x", query=[("fieldManager", "gpu.nvidia.com")],
                headers={"Content-Type": "application/apply-patch+yaml"}, body=b'{"a": 1}',
                connect_timeout=2)
            response.release()
            await (await client.request("DELETE", "/d", connect_timeout=2)).read()
        finally:
            await client.close()
    patch, delete = server.seen
    assert (patch.method, patch.target, patch.body) == (
        "PATCH", "/prefix/apis/x?fieldManager=gpu.nvidia.com", b'{"a": 1}')
    assert patch.headers["content-type"] == "application/apply-patch+yaml"
    assert "content-length" not in delete.headers


async def test_a_body_larger_than_the_socket_buffers_goes_out_whole_before_the_answer():
    # write() cannot send it at once: the request waits for the rest to drain.
    body = bytes(range(256)) * (32 * 1024)  # 8 MiB
    async with scripted(lambda r, i: ok(b'{"n": %d}' % len(r.body))) as server:
        client = HttpClient(server.url)
        try:
            response = await client.request("PUT", "/big", body=body, connect_timeout=2,
                                            read_timeout=10)
            assert await response.read() == b'{"n": %d}' % len(body)
            response.release()
            assert await get(client) == (200, b'{"n": 0}')  # the same connection, reused
        finally:
            await client.close()
    assert server.seen[0].body == body and server.connections == 1


async def test_a_header_value_cannot_smuggle_a_header_line():
    client = HttpClient("http://127.0.0.1:1")
    with pytest.raises(HttpError, match="the Authorization header has a line break"):
        await client.request("GET", "/", headers={"Authorization": "Bearer t\r\nX: y"},
                             connect_timeout=1)
    with pytest.raises(HttpError, match="the Authorization header has a character that is"):
        await client.request("GET", "/", headers={"Authorization": "Bearer t\u2019"},
                             connect_timeout=1)
    with pytest.raises(HttpError, match="'ftp://x' is not an http or https URL"):
        HttpClient("ftp://x")


async def test_idle_connections_are_kept_to_a_limit_and_closed_after_a_while(monkeypatch):
    monkeypatch.setattr(http_client, "MAX_IDLE", 2)
    monkeypatch.setattr(http_client, "IDLE_TIMEOUT", 0.3)
    async with scripted(lambda r, i: [0.1, *ok()]) as server:
        client = HttpClient(server.url)
        try:
            assert await asyncio.gather(*(get(client) for _ in range(4))) == [(200, b"{}")] * 4
            assert len(client._idle) == 2  # the two beyond the limit were closed at once
            await eventually(lambda: not client._idle and server.closed_by_client == 4)
        finally:
            await client.close()
    assert server.connections == 4


# --- timeouts and closing --------------------------------------------------------------------

async def test_a_tls_handshake_that_never_comes_is_cut_off_by_the_connect_timeout():
    async with scripted(lambda r, i: None) as server:  # speaks no TLS: never answers hello
        client = HttpClient(server.url.replace("http:", "https:"))
        # Without the connect timeout this would wait for ever; the test's guard is 10 s and
        # tells itself apart from the client's own TimeoutError.
        call = asyncio.ensure_future(client.request("GET", "/", connect_timeout=0.3))
        try:
            done, _ = await asyncio.wait({call}, timeout=10)
            assert call in done, "the connect timeout never cut the handshake off"
            assert isinstance(call.exception(), TimeoutError)
        finally:
            call.cancel()
            await client.close()


async def test_a_quiet_watch_ends_at_its_read_deadline_not_before():
    async with (scripted(lambda r, i: [*chunked(b'{"type": "ADDED", "object": {}}\n')[:2],
                                       0.6, b"0\r\n\r\n"]) as server,
                ApiSession.for_url(server.url) as session):
        api = RawApi(session, timeout=0.4)  # the read deadline: 0 + 0.4 s
        stream = await api.watch(RESOURCE_SLICES, field_selector="", resource_version="",
                                 timeout_seconds=0)
        async with stream:
            assert (await stream.next() or {})["type"] == "ADDED"
            started = time.monotonic()
            with pytest.raises(Unreachable) as caught:
                await stream.next()
            # Not before its deadline (a lower bound cannot flake); that it ended there, not
            # at the server's end 0.6 s in, is what the reason says.
            assert time.monotonic() - started > 0.3
        assert caught.value.reason == "Timeout" and caught.value.message == "watch went quiet"


async def test_closing_the_client_closes_every_connection_idle_or_streaming():
    async with scripted(lambda r, i: ok() if i < 2 else chunked(b"{}\n", pause=30.0)) as server:
        client = HttpClient(server.url)
        first, second = await asyncio.gather(*(client.request("GET", "/", connect_timeout=2)
                                               for _ in range(2)))
        await first.read()
        first.release()
        await second.read()
        second.release()
        watch = await client.request("GET", "/w", connect_timeout=2)
        assert await watch.readline() == b"{}\n"
        assert len(client._idle) == 1 and len(client._busy) == 1
        await client.close()
        assert not client._idle and not client._busy
        await asyncio.sleep(0.05)
        with pytest.raises(Exception, match="closed"):
            await client.request("GET", "/", connect_timeout=2)
    assert server.connections == 2
    assert server.closed_by_client == 2
