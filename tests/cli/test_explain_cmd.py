"""``gpudra explain`` and ``gpudra validate`` run in-process: output and exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpudra.cli.main import main
from gpudra.scheduling.explain import default_device_classes
from gpudra.testing.fakeapi import FakeApiServer
from tests.scheduling.test_allocator import h100_node

A = "device.attributes['gpu.nvidia.com']"

TWO_GPUS = f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: two-gpus
  namespace: ml
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          count: 2
          selectors:
          - cel:
              expression: "{A}.productName.startsWith('NVIDIA H100')"
      constraints:
      - matchAttribute: gpu.nvidia.com/nvlinkDomain
---
apiVersion: v1
kind: Pod
metadata:
  name: train
  namespace: ml
spec:
  resourceClaims:
  - name: gpus
    resourceClaimTemplateName: two-gpus
  containers:
  - name: c
    image: busybox
"""

TYPO = f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: typo
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: "{A}.productNmae == 'NVIDIA H100 80GB HBM3'"
"""


def write(tmp_path: Path, text: str, name: str = "claim.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_explain_allocatable_on_a_simulated_node(tmp_path, capsys):
    code = main(["explain", str(write(tmp_path, TWO_GPUS)), "--simulate", "dgx-h100"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "Pod ml/train: 1 node (dgx-h100-0)"
    assert "    chosen on dgx-h100-0: gpu-0, gpu-1" in out
    assert out[-1] == "ALLOCATABLE on node dgx-h100-0: gpu -> gpu-0, gpu -> gpu-1"


def test_explain_a_typo_says_not_allocatable_and_suggests_the_name(tmp_path, capsys):
    code = main(["explain", str(write(tmp_path, TYPO)), "--simulate", "dgx-h100", "--nodes", "3"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[-1] == ("NOT ALLOCATABLE: claim typo: selector #0: CEL runtime error: no such "
                       "key: productNmae (did you mean 'productName'?) (on all 3 nodes)")
    assert ("  hint: attribute 'productNmae' (domain gpu.nvidia.com) is not published by any "
            "device; did you mean 'productName'?") in out


def test_explain_json_has_every_node(tmp_path, capsys):
    code = main(["explain", str(write(tmp_path, TWO_GPUS)), "--simulate", "dgx-h100",
                 "--nodes", "4", "-o", "json", "--dynamic-mig-gpus", "all"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert document["allocatable"] is True and document["node"] == "dgx-h100-0"
    assert document["verdict"].endswith("(fits on 4 of 4 nodes)")
    assert [n["node"] for n in document["nodes"]] == [f"dgx-h100-{i}" for i in range(4)]
    (result,) = document["results"]
    assert [r["device"] for r in result["devices"]["results"]] == ["gpu-0", "gpu-1"]
    assert result["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        "dgx-h100-0"]
    rejected = document["nodes"][0]["requests"][0]["rejected"]
    assert len(rejected["class gpu.nvidia.com selector #0 is false"]) == 200


def test_device_classes_in_the_file_override_the_defaults(tmp_path, capsys):
    strict = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
              "metadata": {"name": "gpu.nvidia.com"},
              "spec": {"selectors": [{"cel": {"expression": "device.driver == 'nobody'"}}]}}
    text = TWO_GPUS + "---\n" + yaml.safe_dump(strict)
    code = main(["explain", str(write(tmp_path, text)), "--simulate", "dgx-h100",
                 "--dynamic-mig-gpus", "all"])
    out = capsys.readouterr().out
    assert code == 1
    assert "208  class gpu.nvidia.com selector #0 is false" in out


def test_explain_needs_a_cluster_source(tmp_path, capsys, monkeypatch):
    # no --simulate: the cluster kubectl would use, and here there is none (exit status 2)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "SIMULATE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["explain", str(write(tmp_path, TWO_GPUS))]) == 2
    err = capsys.readouterr().err
    assert "no cluster configuration" in err
    assert "--simulate PROFILE" in err


def test_explain_reports_unreadable_input(tmp_path, capsys):
    assert main(["explain", str(tmp_path / "missing.yaml"), "--simulate", "dgx-h100"]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    bad = write(tmp_path, "kind: ConfigMap\n")
    assert main(["explain", str(bad), "--simulate", "dgx-h100"]) == 2
    assert "nothing to explain" in capsys.readouterr().err


def test_explain_refuses_what_the_apiserver_would_refuse(tmp_path, capsys):
    path = write(tmp_path, TWO_GPUS.replace("count: 2", "count: two"))
    assert main(["explain", str(path), "--simulate", "dgx-h100"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "gpudra explain: the apiserver would refuse this input (see also gpudra validate):",
        f"  {path}:spec.spec.devices.requests[0].exactly.count: Invalid value: 'two': must be "
        "greater than zero"]


def test_explain_against_a_cluster(tmp_path, capsys):
    slices = h100_node("worker-1", 2, dynamic_mig=False) + h100_node("worker-2", 2,
                                                                       dynamic_mig=False)
    taken = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "busy", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "g", "exactly": {
                 "deviceClassName": "gpu.nvidia.com"}}]}},
             "status": {"allocation": {"devices": {"results": [
                 {"request": "g", "driver": "gpu.nvidia.com", "pool": "worker-1",
                  "device": "gpu-0"}]}}}}
    with FakeApiServer() as api:
        for obj in [*slices, *default_device_classes("gpu.nvidia.com"), taken,
                    {"kind": "Node", "metadata": {"name": "worker-1", "labels": {"a": "b"}}},
                    {"kind": "Node", "metadata": {"name": "worker-2"}}]:
            api.put({"apiVersion": "v1", **obj} if obj.get("kind") == "Node" else obj)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        code = main(["explain", str(write(tmp_path, TWO_GPUS)), "--kubeconfig", str(kubeconfig)])
        out = capsys.readouterr().out.splitlines()
        assert code == 0
        assert out[0] == "Pod ml/train: 2 nodes (worker-1, worker-2)"
        assert "      1 on 1 node  already allocated" in out
        assert out[-1] == ("ALLOCATABLE on node worker-2: gpu -> gpu-0, gpu -> gpu-1 "
                           "(fits on 1 of 2 nodes)")
        code = main(["explain", str(write(tmp_path, TWO_GPUS)), "--kubeconfig", str(kubeconfig),
                     "--node", "worker-1"])
        assert code == 1
        out = capsys.readouterr().out.splitlines()
        assert "  not considered: devices of 1 node (worker-2): wrong node" in out
        assert out[-1].startswith("NOT ALLOCATABLE: request gpu: needs 2, 1 of 2 devices usable")


def test_explain_with_an_unreachable_cluster(tmp_path, capsys):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "x", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    assert main(["explain", str(write(tmp_path, TWO_GPUS)), "--kubeconfig", str(kubeconfig)]) == 1
    assert "cannot reach the cluster" in capsys.readouterr().err


# --- validate ---------------------------------------------------------------------------

def test_validate_ok(tmp_path, capsys):
    classes = Path(__file__).resolve().parents[2] / "deploy" / "deviceclasses"
    files = [str(write(tmp_path, TWO_GPUS)), *map(str, sorted(classes.glob("*.yaml")))]
    assert main(["validate", *files]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"OK: 4 DeviceClasses, 1 Pod, 1 ResourceClaimTemplate in {len(files)} files"


def test_validate_reports_file_path_and_message(tmp_path, capsys):
    path = write(tmp_path, TYPO)
    assert main(["validate", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        f"{path}:spec.devices.requests[0].exactly.selectors[0].cel.expression: line 1, column "
        "37: device.attributes['gpu.nvidia.com'].productNmae: no such attribute: productNmae is "
        "not published, so the scheduler fails with 'no such key'; did you mean 'productName'?"]
    assert captured.err.strip() == ("1 problem found; the apiserver would accept it: it fails "
                                    "at scheduling or prepare time")


def test_validate_names_the_object_in_multi_document_files(tmp_path, capsys):
    text = TWO_GPUS.replace("count: 2", "count: 0") + "---\n" + TYPO
    path = write(tmp_path, text)
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"{path}:spec.spec.devices.requests[0].exactly.count: Invalid value: 0: "
                      "must be greater than zero (ResourceClaimTemplate ml/two-gpus)")
    assert out[1].endswith("(ResourceClaim typo)")


def test_validate_opaque_configs(tmp_path, capsys):
    pytest.importorskip("gpudra.api.configs")
    claim = yaml.safe_load(TYPO.replace("productNmae", "productName"))
    claim["spec"]["devices"]["config"] = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "bogus": 1}}}]
    path = write(tmp_path, yaml.safe_dump(claim))
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().out.strip() == (
        f"{path}:spec.devices.config[0].opaque.parameters.bogus: unknown field")


def test_validate_unreadable_and_empty(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2  # unreadable input
    assert "nope.yaml" in capsys.readouterr().out
    assert main(["validate", str(write(tmp_path, "kind: ConfigMap\n"))]) == 0
    assert capsys.readouterr().out.startswith("OK: nothing to check")


def test_explain_a_thousand_simulated_nodes(tmp_path, capsys):
    code = main(["explain", str(write(tmp_path, TWO_GPUS)), "--simulate", "dgx-h100",
                 "--nodes", "1000", "--dynamic-mig-gpus", "all"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "Pod ml/train: 1000 nodes (dgx-h100-0 … dgx-h100-999)"
    assert "    8000 devices usable on 1000 nodes" in out
    assert "      200000 on 1000 nodes  class gpu.nvidia.com selector #0 is false" in out
    assert out[-1].endswith("(fits on 1000 of 1000 nodes)")


# --- what the apiserver refuses, what fails at prepare, extended resources ---------------

QUANTITY_AS_STRING = TYPO.replace(
    f"{A}.productNmae == 'NVIDIA H100 80GB HBM3'",
    "device.capacity['gpu.nvidia.com'].memory >= '60Gi'")


def test_a_type_error_is_refused_as_the_apiserver_refuses_it(tmp_path, capsys):
    path = write(tmp_path, QUANTITY_AS_STRING)
    assert main(["explain", str(path), "--simulate", "dgx-h100"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("the apiserver would refuse this input (see also gpudra validate):")
    assert err[1] == (
        f"  {path}:spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value: "
        "CEL compile error: found no matching overload for '_>=_' applied to "
        "'(kubernetes.Quantity, string)' (line 1, column 42); quantities are compared with "
        "methods: device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('60Gi')) >= 0")
    assert main(["validate", str(path)]) == 1
    captured = capsys.readouterr()
    assert "found no matching overload for '_>=_'" in captured.out
    assert captured.err.strip() == "1 problem found; the apiserver would refuse it at create"


def test_validate_says_which_problems_the_apiserver_refuses(tmp_path, capsys):
    path = write(tmp_path, QUANTITY_AS_STRING + "---\n" + TYPO.replace("name: typo",
                                                                     "name: typo2"))
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().err.strip() == (
        "2 problems found; the apiserver would refuse 1 of them at create, the others fail "
        "at scheduling or prepare time")
    assert main(["validate", str(path), "-o", "json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["refusedAtCreate"] == 1
    assert [p["refusedAtCreate"] for p in document["problems"]] == [True, False]


def test_explain_reports_a_config_that_fails_at_prepare(tmp_path, capsys):
    claim = yaml.safe_load(TYPO.replace("productNmae", "productName"))
    claim["spec"]["devices"]["config"] = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}}}}]
    path = write(tmp_path, yaml.safe_dump(claim))
    assert main(["explain", str(path), "--simulate", "dgx-h100"]) == 1
    out = capsys.readouterr().out.splitlines()
    where = ("ResourceClaim typo: spec.devices.config[0].opaque.parameters.sharing.mpsConfig."
             "defaultActiveThreadPercentage")
    assert out[-2].startswith(f"  config: {where}: ")
    assert out[-1].startswith(f"FAILS AT PREPARE: {where}: ")
    assert out[-1].endswith("the scheduler would allocate on node dgx-h100-0: gpu -> gpu-0, "
                            "then the driver refuses the config when the pod starts")


EXTENDED = f"""
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  extendedResourceName: nvidia.com/gpu
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && {A}.type == 'gpu'"
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: classic
  namespace: ml
spec:
  template:
    spec:
      containers:
      - name: cuda
        image: busybox
        resources:
          limits:
            cpu: "1"
            nvidia.com/gpu: 2
"""


def test_explain_a_workload_that_asks_for_nvidia_com_gpu(tmp_path, capsys):
    assert main(["explain", str(write(tmp_path, EXTENDED)), "--simulate", "dgx-h100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Deployment ml/classic: 1 node (dgx-h100-0)"
    assert "  request container-0-request-1: 2 devices of class gpu.nvidia.com" in out
    assert out[-1] == ("ALLOCATABLE on node dgx-h100-0: container-0-request-1 -> gpu-0, "
                       "container-0-request-1 -> gpu-1")
    # without the class, nothing provides nvidia.com/gpu
    bare = EXTENDED.split("---\n", 1)[1]
    assert main(["explain", str(write(tmp_path, bare)), "--simulate", "dgx-h100"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "NOT ALLOCATABLE: no DeviceClass provides nvidia.com/gpu (extendedResourceName); only "
        "a device plugin could")
