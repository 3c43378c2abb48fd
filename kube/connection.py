"""What a client needs to reach the API server, read and checked from a resolved kubeconfig
or the pod's service account, without a network call.

:func:`connection_settings` turns a :class:`~gpudra.kube.kubeconfig.ClusterAccess` into a
:class:`Connection`: the server URL, the CA and client certificate as PEM text, and where the
credentials come from (a static token, a token file re-read as it changes, an exec credential
plugin, or user name and password). Every file is read here, so a kubeconfig the session
could not use fails before anything is served. It is stricter than kubectl in one way: a
context naming a user that is not there is an error, not an anonymous connection that fails
every call later. Errors are :class:`KubeconfigError` naming the entry and the field.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudra.kube.kubeconfig import SERVICE_ACCOUNT, ClusterAccess, KubeconfigError


@dataclass(frozen=True)
class ExecPlugin:
    """A ``users[].user.exec`` credential plugin (client.authentication.k8s.io)."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"
    interactive: bool = False
    """``interactiveMode: Always``: the plugin needs a terminal, which a daemon has not."""
    cluster: Mapping[str, Any] | None = None
    """Passed to the plugin as ``spec.cluster`` when ``provideClusterInfo`` is set."""


@dataclass(frozen=True)
class Connection:
    """How to reach and authenticate to one API server."""

    server: str
    ca_pem: str | None = None
    """Trusted CA certificates (PEM); None: the system's."""
    client_cert_pem: str | None = None
    client_key_pem: str | None = None
    insecure: bool = False
    """``insecure-skip-tls-verify``: no server certificate check."""
    tls_server_name: str | None = None
    token: str | None = None
    token_file: Path | None = None
    """Re-read when it changes (a projected service-account token rotates)."""
    username: str | None = None
    password: str | None = None
    exec_plugin: ExecPlugin | None = field(default=None)


def connection_settings(access: ClusterAccess, *, environ: Mapping[str, str] | None = None,
                        service_account: Path = SERVICE_ACCOUNT) -> Connection:
    """The connection ``access`` describes; a problem is a one-line KubeconfigError."""
    if access.config is None:
        return in_cluster(os.environ if environ is None else environ, service_account)
    config = access.config
    context = (_named(config, "contexts", str(access.context)).get("context") or {})
    cluster_name = str(context.get("cluster"))
    cluster = _named(config, "clusters", cluster_name).get("cluster") or {}
    where = f"cluster {cluster_name!r}"
    if not isinstance(cluster, dict) or not cluster.get("server"):
        raise KubeconfigError(f"{where} has no server")
    settings: dict[str, Any] = {
        "server": str(cluster["server"]).rstrip("/"),
        "ca_pem": _pem(cluster, "certificate-authority", where),
        "insecure": bool(cluster.get("insecure-skip-tls-verify")),
        "tls_server_name": cluster.get("tls-server-name") or None,
    }
    user_name = context.get("user")
    if user_name:
        user = _named(config, "users", str(user_name)).get("user") or {}
        if isinstance(user, dict):
            settings.update(_user(user, f"user {user_name!r}", cluster))
    return Connection(**settings)


def in_cluster(environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT,
               ) -> Connection:
    """The pod's service account: the service's address, its CA and the projected token."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    for name, value in (("KUBERNETES_SERVICE_HOST", host), ("KUBERNETES_SERVICE_PORT", port)):
        if not value:
            raise KubeconfigError(f"not running in a cluster ({name} is not set)")
    assert host is not None
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    token = service_account / "token"
    problem = _unreadable(token, nonempty=True)
    if problem:
        raise KubeconfigError(f"not running in a cluster (service account {problem})")
    try:
        ca = (service_account / "ca.crt").read_text()
    except OSError as exc:
        raise KubeconfigError(f"not running in a cluster (service account "
                              f"{service_account / 'ca.crt'}: {exc.strerror or exc})") from exc
    if not ca.strip():
        raise KubeconfigError(f"not running in a cluster (service account "
                              f"{service_account / 'ca.crt'}: empty)")
    return Connection(server=f"https://{host}:{port}", ca_pem=ca, token_file=token)


def _user(user: Mapping[str, Any], where: str, cluster: Mapping[str, Any]) -> dict[str, Any]:
    if user.get("auth-provider"):
        provider = (user["auth-provider"] or {}).get("name", "?")
        raise KubeconfigError(f"{where}: auth-provider {provider!r} is not supported (it was "
                              "removed from kubectl; use an exec credential plugin)")
    out: dict[str, Any] = {
        "client_cert_pem": _pem(user, "client-certificate", where),
        "client_key_pem": _pem(user, "client-key", where),
        "token": user.get("token") or None,
        "username": user.get("username") or None,
        "password": user.get("password") or None,
    }
    if bool(out["client_cert_pem"]) != bool(out["client_key_pem"]):
        raise KubeconfigError(f"{where}: client-certificate and client-key go together")
    if not out["token"] and user.get("tokenFile"):
        path = Path(str(user["tokenFile"]))
        problem = _unreadable(path, nonempty=False)
        if problem:
            raise KubeconfigError(f"{where}: tokenFile {problem}")
        out["token_file"] = path
    if user.get("exec"):
        out["exec_plugin"] = _exec_plugin(user["exec"], f"{where}: exec", cluster)
    return out


def _exec_plugin(spec: Any, where: str, cluster: Mapping[str, Any]) -> ExecPlugin:
    if not isinstance(spec, dict) or not spec.get("command"):
        raise KubeconfigError(f"{where}: no command")
    version = str(spec.get("apiVersion") or "")
    if version not in ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"):
        raise KubeconfigError(f"{where}: apiVersion {version!r} is not supported (use "
                              "client.authentication.k8s.io/v1)")
    env = tuple((str(e.get("name")), str(e.get("value", ""))) for e in spec.get("env") or []
                if isinstance(e, dict))
    return ExecPlugin(command=str(spec["command"]),
                      args=tuple(str(a) for a in spec.get("args") or []), env=env,
                      api_version=version,
                      interactive=spec.get("interactiveMode") == "Always",
                      cluster=dict(cluster) if spec.get("provideClusterInfo") else None)


def _pem(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    """The PEM text of ``key``: its ``-data`` form (base64, preferred), else the file."""
    data = entry.get(f"{key}-data")
    if data:
        try:  # as leniently as client-go, which skips non-alphabet characters
            return base64.b64decode(str(data)).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise KubeconfigError(f"{where}: {key}-data is not base64 ({exc})") from exc
    if entry.get(key):
        path = Path(str(entry[key]))
        try:
            return path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not PEM text"
            raise KubeconfigError(f"{where}: {key} {path}: {reason or exc}") from exc
    return None


def _named(config: Mapping[str, Any], kind: str, name: str) -> dict[str, Any]:
    """The entry called ``name`` in the list ``kind`` (contexts, clusters, users)."""
    entries = config.get(kind)
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    singular = kind.removesuffix("s")
    known = ", ".join(str(e.get("name")) for e in entries or [] if isinstance(e, dict))
    raise KubeconfigError(f"{singular} {name!r} is not in {kind} (known: {known or 'none'})")


def _unreadable(path: Path, *, nonempty: bool) -> str | None:
    """Why ``path`` cannot be read as a file, or None."""
    try:
        with path.open("rb") as f:
            if nonempty and not f.read(1):
                return f"{path}: empty"
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None
