"""Which HTTP proxy a request to the API server goes through, as client-go decides.

A kubeconfig cluster's ``proxy-url`` is used for every request to it. Otherwise the
environment is read as Go's ``http.ProxyFromEnvironment`` reads it: ``HTTPS_PROXY`` (or
``https_proxy``) for an https server, ``HTTP_PROXY`` (or ``http_proxy``) for an http one,
unless ``NO_PROXY`` (or ``no_proxy``) names the host: ``*`` (every host), an IP address,
a CIDR range, a domain (``example.com`` is it and its subdomains, ``.example.com`` only its
subdomains), each optionally with ``:port``. ``localhost`` and loopback addresses are never
proxied from the environment.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit


def proxy_from_environment(server: str, environ: Mapping[str, str]) -> str | None:
    """The proxy URL for requests to ``server``, or None to connect directly."""
    parts = urlsplit(server)
    https = parts.scheme == "https"
    names = ("HTTPS_PROXY", "https_proxy") if https else ("HTTP_PROXY", "http_proxy")
    proxy = next((environ[n] for n in names if environ.get(n)), "")
    host = (parts.hostname or "").lower()
    if not proxy or not host or _loopback(host):
        return None
    port = parts.port or (443 if https else 80)
    no_proxy = environ.get("NO_PROXY") or environ.get("no_proxy") or ""
    if any(_matches(entry.strip().lower(), host, port) for entry in no_proxy.split(",")):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _matches(entry: str, host: str, port: int) -> bool:
    """Whether one ``NO_PROXY`` entry names ``host:port``."""
    if not entry:
        return False
    if entry == "*":
        return True
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False)
    except ValueError:
        pass  # not an address in a range: a name, an address, either with a port
    name, _, entry_port = entry.rpartition(":") if _has_port(entry) else (entry, "", "")
    if entry_port and entry_port != str(port):
        return False
    name = name.strip("[]")
    if name.startswith("."):
        return host.endswith(name)
    return host == name or host.endswith(f".{name}")


def _has_port(entry: str) -> bool:
    """``host:port`` or ``[v6]:port``, not a bare IPv6 address."""
    if entry.startswith("["):
        return "]:" in entry
    return entry.count(":") == 1
