"""The chart runs MPS control daemons in pods of their own by default, and its Role grants
exactly the calls the daemon makes on them (in its own namespace only)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.deploy.test_chart import (
    APP_VERSION,
    NAMESPACE,
    ROOT,
    _daemon_args,
    container,
    objects,
    of_kind,
    one,
    validate,
)

# RawApi method -> Kubernetes verb
_VERBS = {"get": "get", "list": "list", "watch": "watch", "create": "create",
          "replace": "update", "delete": "delete", "apply": "patch"}


def _pod_calls() -> set[str]:
    """The verbs of every RawApi call on PODS in the daemon's pod client."""
    source = Path(ROOT / "kubeletplugin" / "cluster" / "mps_pod_api.py").read_text()
    verbs = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _VERBS and node.args \
                and isinstance(node.args[0], ast.Name) and node.args[0].id == "PODS":
            verbs.add(_VERBS[node.func.attr])
    return verbs


def test_the_role_grants_exactly_the_pod_calls_in_the_drivers_namespace():
    objs = objects()
    role = one(objs, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _pod_calls() == {"get", "list", "create", "delete"}  # the scan works
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": sorted(_pod_calls(), key=list(_VERBS).index)}]
    binding = one(objs, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    [subject] = binding["subjects"]
    [account] = of_kind(objs, "ServiceAccount")
    assert (subject["name"], subject["namespace"]) == (account["metadata"]["name"], NAMESPACE)
    # Nothing cluster-wide about pods.
    assert not [r for r in one(objs, "ClusterRole")["rules"] if "pods" in r["resources"]]


def test_the_daemon_is_told_to_run_mps_daemons_in_pods_of_its_image_and_namespace():
    c = container()
    assert "--mps-daemons=pod" in c["args"]
    assert f"--mps-image=ghcr.io/gpudra/gpudra:{APP_VERSION}" in c["args"]
    assert "--namespace=$(POD_NAMESPACE)" in c["args"]
    env = {e["name"]: e.get("valueFrom") for e in c["env"]}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    args = _daemon_args("default")
    assert (args.mps_daemons, args.mps_image) == ("pod", c["image"])


@pytest.mark.parametrize("driver_root", [None, Path("/"), Path("/home/kubernetes/bin/nvidia")])
def test_the_mps_pod_the_daemon_creates_is_valid_kubernetes(driver_root):
    from gpudra.driver.mps_pods import MpsPods, MpsPodSettings

    class Namespace:  # MpsPods reads only the namespace to build a pod
        namespace = NAMESPACE

    pods = MpsPods(Namespace(), MpsPodSettings(  # type: ignore[arg-type]
        driver="gpu.nvidia.com", node="node-1", image="ghcr.io/gpudra/gpudra:1",
        host_driver_root=driver_root))
    key = "shared-GPU-0e28b000-a0de-5f95-b779-b62b667efcfa"
    validate(pods.pod_for(key, Path("/var/lib/kubelet/plugins/gpu.nvidia.com/mps") / key,
                          ["GPU-0e28b000-a0de-5f95-b779-b62b667efcfa"]))
