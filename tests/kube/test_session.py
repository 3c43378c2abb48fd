"""Our own API session with what the one loader gives it: credentials from a kubeconfig
(token, token file re-read as it rotates, exec plugin run again when its credential expires,
basic auth), in-cluster settings, TLS, and the errors that name the field; over real
HTTP(S) to a small server that records what it was sent."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudra.kube import credentials
from gpudra.kube.connection import Connection, in_cluster
from gpudra.kube.credentials import TokenFile
from gpudra.kube.kubeconfig import KubeconfigError, resolve
from gpudra.kube.raw_api import NODES, RawApi
from gpudra.kube.session import ApiSession
from tests.kube.certificates import b64, make_certificate, server_tls

NODE_LIST = b'{"kind": "NodeList", "apiVersion": "v1", "items": []}'
UNAUTHORIZED = (b'{"kind": "Status", "apiVersion": "v1", "status": "Failure", '
                b'"message": "Unauthorized", "reason": "Unauthorized", "code": 401}')


@contextlib.asynccontextmanager
async def recording_server(tls: ssl.SSLContext | None = None, *, unauthorized: int = 0,
                           refused: Container[int] = (),
                           ) -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP(S) server answering every request with an empty NodeList (the first
    ``unauthorized``, and the ``refused`` ones counting from 1, with 401); yields its URL
    and the headers of each request it got (lower-case names)."""
    seen: list[dict[str, str]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")[1:]
            seen.append({k.strip().lower(): v.strip()
                         for k, _, v in (line.partition(":") for line in lines if line)})
            status, body = ((b"401 Unauthorized", UNAUTHORIZED)
                            if len(seen) <= unauthorized or len(seen) in refused
                            else (b"200 OK", NODE_LIST))
            writer.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                         % (status, len(body), body))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", seen
    finally:
        server.close()
        await server.wait_closed()


def write_kubeconfig(path: Path, server: str, user: dict[str, Any],
                     cluster: dict[str, Any] | None = None) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def settings(path: Path) -> Connection:
    return resolve(path, environ={}, home=path.parent).connection


async def list_nodes(connection: Connection) -> None:
    async with ApiSession(connection) as session:
        assert (await RawApi(session, timeout=5).list(NODES))["kind"] == "NodeList"


async def test_a_static_token_is_sent_as_bearer(tmp_path):
    async with recording_server() as (url, seen):
        await list_nodes(settings(write_kubeconfig(tmp_path / "cfg", url, {"token": "abc"})))
    assert seen[0]["authorization"] == "Bearer abc"


async def test_a_token_file_is_read_again_when_it_changes(tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    async with recording_server() as (url, seen):
        connection = settings(write_kubeconfig(tmp_path / "cfg", url,
                                               {"tokenFile": "token"}))
        assert isinstance(connection.credentials, TokenFile)
        assert connection.credentials.path == token  # relative to the kubeconfig
        async with ApiSession(connection) as session:
            api = RawApi(session, timeout=5)
            await api.list(NODES)
            token.write_text("rotated\n")
            stamp = token.stat().st_mtime_ns + 1_000_000_000  # a coarse clock cannot hide it
            os.utime(token, ns=(stamp, stamp))
            await api.list(NODES)
    assert [h["authorization"] for h in seen] == ["Bearer first", "Bearer rotated"]


async def test_user_name_and_password_are_basic_auth(tmp_path):
    async with recording_server() as (url, seen):
        await list_nodes(settings(write_kubeconfig(
            tmp_path / "cfg", url, {"username": "admin", "password": "s3cret"})))
    assert seen[0]["authorization"] == "Basic " + base64.b64encode(b"admin:s3cret").decode()


def exec_plugin(tmp_path: Path, status: dict[str, Any], *, exit_code: int = 0) -> dict[str, Any]:
    """An exec credential plugin (a Python script) that counts its runs in ``runs``; a
    ``token`` with ``{run}`` in it names the run (1, 2, ...)."""
    script = tmp_path / "plugin.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        with open({str(tmp_path / 'runs')!r}, "a") as f:
            f.write(os.environ["KUBERNETES_EXEC_INFO"] + "\\n")
        with open({str(tmp_path / 'runs')!r}) as f:
            run = len(f.read().splitlines())
        status = {status!r}
        if "token" in status:
            status["token"] = status["token"].replace("{{run}}", str(run))
        print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1",
                           "kind": "ExecCredential", "status": status}}))
        sys.stderr.write("plugin says no\\n")
        sys.exit({exit_code})
    """))
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                     "args": [str(script)], "env": [{"name": "X", "value": "1"}],
                     "provideClusterInfo": True, "interactiveMode": "Never"}}


async def test_an_exec_plugin_gives_the_token_and_runs_again_when_it_expires(
        tmp_path, monkeypatch):
    monkeypatch.setattr(credentials, "RECHECK", 0.0)  # ask the loader before every request
    user = exec_plugin(tmp_path, {"token": "from-exec",
                                  "expirationTimestamp": "2000-01-01T00:00:00Z"})
    async with recording_server() as (url, seen):
        connection = settings(write_kubeconfig(tmp_path / "cfg", url, user))
        async with ApiSession(connection) as session:
            api = RawApi(session, timeout=5)
            await api.list(NODES)
            await api.list(NODES)
    assert [h["authorization"] for h in seen] == ["Bearer from-exec"] * 2
    runs = (tmp_path / "runs").read_text().splitlines()
    assert len(runs) == 3  # at load, then, long expired, again before each request
    request = json.loads(runs[0])
    assert request["kind"] == "ExecCredential"
    assert request["spec"]["cluster"]["server"] == url


async def test_an_unexpired_exec_credential_is_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(credentials, "RECHECK", 0.0)
    user = exec_plugin(tmp_path, {"token": "t"})
    async with recording_server() as (url, _):
        connection = settings(write_kubeconfig(tmp_path / "cfg", url, user))
        async with ApiSession(connection) as session:
            api = RawApi(session, timeout=5)
            await api.list(NODES)
            await api.list(NODES)
    assert len((tmp_path / "runs").read_text().splitlines()) == 1


def test_a_failing_exec_plugin_is_one_line_naming_it(tmp_path):
    user = exec_plugin(tmp_path, {"token": "t"}, exit_code=3)
    with pytest.raises(KubeconfigError) as caught:
        settings(write_kubeconfig(tmp_path / "cfg", "http://127.0.0.1:1", user))
    assert str(caught.value) == (f"user 'u': exec plugin {sys.executable!r}: exec: process "
                                 "returned 3. plugin says no")


@pytest.mark.parametrize(("user", "message"), [
    ({"auth-provider": {"name": "gcp"}}, "user 'u': auth-provider 'gcp' is not supported"),
    ({"exec": {"apiVersion": "client.authentication.k8s.io/v1"}}, "user 'u': exec: no command"),
    ({"client-certificate-data": base64.b64encode(b"x").decode()},
     "user 'u': client-certificate and client-key go together"),
    ({"tokenFile": "missing"}, "user 'u': tokenFile {dir}/missing: No such file or directory"),
], ids=["auth-provider", "exec-command", "cert-without-key", "token-file"])
def test_unusable_users_are_named(tmp_path, user, message):
    path = write_kubeconfig(tmp_path / "cfg", "https://127.0.0.1:6443", user)
    with pytest.raises(KubeconfigError) as error:
        settings(path)
    assert str(error.value).startswith(message.format(dir=tmp_path))


def test_a_user_the_context_names_must_exist(tmp_path):
    path = write_kubeconfig(tmp_path / "cfg", "https://127.0.0.1:6443", {})
    document = yaml.safe_load(path.read_text())
    document["users"] = []
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(KubeconfigError, match=r"^user 'u' is not in users \(known: none\)$"):
        settings(path)


def test_in_cluster_settings_come_from_the_environment_and_the_service_account(tmp_path):
    (tmp_path / "token").write_text("pod-token")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeconfigError, match=r"service account .*/ca.crt: "):
        in_cluster(env, tmp_path)  # not a certificate
    make_certificate(tmp_path, "ca", "DNS:kubernetes")[0].rename(tmp_path / "ca.crt")
    connection = in_cluster(env, tmp_path)
    assert connection.server == "https://[fd00::1]:443"
    assert isinstance(connection.credentials, TokenFile)
    assert connection.credentials.path == tmp_path / "token"
    assert connection.tls is not None and connection.proxy is None
    proxied = in_cluster({**env, "HTTPS_PROXY": "proxy:3128"}, tmp_path)
    assert proxied.proxy == "http://proxy:3128"
    assert in_cluster({**env, "HTTPS_PROXY": "proxy:3128", "NO_PROXY": "fd00::/64"},
                      tmp_path).proxy is None
    (tmp_path / "token").write_text("")
    with pytest.raises(KubeconfigError, match=r"service account .*/token: empty\)$"):
        in_cluster(env, tmp_path)
    with pytest.raises(KubeconfigError, match=r"\(KUBERNETES_SERVICE_PORT is not set\)$"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, tmp_path)


# --- TLS (a self-signed certificate made with the openssl command, when there is one) -----

@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def test_the_server_is_checked_against_the_kubeconfig_ca(tmp_path, certificate):
    cert, key = certificate
    async with recording_server(server_tls(cert, key)) as (url, seen):
        ca_data = base64.b64encode(cert.read_bytes()).decode()
        await list_nodes(settings(write_kubeconfig(
            tmp_path / "cfg", url, {"token": "t"}, {"certificate-authority-data": ca_data})))
        # A client certificate from inline data loads (the server does not ask for it).
        key_data = base64.b64encode(key.read_bytes()).decode()
        await list_nodes(settings(write_kubeconfig(
            tmp_path / "cfg2", url, {"client-certificate-data": ca_data,
                                     "client-key-data": key_data},
            {"certificate-authority": str(cert)})))
        # Without the CA the server is refused; insecure-skip-tls-verify accepts it.
        with pytest.raises(Exception, match="certificate verify failed"):
            await list_nodes(settings(write_kubeconfig(tmp_path / "cfg3", url, {})))
        await list_nodes(settings(write_kubeconfig(
            tmp_path / "cfg4", url, {}, {"insecure-skip-tls-verify": True})))
    assert len(seen) == 3


@dataclass
class MutualTls:
    """A server certificate naming api.internal (not the 127.0.0.1 dialled) and a client
    certificate the server requires; the SNI names the server is sent."""

    cert: Path
    client_cert: Path
    client_key: Path
    server: ssl.SSLContext
    cluster: dict[str, Any]
    """The kubeconfig cluster fields: its CA and tls-server-name api.internal."""
    names: list[str | None] = field(default_factory=list)


def mutual_tls(tmp_path: Path) -> MutualTls:
    cert, key = make_certificate(tmp_path, "api.internal", "DNS:api.internal")
    client_cert, client_key = make_certificate(tmp_path, "node-a", "DNS:node-a")
    tls = MutualTls(cert, client_cert, client_key, server_tls(cert, key, client_ca=client_cert),
                    {"certificate-authority-data": b64(cert), "tls-server-name": "api.internal"})
    tls.server.sni_callback = lambda sock, name, context: tls.names.append(name)
    return tls


async def test_a_server_name_override_and_a_client_certificate_the_server_requires(tmp_path):
    """The certificate names api.internal, not the address dialled: tls-server-name is what
    is checked (and sent as SNI); the server only talks to holders of the client cert."""
    tls = mutual_tls(tmp_path)
    cert, client_cert, client_key, cluster, names = (
        tls.cert, tls.client_cert, tls.client_key, tls.cluster, tls.names)
    async with recording_server(tls.server) as (url, seen):
        await list_nodes(settings(write_kubeconfig(
            tmp_path / "cfg", url, {"client-certificate-data": b64(client_cert),
                                    "client-key-data": b64(client_key)}, cluster)))
        # The client certificate can come from an exec plugin instead.
        plugin = exec_plugin(tmp_path, {"clientCertificateData": client_cert.read_text(),
                                        "clientKeyData": client_key.read_text()})
        await list_nodes(settings(write_kubeconfig(tmp_path / "cfg2", url, plugin, cluster)))
        # Checked against the address dialled, the certificate does not match.
        with pytest.raises(Exception, match="certificate verify failed"):
            await list_nodes(settings(write_kubeconfig(
                tmp_path / "cfg3", url, {"client-certificate-data": b64(client_cert),
                                         "client-key-data": b64(client_key)},
                {"certificate-authority-data": b64(cert)})))
    assert len(seen) == 2
    assert names[:2] == ["api.internal", "api.internal"]


# --- the daemon's import graph ---------------------------------------------------------------

def test_the_node_daemon_never_imports_the_kubernetes_package_or_aiohttp():
    """Both are heavy to import (``bench/RESULTS.md``): the daemon talks to the API server
    through gpudra.kube, over its own HTTP client."""
    code = textwrap.dedent("""
        import sys
        import gpudra.cli.main, gpudra.cli.node_cmd, gpudra.kubeletplugin.node.daemon
        from gpudra.kubeletplugin.node import daemon
        daemon._import_client_modules()  # what it loads once registered
        import gpudra.kube.session, gpudra.kube.credentials
        print(sorted(m for m in sys.modules
                     if m.split(".")[0] in ("kubernetes", "aiohttp", "yarl", "multidict")))
    """)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert out.strip() == "[]"
