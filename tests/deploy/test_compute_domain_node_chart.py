"""The chart's ``gpudra compute-domain-node`` DaemonSet (``computeDomains.enabled``): valid
objects, flags and environment its own parser resolves to the mounted paths, the slice
policy confining its ServiceAccount to its node's compute-domain.nvidia.com pool, and RBAC
that is exactly what it calls — recorded from the real process (simulated GB200 tray,
kubelet stand-in, API stand-in) through publish, fabric change, prepare and unprepare of a
daemon and a channel claim, and shutdown."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudra.api.compute_domain import DRIVER_NAME, channel_config, daemon_config, node_entry
from gpudra.driver.sim.api_fabric import set_fabric
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.compute_domains.harness import SimNode, allocated_claim, claim_ref, published, until
from tests.deploy.test_chart import NAMESPACE, SIMULATE, admit, objects, of_kind, slice_policy
from tests.deploy.test_chart import validate as validate_strict

ON = {"computeDomains": {"enabled": True}}
NAME = "gpudra-compute-domain-node"
CDN_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
GPU_USER = f"system:serviceaccount:{NAMESPACE}:gpudra"
NODE = "tray-a"


def _named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in of_kind(objs, kind) if o["metadata"]["name"] == name]
    return found


def _pod(values: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = _named(objects(values), "DaemonSet", NAME)["spec"]["template"]["spec"]
    return spec


def test_off_by_default():
    assert [o["metadata"]["name"] for o in of_kind(objects(), "DaemonSet")] == ["gpudra"]
    assert not [o for o in objects() if o["metadata"]["name"] == NAME]


@pytest.mark.parametrize("values", [
    ON, {**ON, **SIMULATE},
    {**ON, "driverRoot": "/run/nvidia/driver", "devRoot": "/run/nvidia/driver"},
    {"resources": {"computeDomains": {"enabled": True}}},  # NVIDIA's name for the switch
], ids=["real", "simulated", "operator-roots", "nvidia-values"])
def test_every_object_is_valid_kubernetes(values):
    objs = objects(values)
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert {("DaemonSet", NAME), ("ServiceAccount", NAME), ("ClusterRole", NAME),
            ("ClusterRoleBinding", NAME), ("DaemonSet", "gpudra")} <= names
    for obj in objs:
        validate_strict(obj)


def _resolved_args(values: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                   ) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The container's argv parsed by the command's own parser, with the container's
    environment (fieldRefs filled in as the kubelet would) in place."""
    from gpudra.cli.main import build_parser

    pod = _pod(values)
    (container,) = pod["containers"]
    assert container["command"] == ["gpudra"]
    fields = {"spec.nodeName": NODE, "metadata.uid": "0c6f3d0a-pod-uid"}
    env: dict[str, str] = {}
    for var in container["env"]:
        env[var["name"]] = (fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
                            if "valueFrom" in var else var["value"])
    for name in ("NODE_NAME", "POD_UID", "KUBELET_REGISTRAR_DIRECTORY_PATH",
                 "KUBELET_PLUGINS_DIRECTORY_PATH", "CDI_ROOT", "DEV_ROOT", "HOST_DEV_ROOT",
                 "DRIVER_ROOT", "DATA_DIR", "IMEX_ROOT", "HOST_IMEX_ROOT", "SIMULATE",
                 "SIM_STATE", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = [a.replace("$(NODE_NAME)", env["NODE_NAME"]).replace("$(POD_UID)", env["POD_UID"])
            for a in container["args"]]
    assert argv[0] == "compute-domain-node"
    return build_parser().parse_args(argv), pod


def _mounts(pod: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """container mount path -> (host path, mount)."""
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: (volumes[m["name"]].get("hostPath", {}).get("path", ""), m)
            for m in container["volumeMounts"]}


def test_flags_and_environment_resolve_to_the_mounted_host_paths(monkeypatch):
    values = {**ON, "driverRoot": "/run/nvidia/driver", "devRoot": "/",
              "kubeletPlugin": {"kubeletPluginsDirectoryPath": "/var/lib/k/plugins",
                                "kubeletRegistrarDirectoryPath": "/var/lib/k/registry"}}
    args, pod = _resolved_args(values, monkeypatch)
    assert (args.node_name, args.pod_uid) == (NODE, "0c6f3d0a-pod-uid")
    assert args.simulate is None
    mounts = _mounts(pod)
    # The kubelet's directories, mounted at their host paths (the kubelet dials the
    # sockets we report; CDI specs bind the IMEX directories by host path).
    for path in (args.registrar_dir, args.plugins_dir, args.cdi_root):
        assert mounts[str(path)][0] == str(path)
    assert str(args.plugins_dir) == "/var/lib/k/plugins"
    assert str(args.registrar_dir) == "/var/lib/k/registry"
    # The per-domain IMEX directories default under the plugins dir (as run() derives them).
    assert args.data_dir is None and args.imex_root is None and args.host_imex_root is None
    imex = args.plugins_dir / "compute-domain.nvidia.com" / "imex"
    assert imex.is_relative_to(args.plugins_dir)
    # NVML from the driver root, read-only; the channel nodes from a live view of /dev.
    assert str(args.driver_root) == "/driver-root"
    host, mount = mounts["/driver-root"]
    assert host == "/run/nvidia/driver" and mount["readOnly"] is True
    assert (str(args.dev_root), str(args.host_dev_root)) == ("/dev-root", "/")
    host, mount = mounts["/dev-root/dev"]
    assert host == "/dev" and mount["readOnly"] and mount["mountPropagation"] == "HostToContainer"
    # Its own ServiceAccount, and where the GPU plugin runs.
    assert pod["serviceAccountName"] == NAME
    gpu = _named(objects(values), "DaemonSet", "gpudra")["spec"]["template"]["spec"]
    for key in ("affinity", "tolerations", "priorityClassName", "nodeSelector"):
        assert pod.get(key) == gpu.get(key), key
    assert pod["containers"][0]["securityContext"] == gpu["containers"][0]["securityContext"]


def test_a_simulated_node_shares_the_gpu_daemons_simulated_hardware(monkeypatch):
    args, pod = _resolved_args({**ON, **SIMULATE}, monkeypatch)
    gpu = _named(objects({**ON, **SIMULATE}), "DaemonSet", "gpudra")
    gpu_args = gpu["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args.simulate == "dgx-a100"
    assert f"--sim-state={args.sim_state}" in gpu_args
    assert args.sim_state.is_relative_to(args.plugins_dir)
    assert args.driver_root is None and args.dev_root is None  # generated when simulating
    assert "/driver-root" not in _mounts(pod)
    assert pod["containers"][0]["securityContext"]["privileged"] is False


# --- the slice policy -----------------------------------------------------------------------

def _slice(node: str, driver: str) -> dict[str, Any]:
    return {"spec": {"nodeName": node, "driver": driver,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


@pytest.mark.parametrize(("user", "node", "driver", "refusal"), [
    (CDN_USER, "n1", DRIVER_NAME, None),
    (CDN_USER, "n2", DRIVER_NAME, "may not write a ResourceSlice of node n2"),
    (CDN_USER, "n1", "gpu.nvidia.com",
     f"of driver {DRIVER_NAME} only, not gpu.nvidia.com"),
    (GPU_USER, "n1", "gpu.nvidia.com", None),
    (GPU_USER, "n1", DRIVER_NAME, f"of driver gpu.nvidia.com only, not {DRIVER_NAME}"),
])
def test_the_slice_policy_confines_each_daemon_to_its_drivers_pool(user, node, driver,
                                                                    refusal):
    allowed, message = admit(slice_policy(objects(ON)), operation="CREATE", node="n1",
                             username=user, obj=_slice(node, driver))
    assert allowed is (refusal is None), message
    if refusal:
        assert refusal in message, message


# --- RBAC: exactly what the running daemon calls --------------------------------------------

def _group(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    return parts[1] if parts[0] == "apis" else ""


def _granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def _drive_the_node_through_its_life(api: FakeApiServer, base: Path) -> None:
    """Everything but the daemon writes straight to the store, so every HTTP request the
    server records is the daemon's."""
    api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    # A slice of the pool left by an earlier run with another layout: the daemon drops it.
    api.put({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{NODE}-{DRIVER_NAME}-stale"},
             "spec": {"driver": DRIVER_NAME, "nodeName": NODE,
                      "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 2},
                      "devices": []}})
    node = SimNode(NODE, "10.0.0.1", api.url, base / "net", plugin_args=("--fabric-poll", "0.1"))
    try:
        node.start(pods=False)
        node.wait_plugin()
        first = until(lambda: published(api, NODE), "the pool")
        until(lambda: api.get("ResourceSlice", f"{NODE}-{DRIVER_NAME}-stale") is None,
              "the stale slice to go")
        domain = api.put({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                          "metadata": {"name": "d", "namespace": "team"},
                          "spec": {"numNodes": 1,
                                   "channel": {"resourceClaimTemplate": {"name": "ch"}}}})
        uid = domain["metadata"]["uid"]
        daemon = claim_ref(api.put(allocated_claim(
            "imex", node=NODE, device="daemon-0", request="daemon",
            parameters=daemon_config(uid), namespace="team")))
        assert node.prepare(daemon)["error"] == ""
        channel = claim_ref(api.put(allocated_claim(
            "worker", node=NODE, device="channel-0", parameters=channel_config(uid),
            namespace="team")))
        assert "has not joined" in node.prepare(channel)["error"]
        api.modify("ComputeDomain", "d", {"status": {"nodes": [node_entry(
            NODE, ip_address="10.0.0.1", clique_id="x.1", index=0, status="Ready")]}}, "team")
        assert node.prepare(channel)["error"] == ""
        assert node.unprepare(channel)["error"] == ""
        assert node.unprepare(daemon)["error"] == ""
        # The tray moves to another clique: its slices are rewritten in place, the first
        # write meeting a conflict (another writer) so the slice is read again.
        api.fail_next(1, 409, verb="update", resource="resourceslices")
        set_fabric(node.sim_state, clique_id=77)
        until(lambda: published(api, NODE)["channel-0"]["attributes"]["cliqueID"]
              != first["channel-0"]["attributes"]["cliqueID"], "the new clique")
        assert node.stop_plugin() == 0, node.log()[-3000:]
    finally:
        node.stop()


def test_rbac_is_exactly_what_the_daemon_calls(api: FakeApiServer, tmp_path: Path):
    _drive_the_node_through_its_life(api, tmp_path)
    calls = {(_group(r.path), r.resource, r.verb) for r in api.requests}
    for verb in ("create", "update", "delete", "get"):  # every slice path was exercised
        assert ("resource.k8s.io", "resourceslices", verb) in calls, calls
    objs = objects(ON)
    rules = _named(objs, "ClusterRole", NAME)["rules"]
    assert _granted(rules) == calls
    # No namespaced Role: claims and domains are read in the claim's own namespace, which
    # can be any.
    assert not [o for o in of_kind(objs, "RoleBinding")
                if any(s["name"] == NAME for s in o["subjects"])]
    binding = _named(objs, "ClusterRoleBinding", NAME)
    assert binding["roleRef"]["name"] == NAME
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME,
                                    "namespace": NAMESPACE}]
