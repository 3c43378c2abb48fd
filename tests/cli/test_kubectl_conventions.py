"""The CLI as kubectl users' hands expect it: the kubectl-gpudra plugin, the cluster found
through KUBECONFIG (merged) and --context, and the context's namespace for the input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from gpudra.cli.main import main, program_name
from gpudra.scheduling.explain import default_device_classes
from gpudra.testing.fakeapi import FakeApiServer
from tests.scheduling.test_allocator import h100_node

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLAIM = ROOT / "examples" / "mps" / "claim.yaml"


def test_program_name_follows_the_executable():
    assert program_name("/usr/local/bin/kubectl-gpudra") == "kubectl gpudra"
    assert program_name("/usr/bin/gpudra") == "gpudra"
    assert program_name("python -m gpudra.cli.main") == "gpudra"


def test_both_console_scripts_run_the_same_entry_point():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-gpudra"] == scripts["gpudra"] == "gpudra.cli.main:main"


@pytest.mark.skipif(not (BIN / "kubectl-gpudra").exists(),
                    reason="kubectl-gpudra not installed here (pip install -e . creates it)")
def test_the_plugin_executable_names_itself_kubectl_gpudra():
    done = subprocess.run([BIN / "kubectl-gpudra", "explain", "--help"], capture_output=True,
                          text=True, check=True, timeout=60)
    assert done.stdout.startswith("usage: kubectl gpudra explain")
    done = subprocess.run([BIN / "kubectl-gpudra", "explain", "nope.yaml", "--simulate",
                           "dgx-h100"], capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (
        2, "kubectl gpudra explain: nope.yaml: No such file or directory\n")


@pytest.mark.skipif(shutil.which("kubectl") is None or not (BIN / "kubectl-gpudra").exists(),
                    reason="needs kubectl and the installed kubectl-gpudra")
def test_kubectl_runs_the_plugin(tmp_path):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(tmp_path / "none")}
    done = subprocess.run(["kubectl", "gpudra", "explain", str(CLAIM), "--simulate",
                           "dgx-h100", "-o", "json"], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["allocatable"] is True


def _kubeconfig(path: Path, server: str, *, context: str, namespace: str | None = None,
                current: bool = True) -> Path:
    body = {"cluster": context, "user": context, **({"namespace": namespace} if namespace
                                                    else {})}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        **({"current-context": context} if current else {}),
        "clusters": [{"name": context, "cluster": {"server": server}}],
        "users": [{"name": context, "user": {}}],
        "contexts": [{"name": context, "context": body}]}))
    return path


@pytest.fixture
def cluster():
    with FakeApiServer() as api:
        for obj in [*h100_node("worker-1", 2, dynamic_mig=False),
                    *default_device_classes("gpu.nvidia.com"),
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-1"}}]:
            api.put(obj)
        yield api


def test_explain_finds_the_cluster_through_a_merged_kubeconfig_and_context(
        cluster, tmp_path, monkeypatch, capsys):
    dead = _kubeconfig(tmp_path / "dead", "http://127.0.0.1:9", context="dead")
    live = _kubeconfig(tmp_path / "live", cluster.url, context="live", namespace="team",
                       current=False)
    listed = os.pathsep.join([str(tmp_path / "missing"), str(dead), str(live)])
    monkeypatch.setenv("KUBECONFIG", listed)
    monkeypatch.delenv("SIMULATE", raising=False)
    # current-context comes from the first file that sets one: the dead cluster
    assert main(["explain", str(CLAIM), "-o", "json"]) == 1
    assert "cannot reach the cluster" in json.loads(capsys.readouterr().out)["error"]["message"]
    # --context picks the live one; its namespace is the input's, as kubectl apply does
    assert main(["explain", str(CLAIM), "--context", "live", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["subject"] == "ResourceClaim team/mps-gpu"
    assert out["node"] == "worker-1"
    assert main(["explain", str(CLAIM), "--context", "live", "-n", "ml", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["subject"] == "ResourceClaim ml/mps-gpu"


def test_explain_with_an_unknown_context_is_a_usage_error(cluster, tmp_path, capsys):
    path = _kubeconfig(tmp_path / "cfg", cluster.url, context="live")
    assert main(["explain", str(CLAIM), "--kubeconfig", str(path), "--context", "nope"]) == 2
    assert capsys.readouterr().err == (
        f"gpudra explain: --context nope: no such context in {path} (contexts: live) (or "
        "explain on simulated nodes: --simulate PROFILE)\n")


def test_home_kubeconfig_is_used_when_nothing_else_is_given(cluster, tmp_path, monkeypatch,
                                                              capsys):
    (tmp_path / ".kube").mkdir()
    _kubeconfig(tmp_path / ".kube" / "config", cluster.url, context="home")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KUBECONFIG", "SIMULATE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["explain", str(CLAIM)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("ALLOCATABLE on node worker-1")
