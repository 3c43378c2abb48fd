"""One way to reach a cluster for ``gpudra node``, ``gpudra explain`` and ``gpudra top``
(issue 28 item 3): for each kubeconfig of the matrix (token, client certificate, exec
plugin, ``proxy-url``, ``HTTPS_PROXY`` with and without ``NO_PROXY``, ``tls-server-name``,
two merged files) all three reach the same server, as the same identity, through the same
proxy (or none). In a pod: the service account's token, re-read as it rotates, its CA, and
the environment's proxy.

Real processes and sockets: the node daemon runs as its own process (simulated GPUs, the
kubelet emulator); explain and top run in-process through ``main``. The API is the test
API server behind a local HTTPS front that records the TLS server name, the client
certificate and each request's ``Authorization``, and a local ``CONNECT`` proxy that
records its tunnels (:mod:`tests.kube.tls_front`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudra.cli.main import main
from gpudra.kube.raw_api import NODES, RawApi
from gpudra.kubeletplugin.node.api_access import api_session, check_api_access
from gpudra.scheduling.explain import default_device_classes
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.integration.daemon import Daemon, free_port
from tests.kube.certificates import b64, make_certificate
from tests.kube.tls_front import Front, Seen

ROOT = Path(__file__).resolve().parents[2]
CLAIM = ROOT / "examples" / "mps" / "claim.yaml"
HOST = socket.gethostname().lower()
"""A name of this machine that is not ``localhost``: a proxy from the environment applies
to it (never to localhost or a loopback address), and it resolves here."""


def _resolves_to_loopback(name: str) -> bool:
    try:
        return all(ip.startswith("127.") for *_, (ip, _port) in
                   socket.getaddrinfo(name, 1, socket.AF_INET))
    except OSError:
        return False


@dataclass
class Pki:
    server_cert: Path
    client_cert: Path
    client_key: Path
    front: ssl.SSLContext


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    cert, key = make_certificate(directory, "api.internal",
                                 f"DNS:api.internal,DNS:{HOST},IP:127.0.0.1")
    client_cert, client_key = make_certificate(directory, "node-a", "DNS:node-a")
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    tls.verify_mode = ssl.CERT_OPTIONAL  # a client certificate, when shown, is checked
    tls.load_verify_locations(client_cert)
    return Pki(cert, client_cert, client_key, tls)


@pytest.fixture(scope="module")
def cluster(pki: Pki) -> Iterator[tuple[FakeApiServer, Front]]:
    with FakeApiServer() as api, Front(pki.front, api.port) as front:
        for obj in [*default_device_classes("gpu.nvidia.com"),
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}]:
            api.put(obj)
        yield api, front


@dataclass
class Case:
    """A kubeconfig (one file, or several merged through KUBECONFIG) and the environment;
    what every command must show the server."""

    files: list[Path]
    env: dict[str, str] = field(default_factory=dict)
    identity: str | None = None
    """``Authorization``, or ``CN=`` of the client certificate."""
    server_name: str = "api.internal"
    tunnel: str | None = None
    """The proxy's CONNECT target; None: no proxy."""


def kubeconfig(path: Path, server: str, user: dict[str, Any], *,
               cluster: dict[str, Any] | None = None, context: str = "ctx",
               current: bool = True, clusters: bool = True, users: bool = True) -> Path:
    document: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "contexts": [{"name": context, "context": {"cluster": "c", "user": "u"}}]}
    if current:
        document["current-context"] = context
    if clusters:
        document["clusters"] = [{"name": "c", "cluster": {"server": server, **(cluster or {})}}]
    if users:
        document["users"] = [{"name": "u", "user": user}]
    path.write_text(yaml.safe_dump(document))
    return path


def exec_plugin(directory: Path, token: str) -> dict[str, Any]:
    script = directory / "plugin.py"
    script.write_text(textwrap.dedent(f"""
        import json
        print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1",
                           "kind": "ExecCredential", "status": {{"token": {token!r}}}}}))
    """))
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                     "command": sys.executable, "args": [str(script)]}}


CASES = ["token", "client-cert", "exec", "proxy-url", "https-proxy", "no-proxy",
         "tls-server-name", "merged"]


def case(name: str, directory: Path, pki: Pki, front: Front) -> Case:
    ca = {"certificate-authority-data": b64(pki.server_cert)}
    by_name = f"https://{HOST}:{front.port}"
    proxy = f"http://127.0.0.1:{front.proxy_port}"
    path = directory / "kubeconfig"
    if name == "token":
        return Case([kubeconfig(path, by_name, {"token": "tok-a"}, cluster=ca)],
                    identity="Bearer tok-a", server_name=HOST)
    if name == "client-cert":
        user = {"client-certificate": str(pki.client_cert), "client-key": str(pki.client_key)}
        return Case([kubeconfig(path, by_name, user, cluster=ca)], identity="CN=node-a",
                    server_name=HOST)
    if name == "exec":
        return Case([kubeconfig(path, by_name, exec_plugin(directory, "tok-exec"),
                                cluster=ca)], identity="Bearer tok-exec", server_name=HOST)
    if name == "proxy-url":
        # api.internal resolves nowhere here: only the proxy can reach it.
        server = f"https://api.internal:{front.port}"
        return Case([kubeconfig(path, server, {"token": "tok-p"},
                                cluster={**ca, "proxy-url": proxy})],
                    identity="Bearer tok-p", tunnel=f"CONNECT api.internal:{front.port}")
    if name in ("https-proxy", "no-proxy"):
        env = {"HTTPS_PROXY": proxy, "NO_PROXY": "example.com,10.0.0.0/8"}
        tunnel: str | None = f"CONNECT {HOST}:{front.port}"
        if name == "no-proxy":
            env["NO_PROXY"] += f",{HOST}"
            tunnel = None
        return Case([kubeconfig(path, by_name, {"token": "tok-e"}, cluster=ca)], env=env,
                    identity="Bearer tok-e", server_name=HOST, tunnel=tunnel)
    if name == "tls-server-name":
        # Dialled by address; the certificate is checked against (and SNI says) the name.
        server = f"https://127.0.0.1:{front.port}"
        return Case([kubeconfig(path, server, {"token": "tok-t"},
                                cluster={**ca, "tls-server-name": "api.internal"})],
                    identity="Bearer tok-t")
    assert name == "merged"
    # The first file has the context and the cluster, the second the user.
    first = kubeconfig(directory / "first", by_name, {}, cluster=ca, users=False)
    second = kubeconfig(directory / "second", "https://nowhere.invalid", {"token": "tok-m"},
                        context="other", current=False, clusters=False)
    return Case([first, second], identity="Bearer tok-m", server_name=HOST)


def identities(seen: Seen) -> set[str | None]:
    subjects = {f"CN={s}" for s in seen.client_subjects if s}
    return subjects | {a for a in seen.authorizations if a} or {None}


def observed(front: Front) -> tuple[set[str | None], set[str | None], set[str]]:
    seen = front.settled()
    assert seen.authorizations, "no request reached the server"
    return identities(seen), set(seen.server_names), set(seen.tunnels)


def run_node(case: Case, tmp_path: Path, api: FakeApiServer, front: Front) -> Any:
    flag = os.pathsep.join(map(str, case.files))
    daemon = Daemon(url=api.url, extra_args=["--kubeconfig", flag], env=case.env,
                    base=tmp_path / "node")
    daemon.base.mkdir()
    before = api.writes()
    daemon.start()
    try:
        # Registered, it publishes its slices: wait until a write reached the server.
        deadline = time.monotonic() + 30
        while api.writes() == before:
            assert time.monotonic() < deadline, daemon.output()
            time.sleep(0.02)
    finally:
        assert daemon.stop() == 0, daemon.output()
    return observed(front)


def run_cli(argv: list[str], front: Front) -> Any:
    code = main(argv)
    assert code in (0, 1), code
    return observed(front)


@pytest.mark.skipif(not _resolves_to_loopback(HOST), reason=f"{HOST} is not this machine")
@pytest.mark.parametrize("name", CASES)
def test_node_explain_and_top_reach_the_same_server_as_the_same_identity_and_proxy(
        name: str, pki: Pki, cluster: tuple[FakeApiServer, Front], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    api, front = cluster
    c = case(name, tmp_path, pki, front)
    expected = ({c.identity}, {c.server_name}, {c.tunnel} if c.tunnel else set())
    for variable in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY",
                     "no_proxy", "KUBECONFIG", "SIMULATE", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in c.env.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("HOME", str(tmp_path))
    if len(c.files) > 1:
        monkeypatch.setenv("KUBECONFIG", os.pathsep.join(map(str, c.files)))
        flags = ["--context", "ctx"]
    else:
        flags = ["--kubeconfig", str(c.files[0])]
    results = {}
    front.clear()
    results["node"] = run_node(c, tmp_path, api, front)
    front.clear()
    results["explain"] = run_cli(["explain", str(CLAIM), *flags], front)
    front.clear()
    dead = f"http://127.0.0.1:{free_port()}"
    results["top"] = run_cli(["top", *flags, "--endpoint", dead], front)
    capsys.readouterr()
    assert results == {"node": expected, "explain": expected, "top": expected}


@pytest.mark.skipif(not _resolves_to_loopback(HOST), reason=f"{HOST} is not this machine")
@pytest.mark.parametrize("no_proxy", ["", HOST])
async def test_in_a_pod_the_service_account_and_the_environments_proxy(
        no_proxy: str, pki: Pki, cluster: tuple[FakeApiServer, Front], tmp_path: Path):
    _, front = cluster
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("sa-1\n")
    (account / "ca.crt").write_bytes(pki.server_cert.read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": HOST, "KUBERNETES_SERVICE_PORT": str(front.port),
           "HTTPS_PROXY": f"http://127.0.0.1:{front.proxy_port}", "NO_PROXY": no_proxy}
    front.clear()
    connection = check_api_access(None, environ=env, home=tmp_path,
                                  service_account=account)
    async with api_session(connection) as session:
        api = RawApi(session, timeout=5)
        await api.list(NODES)
        (account / "token").write_text("sa-2\n")  # the kubelet rotates the projected token
        stamp = (account / "token").stat().st_mtime_ns + 1_000_000_000
        os.utime(account / "token", ns=(stamp, stamp))
        await api.list(NODES)
    seen = await asyncio.to_thread(front.settled)
    assert seen.authorizations == ["Bearer sa-1", "Bearer sa-2"]
    assert set(seen.server_names) == {HOST}
    assert seen.tunnels == ([] if no_proxy else [f"CONNECT {HOST}:{front.port}"])
