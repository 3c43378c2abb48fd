"""The chart's ComputeDomain part (``computeDomains.enabled``): valid objects, a controller
Deployment whose flags the controller's own parser accepts, a CRD that agrees with the
model the code decodes with, and RBAC that is exactly what the controller calls — recorded
from the real controller process driven through a domain's whole life against the stand-in."""

from __future__ import annotations

import argparse
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudra.api import compute_domain as cd
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.controller.compute_domains.harness import (
    DRIVER_NS,
    ControllerProcess,
    allocate_channel,
    condition,
    daemon_pods,
    wait_for,
)
from tests.deploy.test_chart import NAMESPACE, objects, of_kind, validate

jsonschema = pytest.importorskip("jsonschema")

ON = {"computeDomains": {"enabled": True}}
CONTROLLER = "gpudra-compute-domain-controller"
DAEMON_SA = "gpudra-imex-daemon"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for ns in ("team", DRIVER_NS):
            server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        yield server


def _named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in of_kind(objs, kind) if o["metadata"]["name"] == name]
    return found


def test_off_by_default():
    names = {(o["kind"], o["metadata"]["name"]) for o in objects()}
    assert ("CustomResourceDefinition", "computedomains.resource.nvidia.com") not in names
    assert ("Deployment", CONTROLLER) not in names


@pytest.mark.parametrize("values", [ON, {"computeDomains": {"enabled": True, "controller": {
    "replicas": 3, "readyTimeout": "90s", "nodeSelector": {"role": "control"},
    "tolerations": [{"key": "x", "operator": "Exists"}]}}}])
def test_every_object_is_valid_kubernetes(values):
    objs = objects(values)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert {("CustomResourceDefinition", "computedomains.resource.nvidia.com"),
            ("DeviceClass", cd.CHANNEL_DEVICE_CLASS), ("DeviceClass", cd.DAEMON_DEVICE_CLASS),
            ("Deployment", CONTROLLER), ("ServiceAccount", CONTROLLER),
            ("ClusterRole", CONTROLLER), ("ClusterRoleBinding", CONTROLLER),
            ("Role", CONTROLLER), ("RoleBinding", CONTROLLER), ("ServiceAccount", DAEMON_SA),
            ("ClusterRole", DAEMON_SA), ("ClusterRoleBinding", DAEMON_SA)} <= kinds
    for obj in objs:
        validate(obj)


def test_the_deployment_runs_the_controller_with_flags_its_parser_accepts(monkeypatch):
    from gpudra.cli.main import build_parser

    values = {"computeDomains": {"enabled": True, "controller": {"replicas": 2,
                                                                 "readyTimeout": "90s"}}}
    deployment = _named(objects(values), "Deployment", CONTROLLER)
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == CONTROLLER
    (container,) = pod["containers"]
    assert container["command"] == ["gpudra"]
    env = {"POD_NAMESPACE": NAMESPACE, "POD_NAME": "controller-0"}
    argv = [a.replace("$(POD_NAMESPACE)", env["POD_NAMESPACE"])
            .replace("$(POD_NAME)", env["POD_NAME"]) for a in container["args"]]
    args: argparse.Namespace = build_parser().parse_args(argv)
    assert (args.namespace, args.identity, args.leader_elect) == (NAMESPACE, "controller-0",
                                                                  "true")
    assert args.daemon_service_account == DAEMON_SA
    assert args.ready_timeout == "90s"
    assert args.daemon_image == container["image"]
    assert args.daemon_priority_class == "system-node-critical"
    paths = {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    for var, path in paths.items():
        assert {"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}} in container["env"]


def test_device_classes_select_the_node_sides_device_types():
    objs = objects(ON)
    for name, kind in ((cd.CHANNEL_DEVICE_CLASS, cd.DEVICE_TYPE_CHANNEL),
                       (cd.DAEMON_DEVICE_CLASS, cd.DEVICE_TYPE_DAEMON)):
        (selector,) = _named(objs, "DeviceClass", name)["spec"]["selectors"]
        assert selector["cel"]["expression"] == (
            f"device.driver == '{cd.DRIVER_NAME}' && device.attributes['{cd.DRIVER_NAME}']"
            f".{cd.ATTRIBUTE_TYPE} == '{kind}'")


# --- the CRD agrees with the model ---------------------------------------------------------

GOOD = {"apiVersion": cd.API_VERSION, "kind": cd.KIND,
        "metadata": {"name": "d", "namespace": "team",
                     "uid": "0b5f5e5e-1111-4222-8333-444455556666"},
        "spec": {"numNodes": 4, "channel": {"resourceClaimTemplate": {"name": "ch"},
                                            "allocationMode": "All"}},
        "status": {"status": "Ready", "nodes": [{"name": "n1", "ipAddress": "10.0.0.1",
                                                 "cliqueID": "u.1", "index": 0,
                                                 "status": "Ready"}]}}


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(GOOD)
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return obj


@pytest.mark.parametrize(("obj", "valid"), [
    (GOOD, True),
    (_with(("spec", "numNodes"), -1), False),
    (_with(("spec", "numNodes"), "4"), False),
    (_with(("spec", "channel", "allocationMode"), "Some"), False),
    (_with(("spec", "channel"), {}), False),
    (_with(("status", "status"), "Maybe"), False),
    (_with(("status", "nodes"), [{"name": "n1", "status": "Up"}]), False),
])
def test_the_crd_schema_and_the_model_agree(obj, valid):
    crd = _named(objects(ON), "CustomResourceDefinition", "computedomains.resource.nvidia.com")
    (version,) = crd["spec"]["versions"]
    assert (version["name"], crd["spec"]["group"], crd["spec"]["names"]["plural"]) == (
        cd.VERSION, cd.GROUP, cd.PLURAL)
    schema = version["schema"]["openAPIV3Schema"]
    schema_ok = jsonschema.Draft7Validator(schema).is_valid(obj)
    try:
        cd.parse_compute_domain(obj)
        model_ok = True
    except cd.ComputeDomainError:
        model_ok = False
    assert (schema_ok, model_ok) == (valid, valid)


# --- RBAC: exactly what the running controller calls ---------------------------------------

def _group(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    return parts[1] if parts[0] == "apis" else ""


def _granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def _drive_a_domain_through_its_life(api: FakeApiServer, base: Path) -> None:
    """Everything but the controller writes directly to the store, so every HTTP request
    the server records is the controller's."""
    proc = ControllerProcess(api.url, base, identity="rbac").start()
    try:
        domain = api.put({"apiVersion": cd.API_VERSION, "kind": cd.KIND,
                          "metadata": {"name": "life", "namespace": "team"},
                          "spec": {"numNodes": 2, "channel": {
                              "resourceClaimTemplate": {"name": "life-channel"}}}})
        uid = domain["metadata"]["uid"]
        claims = [allocate_channel(api, domain, n) for n in ("n1", "n2")]
        pods = wait_for("pods", lambda: (p := daemon_pods(api, uid)) and len(p) == 2 and p)
        api.modify("ComputeDomain", "life", {"status": {"nodes": [
            cd.node_entry(n, ip_address="10.0.0.1", clique_id="u.1", index=i, status="Ready")
            for i, n in enumerate(("n1", "n2"))]}}, "team")
        wait_for("ready", lambda: (condition(api, claims[1], cd.CONDITION_READY) or {})
                 .get("status") == "True")
        api.modify("Pod", pods["n1"]["metadata"]["name"], {"status": {"phase": "Failed"}},
                   DRIVER_NS)
        wait_for("failed", lambda: (condition(api, claims[0], cd.CONDITION_FAILED) or {})
                 .get("status") == "True")
        api.delete("ResourceClaim", claims[1]["metadata"]["name"], "team")
        wait_for("n2's pod gone", lambda: "n2" not in daemon_pods(api, uid))
        api.delete("ComputeDomain", "life", "team")
        wait_for("clean", lambda: not daemon_pods(api, uid) and api.get(
            "ResourceClaimTemplate", f"imex-{uid}", DRIVER_NS) is None)
    finally:
        assert proc.stop() == 0, proc.output()[-3000:]


def test_rbac_is_exactly_what_the_controller_calls(api: FakeApiServer, tmp_path: Path):
    _drive_a_domain_through_its_life(api, tmp_path)
    calls = {(_group(r.path), r.resource, r.verb) for r in api.requests}
    namespaces = {(_group(r.path), r.resource): set() for r in api.requests}
    for r in api.requests:
        namespaces[(_group(r.path), r.resource)].add(r.namespace)
    objs = objects(ON)
    cluster = _granted(_named(objs, "ClusterRole", CONTROLLER)["rules"])
    local = _granted(_named(objs, "Role", CONTROLLER)["rules"])
    synthetic = {("resource.k8s.io", "resourceclaims/driver", f"arbitrary-node:{verb}")
                 for _, resource, verb in calls if resource == "resourceclaims/status"}
    assert ("resource.k8s.io", "resourceclaims/status", "patch") in calls  # it did write
    assert cluster | local == calls | synthetic
    # What only the Role grants was only asked for in the driver namespace.
    for group, resource, _ in local:
        assert namespaces[(group, resource)] == {DRIVER_NS}, (resource, namespaces)
    # Its own Role binds to its own ServiceAccount, not the node daemon's.
    binding = _named(objs, "RoleBinding", CONTROLLER)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CONTROLLER,
                                    "namespace": NAMESPACE}]


def test_the_daemon_pods_service_account_is_the_charts():
    rules = _granted(_named(objects(ON), "ClusterRole", DAEMON_SA)["rules"])
    # The daemon reads its domain and writes its own status entry, conditionally.
    assert rules == {("resource.nvidia.com", "computedomains", "get"),
                     ("resource.nvidia.com", "computedomains/status", "update")}
