"""The proxy a request takes, as client-go's ProxyFromEnvironment picks it, and a plain-http
server reached through an HTTP proxy (whole URLs as request targets, the proxy's
credentials from its URL)."""

from __future__ import annotations

import base64

import pytest

from gpudra.kube.http_client import HttpClient, HttpError
from gpudra.kube.proxy import proxy_from_environment
from tests.kube.scripted_server import ok, scripted

PROXY = {"HTTPS_PROXY": "http://proxy:3128", "HTTP_PROXY": "http://plain:3128"}


@pytest.mark.parametrize(("server", "no_proxy", "expected"), [
    ("https://api.example.com:6443", "", "http://proxy:3128"),
    ("http://api.example.com", "", "http://plain:3128"),
    ("https://api.example.com:6443", "*", None),
    ("https://api.example.com:6443", "example.com", None),  # the domain and below
    ("https://example.com:6443", "example.com", None),
    ("https://example.com:6443", ".example.com", "http://proxy:3128"),  # only below
    ("https://api.example.com:6443", ".example.com", None),
    ("https://notexample.com:6443", "example.com", "http://proxy:3128"),
    ("https://api.example.com:6443", "api.example.com:443", "http://proxy:3128"),
    ("https://api.example.com:6443", "api.example.com:6443", None),
    ("https://10.1.2.3:6443", "10.0.0.0/8", None),
    ("https://10.1.2.3:6443", "10.1.2.3", None),
    ("https://11.1.2.3:6443", "10.0.0.0/8", "http://proxy:3128"),
    ("https://[fd00::1]:6443", "fd00::/64", None),
    ("https://[fd00::1]:6443", "[fd00::1]:6443", None),
    ("https://localhost:6443", "", None),  # never from the environment
    ("https://127.0.0.2:6443", "", None),
    ("https://[::1]:6443", "", None),
    ("https://API.Example.com:6443", " other.org , EXAMPLE.com ", None),
])
def test_no_proxy_as_client_go_reads_it(server, no_proxy, expected):
    assert proxy_from_environment(server, {**PROXY, "NO_PROXY": no_proxy}) == expected


def test_lower_case_names_and_a_proxy_without_a_scheme():
    assert proxy_from_environment("https://a.b:1", {"https_proxy": "p:8"}) == "http://p:8"
    assert proxy_from_environment("https://a.b:1", {"https_proxy": "http://p:8",
                                                   "no_proxy": "a.b"}) is None
    assert proxy_from_environment("https://a.b:1", {"HTTP_PROXY": "http://p:8"}) is None


async def test_a_plain_http_server_through_a_proxy_gets_whole_urls_and_its_credentials():
    async with scripted(lambda r, i: ok(b"{}")) as proxy:
        client = HttpClient("http://api.internal:8080/prefix",
                            proxy=proxy.url.replace("http://", "http://me:s%40cret@"))
        try:
            response = await client.request("GET", "/api/v1/nodes", connect_timeout=2)
            assert (response.status, await response.read()) == (200, b"{}")
            response.release()
        finally:
            await client.close()
    (seen,) = proxy.seen
    assert seen.target == "http://api.internal:8080/prefix/api/v1/nodes"
    assert seen.headers["host"] == "api.internal:8080"
    assert seen.headers["proxy-authorization"] == (
        "Basic " + base64.b64encode(b"me:s@cret").decode())


async def test_a_proxy_that_refuses_the_tunnel_is_an_error_naming_it():
    async with scripted(lambda r, i: [b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                                      b"Content-Length: 0\r\n\r\n"]) as proxy:
        client = HttpClient("https://api.internal:6443", proxy=proxy.url)
        try:
            with pytest.raises(HttpError, match=r"refused CONNECT api.internal:6443: 407 "):
                await client.request("GET", "/api", connect_timeout=2)
        finally:
            await client.close()
    assert [s.method for s in proxy.seen] == ["CONNECT"]


def test_only_http_proxies():
    with pytest.raises(HttpError, match="is not an http:// URL"):
        HttpClient("https://api:6443", proxy="socks5://p:1080")
