"""The blocking HTTP/1.1 client, over real sockets to scripted servers on 127.0.0.1: the
edges the asyncio client's tests cover (keep-alive, stale connections, framing, gzip, bad
answers, closing), the whole-request timeout, https, and that both clients read the same
bytes the same way. The servers run on the test's event loop, so every request goes
through ``asyncio.to_thread``."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import ssl
import time
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from gpudra.kube import blocking_http
from gpudra.kube.blocking_http import Answer, BlockingHttpClient
from gpudra.kube.http_client import BadResponse, HttpClient, HttpError, ServerDisconnected
from tests.kube.certificates import make_certificate, server_tls
from tests.kube.scripted_server import CLOSE, Piece, chunked, eventually, ok, scripted


async def call(client: BlockingHttpClient, method: str = "GET", path: str = "/x",
               **options: Any) -> Answer:
    """``client.request`` in a worker thread, so that the server's loop keeps running."""
    options.setdefault("timeout", 2.0)
    return await asyncio.to_thread(client.request, method, path, **options)


async def get(client: BlockingHttpClient) -> tuple[int, bytes]:
    answer = await call(client)
    return answer.status, answer.body


# --- keep-alive and the pool -----------------------------------------------------------------

async def test_sequential_requests_share_one_connection():
    async with scripted(lambda r, i: ok(b'{"n": %d}' % i)) as server:
        with closing(BlockingHttpClient(server.url)) as client:
            assert [await get(client) for _ in range(3)] == [
                (200, b'{"n": 0}'), (200, b'{"n": 1}'), (200, b'{"n": 2}')]
    assert server.connections == 1
    headers = server.seen[0].headers
    assert headers["host"] == server.url.removeprefix("http://")
    assert (headers["user-agent"], headers["accept-encoding"]) == ("gpudra", "gzip")


async def test_requests_at_once_from_two_threads_get_two_connections_then_reuse_both():
    async with scripted(lambda r, i: [0.1, *ok()]) as server:  # slow: the two overlap
        with closing(BlockingHttpClient(server.url)) as client:
            for _ in range(2):
                assert await asyncio.gather(get(client), get(client)) == [(200, b"{}")] * 2
    assert server.connections == 2
    assert sorted(s.connection for s in server.seen) == [0, 0, 1, 1]


async def test_query_strings_are_encoded_under_the_base_urls_path():
    selector = "spec.nodeName=node a&b=c/ü+%"
    async with scripted(lambda r, i: ok()) as server:
        with closing(BlockingHttpClient(server.url + "/prefix/")) as client:
            await call(client, "GET", "/api/v1/nodes",
                       query=[("fieldSelector", selector), ("limit", "5")])
    target = urlsplit(server.seen[0].target)
    assert target.path == "/prefix/api/v1/nodes"
    assert parse_qsl(target.query) == [("fieldSelector", selector), ("limit", "5")]


async def test_requests_carry_their_body_and_headers():
    async with scripted(lambda r, i: ok()) as server:
        with closing(BlockingHttpClient(server.url + "/prefix/")) as client:
            await call(client, "PATCH", "/apis/x", query=[("fieldManager", "gpu.nvidia.com")],
                       headers={"Content-Type": "application/apply-patch+yaml"},
                       body=b'{"a": 1}')
            await call(client, "DELETE", "/d")
    patch, delete = server.seen
    assert (patch.method, patch.target, patch.body) == (
        "PATCH", "/prefix/apis/x?fieldManager=gpu.nvidia.com", b'{"a": 1}')
    assert patch.headers["content-type"] == "application/apply-patch+yaml"
    assert patch.headers["content-length"] == "8"
    assert (delete.method, delete.target) == ("DELETE", "/prefix/d")
    assert "content-length" not in delete.headers


async def test_a_body_larger_than_the_socket_buffers_goes_out_whole():
    body = bytes(range(256)) * (32 * 1024)  # 8 MiB
    async with scripted(lambda r, i: ok(b'{"n": %d}' % len(r.body))) as server:
        with closing(BlockingHttpClient(server.url)) as client:
            answer = await call(client, "PUT", "/big", body=body, timeout=10)
            assert answer.body == b'{"n": %d}' % len(body)
            assert await get(client) == (200, b'{"n": 0}')  # the same connection, reused
    assert server.seen[0].body == body and server.connections == 1


# --- dropped and stale connections -----------------------------------------------------------

async def test_a_drop_on_a_fresh_connection_is_final_on_a_pooled_one_resent_once():
    async with scripted(lambda r, i: None if i in (0, 2, 5, 6) else ok()) as server:
        with closing(BlockingHttpClient(server.url)) as client:
            with pytest.raises(ServerDisconnected):
                await get(client)  # request 0, on a new connection: the server saw it
            assert await get(client) == (200, b"{}")  # 1, on a new connection again
            assert await get(client) == (200, b"{}")  # 2 on the pooled one, dropped: 3
            assert await get(client) == (200, b"{}")  # 4, pooled
            with pytest.raises(ServerDisconnected):
                await get(client)  # 5 pooled, dropped; its resend 6 dropped too: no third
    assert [s.connection for s in server.seen] == [0, 1, 1, 2, 2, 2, 3]


async def test_a_stale_connection_is_not_resent_for_a_post():
    async with scripted(lambda r, i: ok() if i == 0 else None) as server:
        with closing(BlockingHttpClient(server.url)) as client:
            await get(client)
            with pytest.raises(ServerDisconnected):
                await call(client, "POST", "/x", body=b"{}")
    assert [s.method for s in server.seen] == ["GET", "POST"]


async def test_a_connection_the_server_closed_while_idle_is_not_used():
    async with scripted(lambda r, i: [*ok(), CLOSE]) as server:
        with closing(BlockingHttpClient(server.url)) as client:
            assert await get(client) == (200, b"{}")
            await asyncio.sleep(0.05)  # the server's FIN arrives while the connection idles
            # A POST is never resent: it only succeeds if the closed connection is skipped.
            answer = await call(client, "POST", "/x", body=b"{}")
            assert (answer.status, answer.body) == (200, b"{}")
    assert [s.connection for s in server.seen] == [0, 1]


# --- framing, encodings, statuses ------------------------------------------------------------

PACKED = gzip.compress(b'{"kind": "NodeList"}')

ANSWERS: dict[str, list[Piece]] = {
    "length": ok(b'{"a": 1}'),
    "chunked": chunked(b'{"a":', b" 1}"),  # with chunk extensions and a trailer
    "until-close": [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b'{"a":', 0.01, b" 1}"],
    "http-1.0": [b"HTTP/1.0 200 OK\r\n\r\n{}", CLOSE],
    "gzip": ok(PACKED, "Content-Encoding: gzip"),
    "gzip-chunked": chunked(PACKED[:5], PACKED[5:], head=b"Content-Encoding: gzip\r\n"),
    "no-content": [b"HTTP/1.1 204 No Content\r\n\r\n"],
    "continue": [b"HTTP/1.1 100 Continue\r\n\r\n", *ok(b"{}")],
    "not-found": [b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\n{}"],
}


async def test_bodies_framed_every_way_and_gzip():
    order = ["length", "chunked", "gzip", "gzip-chunked", "no-content", "continue",
             "until-close"]
    async with scripted(lambda r, i: ANSWERS[order[i]]) as server:
        with closing(BlockingHttpClient(server.url)) as client:
            assert [await get(client) for _ in order] == [
                (200, b'{"a": 1}'), (200, b'{"a": 1}'), (200, b'{"kind": "NodeList"}'),
                (200, b'{"kind": "NodeList"}'), (204, b""), (200, b"{}"), (200, b'{"a": 1}')]
            assert not client._idle  # the last answer ended its connection
    assert server.connections == 1  # every answer before it left the connection reusable


async def aio_request(url: str) -> tuple[int, str, dict[str, str], bytes]:
    client = HttpClient(url)
    try:
        async with await client.request("GET", "/x", connect_timeout=2) as response:
            return response.status, response.reason, response.headers, await response.read()
    finally:
        await client.close()


async def blocking_request(url: str) -> tuple[int, str, dict[str, str], bytes]:
    with closing(BlockingHttpClient(url)) as client:
        answer = await call(client)
    return answer.status, answer.reason, dict(answer.headers), answer.body


@pytest.mark.parametrize("name", ANSWERS)
async def test_both_clients_read_the_same_bytes_the_same_way(name: str):
    """Status, reason, header fields, body, and whether the connection is kept."""
    got = []
    for blocking in (False, True):
        async with scripted(lambda r, i: ANSWERS[name]) as server:
            seen = [await (blocking_request if blocking else aio_request)(server.url)
                    for _ in range(2)]
        got.append((seen, server.connections))
    assert got[0] == got[1]


@pytest.mark.parametrize(("answer", "error"), [
    (b"SSH-2.0-OpenSSH\r\n\r\n", BadResponse),
    (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", BadResponse),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", BadResponse),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n{}", ServerDisconnected),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX", BadResponse),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n{}", ServerDisconnected),
    (b"HTTP/1.1 200 OK\r\nContent-Le", ServerDisconnected),
    (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70000, BadResponse),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 0\r\n\r\n", BadResponse),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd",
     BadResponse),
], ids=["not-http", "bad-length", "bad-chunk", "short-body", "chunk-without-crlf",
        "short-chunk", "mid-head", "long-line", "unasked-encoding", "corrupt-gzip"])
async def test_broken_answers_are_the_same_errors_from_both_clients(answer, error):
    async with scripted(lambda r, i: [answer, CLOSE]) as server:
        with pytest.raises(error):
            await aio_request(server.url)
        with pytest.raises(error):
            await blocking_request(server.url)


def test_a_header_value_cannot_smuggle_a_header_line():
    with closing(BlockingHttpClient("http://127.0.0.1:1")) as client:
        with pytest.raises(HttpError, match="the Authorization header has a line break"):
            client.request("GET", "/", headers={"Authorization": "Bearer t\r\nX: y"},
                           timeout=1)
        with pytest.raises(HttpError, match="the Authorization header has a character that"):
            client.request("GET", "/", headers={"Authorization": "Bearer t\u2019"}, timeout=1)
    with pytest.raises(HttpError, match="'ftp://x' is not an http or https URL"):
        BlockingHttpClient("ftp://x")


# --- idle connections ------------------------------------------------------------------------

async def test_idle_connections_beyond_max_idle_are_closed_at_once(monkeypatch):
    monkeypatch.setattr(blocking_http, "MAX_IDLE", 2)
    async with scripted(lambda r, i: [0.1, *ok()]) as server:  # slow: the four overlap
        with closing(BlockingHttpClient(server.url)) as client:
            assert await asyncio.gather(*(get(client) for _ in range(4))) == [(200, b"{}")] * 4
            assert len(client._idle) == 2
            await eventually(lambda: server.closed_by_client == 2)
            assert await asyncio.gather(get(client), get(client)) == [(200, b"{}")] * 2
    assert server.connections == 4  # the last two went on the two kept


async def test_a_connection_idle_longer_than_idle_timeout_is_closed_not_used(monkeypatch):
    monkeypatch.setattr(blocking_http, "IDLE_TIMEOUT", 0.2)
    async with scripted(lambda r, i: ok()) as server:
        with closing(BlockingHttpClient(server.url)) as client:
            await get(client)
            await get(client)  # idle for less than the limit: reused
            await asyncio.sleep(0.3)
            assert server.closed_by_client == 0  # nothing closes it until the next request
            await get(client)
            await eventually(lambda: server.closed_by_client == 1)
    assert [s.connection for s in server.seen] == [0, 0, 1]


async def test_idle_connections_past_idle_timeout_are_all_closed_at_the_next_request(
        monkeypatch):
    # Only the newest idle connection is ever taken; the older ones must not linger.
    monkeypatch.setattr(blocking_http, "IDLE_TIMEOUT", 0.2)
    async with scripted(lambda r, i: [0.1, *ok()]) as server:  # slow: the three overlap
        with closing(BlockingHttpClient(server.url)) as client:
            assert await asyncio.gather(*(get(client) for _ in range(3))) == [(200, b"{}")] * 3
            await asyncio.sleep(0.3)
            assert await get(client) == (200, b"{}")
            await eventually(lambda: server.closed_by_client == 3)
            assert len(client._idle) == 1
    assert server.connections == 4


async def test_bytes_beyond_an_answer_never_reach_the_next_request():
    extra = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{\"n\": 99}"
    answers = [[ok()[0] + extra], ok(b'{"n": 1}')]  # type: ignore[operator]
    async with scripted(lambda r, i: answers[i]) as server:
        with closing(BlockingHttpClient(server.url)) as client:
            assert await get(client) == (200, b"{}")
            assert await get(client) == (200, b'{"n": 1}')
    assert server.connections == 2


# --- timeouts and closing --------------------------------------------------------------------

async def test_the_timeout_bounds_connecting_to_every_address_of_the_name_together(
        monkeypatch):
    # A listener whose backlog is full drops new SYNs: connect() hangs, as to a host gone.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    queued = [socket.socket() for _ in range(3)]
    for sock in queued:
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(address)
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, *a, **k: (
        real("127.0.0.1", port, *a, **k) * 3 if host == "api.example" else real(host, port,
                                                                                   *a, **k)))
    try:
        with closing(BlockingHttpClient(f"http://api.example:{address[1]}")) as client:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await call(client, timeout=0.6)
            assert time.monotonic() - started < 0.6 * 2  # not 0.6 per address
    finally:
        for sock in [*queued, listener]:
            sock.close()


async def test_a_refused_connection_names_the_server():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, not listening: refused
        with (closing(BlockingHttpClient(f"http://127.0.0.1:{port}")) as client,
              pytest.raises(OSError, match=f"cannot connect to 127.0.0.1:{port}: Connection "
                                           "refused")):
            await call(client)


@pytest.mark.parametrize("rest", [
    [b"{", 5.0, b"}"],
    [piece for _ in range(20) for piece in (0.1, b"x")],  # each byte in time, not the whole
], ids=["stall", "trickle"])
async def test_one_timeout_bounds_the_whole_request_and_its_connection_is_dropped(
        rest: list[Piece]):
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % sum(
        len(p) for p in rest if isinstance(p, bytes))
    async with scripted(lambda r, i: [head, *rest] if i == 0 else ok()) as server:
        with closing(BlockingHttpClient(server.url)) as client:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await call(client, timeout=0.5)
            assert 0.4 < time.monotonic() - started < 0.5 + 1.5
            assert await get(client) == (200, b"{}")
    assert [s.connection for s in server.seen] == [0, 1]


async def test_a_tls_handshake_that_never_comes_ends_within_the_timeout():
    async with scripted(lambda r, i: None) as server:  # speaks no TLS: never answers hello
        with closing(BlockingHttpClient(server.url.replace("http:", "https:"))) as client:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await call(client, timeout=0.3)
            assert time.monotonic() - started < 0.3 + 1.5


@pytest.mark.parametrize("stall", [
    [30.0, *ok()],
    [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", 30.0, b"{}"],
], ids=["before-the-answer", "mid-body"])
async def test_close_hangs_up_idle_connections_and_cuts_short_a_request_in_flight(
        stall: list[Piece]):
    async with scripted(lambda r, i: [0.1, *ok()] if i < 2 else stall) as server:
        client = BlockingHttpClient(server.url)
        assert await asyncio.gather(get(client), get(client)) == [(200, b"{}")] * 2
        stalled = asyncio.ensure_future(call(client, timeout=30))  # on a pooled connection
        await eventually(lambda: len(server.seen) == 3)
        started = time.monotonic()
        client.close()
        with pytest.raises((HttpError, OSError)):
            await stalled
        assert time.monotonic() - started < 1.0
        await eventually(lambda: server.closed_by_client == 2)  # the idle one and that one
        with pytest.raises(HttpError, match="the client is closed"):
            await get(client)
    assert server.connections == 2  # the request cut short did not try a new one


# --- https -----------------------------------------------------------------------------------

async def test_close_cuts_short_a_tls_request_with_its_own_error(api_internal):
    # Over TLS, what the socket still holds is encrypted: it must never be read as HTTP.
    server_side, client_side = api_internal
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    stream = [head, *[p for _ in range(50) for p in (b"2\r\n{}\r\n", 0.002)], 30.0]
    for _ in range(5):
        async with scripted(lambda r, i: stream, tls=server_side) as server:
            client = BlockingHttpClient(server.url, ssl_context=client_side,
                                        server_hostname="api.internal")
            stalled = asyncio.ensure_future(call(client, timeout=30))
            await eventually(lambda: len(server.seen) == 1)
            await asyncio.sleep(0.05)
            client.close()
            with pytest.raises(HttpError, match="the client is closed"):
                await stalled


@pytest.fixture
def api_internal(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(the server's context, a client context trusting it) for a certificate that names
    api.internal, not the 127.0.0.1 dialled."""
    cert, key = make_certificate(tmp_path, "api.internal", "DNS:api.internal")
    return server_tls(cert, key), ssl.create_default_context(cafile=cert)


async def test_https_through_the_given_context_reuses_its_connection(api_internal):
    server_side, client_side = api_internal
    async with scripted(lambda r, i: ok(b'{"n": %d}' % i), tls=server_side) as server:
        with closing(BlockingHttpClient(server.url, ssl_context=client_side,
                                        server_hostname="api.internal")) as client:
            assert await get(client) == (200, b'{"n": 0}')
            await asyncio.sleep(0.05)  # session tickets arrive while it idles: still usable
            assert await get(client) == (200, b'{"n": 1}')
        assert server.connections == 1
        # Checked against the name dialled, the certificate does not fit.
        with (closing(BlockingHttpClient(server.url, ssl_context=client_side)) as client,
              pytest.raises(ssl.SSLCertVerificationError)):
            await get(client)


async def test_a_tls_connection_the_server_closed_while_idle_is_not_used(api_internal):
    server_side, client_side = api_internal
    async with scripted(lambda r, i: [*ok(), CLOSE], tls=server_side) as server:
        with closing(BlockingHttpClient(server.url, ssl_context=client_side,
                                        server_hostname="api.internal")) as client:
            assert await get(client) == (200, b"{}")
            await asyncio.sleep(0.05)  # close_notify and FIN arrive while it idles
            answer = await call(client, "POST", "/x", body=b"{}")
            assert (answer.status, answer.body) == (200, b"{}")
    assert [s.connection for s in server.seen] == [0, 1]
