"""``gpudra explain`` against a 1.33 (v1beta2) and a 1.32 (v1beta1) cluster: slices, claims
and classes are read in the version served and explained as on a newer cluster."""

from __future__ import annotations

import pytest
import yaml

from gpudra.cli.main import main
from gpudra.scheduling.explain import default_device_classes
from gpudra.testing.fakeapi import FakeApiServer
from tests.cli.test_explain_cmd import TWO_GPUS, write
from tests.scheduling.test_allocator import h100_node


@pytest.mark.parametrize("mode", ["v1beta2", "v1beta1"])
def test_explain_reads_an_older_cluster(tmp_path, capsys, mode):
    slices = h100_node("worker-1", 2, dynamic_mig=False) + h100_node("worker-2", 2,
                                                                       dynamic_mig=False)
    taken = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "busy", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "g", "exactly": {
                 "deviceClassName": "gpu.nvidia.com"}}]}},
             "status": {"allocation": {"devices": {"results": [
                 {"request": "g", "driver": "gpu.nvidia.com", "pool": "worker-1",
                  "device": "gpu-0"}]}}}}
    with FakeApiServer(resource_api=mode) as api:
        for obj in [*slices, *default_device_classes("gpu.nvidia.com"), taken,
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-1"}},
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-2"}}]:
            api.put(obj)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        code = main(["explain", str(write(tmp_path, TWO_GPUS)), "--kubeconfig", str(kubeconfig)])
        out = capsys.readouterr().out.splitlines()
        assert code == 0, out
        assert "      1 on 1 node  already allocated" in out
        assert out[-1] == ("ALLOCATABLE on node worker-2: gpu -> gpu-0, gpu -> gpu-1 "
                           "(fits on 1 of 2 nodes)")
        versions = {r.path.split("/")[3] for r in api.requests
                    if r.path.startswith("/apis/resource.k8s.io/")}
        assert versions == {mode}
