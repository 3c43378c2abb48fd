"""Kubeconfig resolution as kubectl does it: --kubeconfig, KUBECONFIG (merged by the
``kubernetes`` package), ~/.kube/config, in-cluster; --context and --namespace; the checks
made before loading; sessions that really connect. Credentials, TLS and proxies across all
three commands: test_credentials_matrix.py."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from gpudra.kube.kubeconfig import (
    ClusterAccess,
    KubeconfigError,
    Plan,
    config_files,
    plan,
    resolve,
)
from gpudra.kube.raw_api import NODES, RawApi
from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi import FakeApiServer
from tests.kube.certificates import make_certificate


def kubeconfig(path: Path, *, current: str | None = None, namespace: str | None = None,
               contexts: dict[str, str] | None = None, server: str = "http://127.0.0.1:1",
               user: dict | None = None, named_paths: bool = True, **extra) -> Path:
    """A kubeconfig with one cluster and user per context name (context → cluster name);
    a cluster's server is ``server`` with its name as the path (to tell them apart), or
    just ``server`` without ``named_paths``."""
    contexts = contexts if contexts is not None else {"ctx": "c"}
    document = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": c, "cluster": {"server": f"{server}/{c}" if named_paths
                                             else server}}
                     for c in set(contexts.values())],
        "users": [{"name": "u", "user": user or {}}],
        "contexts": [{"name": name, "context": {"cluster": cluster, "user": "u",
                                                 **({"namespace": namespace} if namespace
                                                    else {})}}
                     for name, cluster in contexts.items()],
        **extra,
    }
    if current is not None:
        document["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def env(**values: str) -> dict[str, str]:
    return dict(values)


# --- which files ------------------------------------------------------------------------

def test_the_flag_wins_over_kubeconfig_and_home(tmp_path, home):
    files, explicit = config_files(tmp_path / "flag", env(KUBECONFIG="/a:/b"), home)
    assert files == (tmp_path / "flag",)
    assert explicit


def test_kubeconfig_lists_files_in_order_without_duplicates_or_empty_entries(home):
    files, explicit = config_files(None, env(KUBECONFIG=f"/a{os.pathsep}{os.pathsep}/b"
                                              f"{os.pathsep}/a"), home)
    assert files == (Path("/a"), Path("/b"))
    assert not explicit


def test_home_config_is_the_last_file_resort(home):
    assert config_files(None, env(), home) == ((home / ".kube" / "config",), False)
    assert config_files(None, env(KUBECONFIG=""), home) == ((home / ".kube" / "config",), False)


def test_resolution_order_with_real_files(tmp_path, home):
    kubeconfig(home / ".kube" / "config", current="ctx", contexts={"ctx": "home"})
    listed = kubeconfig(tmp_path / "listed", current="ctx", contexts={"ctx": "listed"})
    flag = kubeconfig(tmp_path / "flag", current="ctx", contexts={"ctx": "flag"})

    def cluster(access: ClusterAccess) -> str:
        return access.connection.server.rsplit("/", 1)[1]

    assert cluster(resolve(flag, environ=env(KUBECONFIG=str(listed)), home=home)) == "flag"
    assert cluster(resolve(None, environ=env(KUBECONFIG=str(listed)), home=home)) == "listed"
    assert cluster(resolve(None, environ=env(), home=home)) == "home"
    # KUBECONFIG set: ~/.kube/config is not read even when no listed file exists
    with pytest.raises(KubeconfigError, match="KUBECONFIG="):
        resolve(None, environ=env(KUBECONFIG=str(tmp_path / "missing")), home=home)


def test_in_cluster_when_no_file_and_running_in_a_pod(tmp_path, home):
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "namespace").write_text("gpu-operator\n")
    pod = env(KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_SERVICE_PORT="443")
    (account / "token").write_text("pod-token")
    make_certificate(account, "ca", "DNS:kubernetes")[0].rename(account / "ca.crt")
    access = resolve(None, environ=pod, home=home, service_account=account)
    assert (access.connection.server, access.namespace) == ("https://10.0.0.1:443",
                                                            "gpu-operator")
    assert access.source == "in-cluster service account"
    assert resolve(None, namespace="x", environ=pod, home=home,
                   service_account=account).namespace == "x"
    (account / "namespace").unlink()
    assert resolve(None, environ=pod, home=home,
                   service_account=account).namespace == "default"
    # a kubeconfig, when there is one, wins over the service account (kubectl's order)
    kubeconfig(home / ".kube" / "config", current="ctx")
    assert resolve(None, environ=pod, home=home).connection.server == "http://127.0.0.1:1/c"


def test_no_configuration_at_all_says_where_it_looked(home):
    with pytest.raises(KubeconfigError) as error:
        resolve(None, environ=env(), home=home)
    assert str(error.value) == (
        f"no cluster configuration: {home}/.kube/config has none and this is not a pod "
        "(KUBERNETES_SERVICE_HOST is unset); give --kubeconfig FILE")


def test_an_explicit_file_must_exist_and_never_falls_back(tmp_path, home):
    pod = env(KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_SERVICE_PORT="443")
    with pytest.raises(KubeconfigError, match=r"^--kubeconfig .*/nope: no such file$"):
        resolve(tmp_path / "nope", environ=pod, home=home)
    (tmp_path / "empty").write_text("")
    with pytest.raises(KubeconfigError, match="empty"):
        resolve(tmp_path / "empty", environ=pod, home=home)


def test_unreadable_kubeconfig_names_the_file(tmp_path, home):
    bad = tmp_path / "bad"
    bad.write_text("clusters: [\n")
    with pytest.raises(KubeconfigError, match=f"kubeconfig {bad}: not valid YAML"):
        resolve(bad, environ=env(), home=home)
    bad.write_text("- a list\n")
    with pytest.raises(KubeconfigError, match="expected a mapping"):
        resolve(bad, environ=env(), home=home)


# --- merging (the kubernetes package's; the first file's current-context, kubectl's) ----

def test_the_first_file_that_names_a_context_or_current_context_wins(tmp_path, home):
    first = kubeconfig(tmp_path / "one", current="a", contexts={"a": "first", "b": "b1"})
    second = kubeconfig(tmp_path / "two", current="b", contexts={"b": "b2"}, namespace="ml")
    listed = env(KUBECONFIG=f"{first}{os.pathsep}{second}")
    assert resolve(None, environ=listed, home=home).connection.server.endswith("/first")
    access = resolve(None, context="b", environ=listed, home=home)
    assert access.connection.server.endswith("/b1") and access.namespace == "default"


def test_a_later_file_sets_current_context_when_the_first_does_not(tmp_path, home):
    first = kubeconfig(tmp_path / "one", contexts={"a": "c"})
    second = kubeconfig(tmp_path / "two", current="b", contexts={"b": "d"}, namespace="ml")
    access = resolve(None, environ=env(KUBECONFIG=f"{first}{os.pathsep}{second}"), home=home)
    assert access.connection.server.endswith("/d")
    assert access.namespace == "ml"
    assert access.source == f"context b in {first}{os.pathsep}{second}"


def test_relative_file_references_are_checked_against_the_file_that_names_them(
        tmp_path, home):
    directory = tmp_path / "dir"
    path = kubeconfig(directory / "config", current="ctx",
                      user={"tokenFile": "token"})
    with pytest.raises(KubeconfigError, match=f"^user 'u': tokenFile {directory}/token: No such"):
        resolve(path, environ=env(), home=home)
    (directory / "token").write_text("t")
    assert resolve(path, environ=env(), home=home).connection.credentials is not None


# --- context and namespace --------------------------------------------------------------

def test_context_flag_picks_another_context_and_its_namespace(tmp_path, home):
    path = kubeconfig(tmp_path / "cfg", current="a", contexts={"a": "c", "b": "d"},
                      namespace="team")
    access = resolve(path, context="b", environ=env(), home=home)
    assert (access.connection.server, access.namespace) == ("http://127.0.0.1:1/d", "team")
    assert resolve(path, context="b", namespace="other", environ=env(),
                   home=home).namespace == "other"
    assert access.source == f"context b in {path}"


def test_namespace_defaults_to_default(tmp_path, home):
    path = kubeconfig(tmp_path / "cfg", current="ctx")
    assert resolve(path, environ=env(), home=home).namespace == "default"


def test_unknown_or_missing_context_lists_the_contexts(tmp_path, home):
    path = kubeconfig(tmp_path / "cfg", contexts={"a": "c", "b": "c"})
    with pytest.raises(KubeconfigError, match=r"no current-context in .*\(contexts: a, b\)"):
        resolve(path, environ=env(), home=home)
    with pytest.raises(KubeconfigError, match=r"^--context z: no such context .*\(contexts: a, b"):
        resolve(path, context="z", environ=env(), home=home)
    broken = kubeconfig(tmp_path / "broken", current="a", contexts={"a": "c"})
    document = yaml.safe_load(broken.read_text())
    document["clusters"] = []
    broken.write_text(yaml.safe_dump(document))
    with pytest.raises(KubeconfigError, match="context a: cluster 'c' is not in"):
        resolve(broken, environ=env(), home=home)


def test_context_flag_in_a_pod_without_kubeconfig_is_an_error(tmp_path, home):
    pod = env(KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_SERVICE_PORT="443")
    with pytest.raises(KubeconfigError, match="--context x"):
        resolve(None, context="x", environ=pod, home=home)


# --- sessions ---------------------------------------------------------------------------

async def test_a_session_reaches_the_server_of_the_chosen_context(tmp_path, home):
    with FakeApiServer() as api:
        path = kubeconfig(tmp_path / "cfg", current="wrong",
                          contexts={"wrong": "nowhere", "right": "fake"})
        document = yaml.safe_load(path.read_text())
        for cluster in document["clusters"]:
            if cluster["name"] == "fake":
                cluster["cluster"]["server"] = api.url
        path.write_text(yaml.safe_dump(document))
        access = resolve(None, context="right", environ=env(KUBECONFIG=str(path)), home=home)
        assert access.connection.server == api.url
        async with ApiSession(access.connection) as session:
            assert (await RawApi(session).list(NODES))["kind"] == "NodeList"


async def test_a_checked_kubeconfig_loads_in_a_child_for_the_sessions_first_request(
        tmp_path, home):
    with FakeApiServer() as api:
        path = kubeconfig(tmp_path / "cfg", current="ctx", server=api.url, named_paths=False,
                          user={"token": "from-child"})
        found = plan(path, environ=env(), home=home)
        assert isinstance(found, Plan)
        async with ApiSession(found.in_child()) as session:
            assert (await RawApi(session).list(NODES))["kind"] == "NodeList"
            assert session._connection is not None
            assert await session._connection.credentials.header() == "Bearer from-child"


def test_a_failure_in_the_child_is_one_line_naming_it(tmp_path, home):
    plugin = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                       "command": str(tmp_path / "no-such-plugin")}}
    path = kubeconfig(tmp_path / "cfg", current="ctx", user=plugin)
    found = plan(path, environ=env(), home=home)
    assert isinstance(found, Plan)
    with pytest.raises(KubeconfigError) as caught:
        found.in_child()()
    message = str(caught.value)
    assert message.startswith(f"user 'u': exec plugin '{tmp_path}/no-such-plugin': ")
    assert "\n" not in message


def test_a_client_certificate_that_is_not_one_is_named(tmp_path, home):
    (tmp_path / "u.crt").write_text("not a certificate")
    (tmp_path / "u.key").write_text("not a key")
    path = kubeconfig(tmp_path / "cfg", current="ctx", server="https://127.0.0.1:1",
                      user={"client-certificate": "u.crt", "client-key": "u.key"})
    with pytest.raises(KubeconfigError, match=r"^client-certificate and client-key: "):
        resolve(path, environ=env(), home=home)


def test_first_calls_from_several_threads_share_one_childs_answer(tmp_path, home):
    # The daemon's first API calls can come at once: one reads the child, the rest wait.
    path = kubeconfig(tmp_path / "cfg", current="ctx", server="https://127.0.0.1:1",
                      named_paths=False, user={"token": "from-child"})
    found = plan(path, environ=env(), home=home)
    assert isinstance(found, Plan)
    load = found.in_child()
    with ThreadPoolExecutor(max_workers=4) as pool:
        connections = list(pool.map(lambda _: load(), range(4)))
    assert all(connection is connections[0] for connection in connections)


def test_after_a_failure_the_next_call_asks_a_new_child(tmp_path, home):
    plugin_path = tmp_path / "plugin"
    plugin = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                       "command": str(plugin_path)}}
    path = kubeconfig(tmp_path / "cfg", current="ctx", server="https://127.0.0.1:1",
                      named_paths=False, user=plugin)
    found = plan(path, environ=env(), home=home)
    assert isinstance(found, Plan)
    load = found.in_child()
    with pytest.raises(KubeconfigError, match="exec plugin"):
        load()
    # The admin fixes the plugin; the daemon's retry must not reuse the finished child.
    plugin_path.write_text(
        "#!/bin/sh\necho '{\"apiVersion\": \"client.authentication.k8s.io/v1\","
        " \"kind\": \"ExecCredential\", \"status\": {\"token\": \"fixed\"}}'\n")
    plugin_path.chmod(0o755)
    connection = load()
    assert connection.server == "https://127.0.0.1:1"
