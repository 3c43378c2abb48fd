"""What a session needs to reach the API server: its URL, the TLS context (CA, client
certificate, verification), the name to check its certificate against, the proxy, and
where the ``Authorization`` header comes from. Built, and every file read, before anything
is served (:func:`in_cluster` here; :func:`gpudra.kube.kubeconfig.resolve` for both ways).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpudra.kube.credentials import Credentials, TokenFile
from gpudra.kube.proxy import proxy_from_environment

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeconfigError(Exception):
    """No usable cluster configuration; the message names the file, context or field."""


@dataclass(frozen=True)
class Connection:
    """How to reach and authenticate to one API server."""

    server: str
    tls: ssl.SSLContext | None = None
    """None: the system's CAs (https) or plain http."""
    tls_server_name: str | None = None
    """The name the server's certificate is checked against, if not the URL's host."""
    proxy: str | None = None
    """An HTTP proxy URL, or None to connect directly."""
    credentials: Credentials | None = None
    """None: anonymous."""


def in_cluster(environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT,
               ) -> Connection:
    """The pod's service account: the service's address, its CA, the projected token
    (re-read as it rotates), and the environment's proxy as client-go reads it."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    for name, value in (("KUBERNETES_SERVICE_HOST", host), ("KUBERNETES_SERVICE_PORT", port)):
        if not value:
            raise KubeconfigError(f"not running in a cluster ({name} is not set)")
    assert host is not None
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    token = service_account / "token"
    try:
        if not token.read_text().strip():
            raise KubeconfigError(f"not running in a cluster (service account {token}: empty)")
    except OSError as exc:
        raise KubeconfigError(f"not running in a cluster (service account {token}: "
                              f"{exc.strerror or exc})") from exc
    ca = service_account / "ca.crt"
    try:
        context = ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise KubeconfigError(f"not running in a cluster (service account {ca}: "
                              f"{reason})") from exc
    server = f"https://{host}:{port}"
    return Connection(server=server, tls=context,
                      proxy=proxy_from_environment(server, environ),
                      credentials=TokenFile(token))
