"""``gpudra explain`` on ComputeDomains, in-process: the example folder on simulated GB200
trays (whose compute-domain pool is what ``gpudra compute-domain-node`` publishes there),
a channel claim, a tray whose fabric is not ready, a node without multi-node NVLink, and a
cluster (the API stand-in over HTTP) whose channels are all taken."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from gpudra.api import compute_domain as cd
from gpudra.cli.main import main
from gpudra.controller.slices import build_slices
from gpudra.driver import sim
from gpudra.driver.compute_domain_devices import build_devices
from gpudra.driver.nvml import FabricInfo
from gpudra.driver.sim.api_fabric import set_fabric
from gpudra.scheduling.explain import default_device_classes
from gpudra.scheduling.explain_compute_domain import device_classes
from gpudra.testing.fakeapi import FakeApiServer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "compute-domain"
DOMAIN_UID = "6b1f0f8e-3c1a-4b7e-9d2a-5e8f7a6b5c4d"

CHANNEL_CLAIM = f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: worker-channel
  namespace: default
spec:
  devices:
    requests:
    - name: channel
      exactly:
        deviceClassName: {cd.CHANNEL_DEVICE_CLASS}
    config:
    - requests: [channel]
      opaque:
        driver: {cd.DRIVER_NAME}
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: ComputeDomainChannelConfig
          domainID: {DOMAIN_UID}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "claim.yaml"
    path.write_text(text)
    return path


def test_the_example_fits_on_four_trays_and_waits_for_the_domains_daemons(capsys):
    code = main(["explain", str(EXAMPLE), "--simulate", "gb200-nvl72", "--nodes", "4"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0, out
    assert out[0] == "Job training: 4 nodes (gb200-nvl72-0 … gb200-nvl72-3)"
    assert "    chosen on gb200-nvl72-0: channel-0" in out
    assert out[-1] == (
        "ALLOCATABLE on node gb200-nvl72-0: gpus -> gpu-0, gpus -> gpu-1, gpus -> gpu-2, "
        "gpus -> gpu-3, channel -> channel-0 (fits on 4 of 4 nodes); then WAITS for "
        "ComputeDomainReady (the ComputeDomain's IMEX daemon on gb200-nvl72-0 Ready) before "
        "the pod binds")
    (hint,) = [line for line in out if line.startswith("  hint: ")]
    assert "(compute-domain.nvidia.com, published by gpudra compute-domain-node)" in hint


def test_a_channel_claim_on_simulated_trays_as_json(tmp_path, capsys):
    code = main(["explain", str(_write(tmp_path, CHANNEL_CLAIM)), "--simulate", "gb200-nvl72",
                 "--nodes", "2", "-o", "json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert document["allocatable"] and document["node"] == "gb200-nvl72-0"
    (result,) = document["results"][0]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (
        cd.DRIVER_NAME, "gb200-nvl72-0", "channel-0")
    assert "WAITS for ComputeDomainReady" in document["verdict"]
    assert any("binding conditions ComputeDomainReady" in h for h in document["hints"])


def test_the_domain_alone_explains_the_template_the_controller_makes(capsys):
    code = main(["explain", str(EXAMPLE / "computedomain.yaml"), "--simulate", "gb200-nvl72"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "ResourceClaimTemplate training-channel: 1 node (gb200-nvl72-0)"
    assert "WAITS for ComputeDomainReady" in out[-1]


def test_a_tray_whose_fabric_is_not_ready(tmp_path, capsys):
    state = tmp_path / "sim"
    sim.install("gb200-nvl72", state)  # the state directory, then its fabric
    sim.uninstall()
    set_fabric(state, state="IN_PROGRESS")
    code = main(["explain", str(EXAMPLE), "--simulate", "gb200-nvl72", "--sim-state",
                 str(state), "--nodes", "2"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[-1].startswith("NOT ALLOCATABLE: the node publishes no IMEX channels: its "
                              "NVLink fabric is not ready, or it is in no multi-node NVLink "
                              "clique")
    assert out[-1].endswith("(on all 2 nodes)")
    assert any(line.startswith("  hint: the allocator's own words: ") for line in out)


def test_a_node_without_multi_node_nvlink(capsys):
    code = main(["explain", str(EXAMPLE), "--simulate", "dgx-h100"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[-1] == (
        "NOT ALLOCATABLE: DeviceClass compute-domain-default-channel.nvidia.com does not "
        "exist: the chart installs it, and runs gpudra compute-domain-node, with "
        "computeDomains.enabled")


def _kubeconfig(path: Path, url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
    return path


def _holder(node: str, device: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{node}-{device}", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "channel", "exactly": {
                "deviceClassName": cd.CHANNEL_DEVICE_CLASS}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "channel", "driver": cd.DRIVER_NAME, "pool": node,
                 "device": device}]}}}}


def test_a_cluster_whose_trays_have_every_channel_taken(tmp_path, capsys):
    fabric = FabricInfo("9c6f5af3-53bf-49b5-a436-b66766c413c3", 4026, "Completed", 0)
    nodes = ["tray-0", "tray-1"]
    with FakeApiServer() as api:
        for node in nodes:
            api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
            for obj in build_slices(build_devices(fabric, channels=2), driver=cd.DRIVER_NAME,
                                    node_name=node):
                api.put(obj)
            for device in ("channel-0", "channel-1"):
                api.put(_holder(node, device))
        for obj in [*default_device_classes("gpu.nvidia.com"), *device_classes()]:
            api.put(obj)
        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", api.url)
        code = main(["explain", str(_write(tmp_path, CHANNEL_CLAIM)), "--kubeconfig",
                     str(kubeconfig)])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[-1] == ("NOT ALLOCATABLE: all 2 IMEX channels of the node are allocated to "
                       "other claims (--channels of gpudra compute-domain-node) (on all 2 "
                       "nodes)")


def test_a_bad_domain_is_a_usage_error_naming_it_and_the_field(tmp_path, capsys):
    bad = (EXAMPLE / "computedomain.yaml").read_text().replace("numNodes: 4", "numNodes: -4")
    code = main(["explain", str(_write(tmp_path, bad)), "--simulate", "gb200-nvl72"])
    err = capsys.readouterr().err
    assert code == 2
    assert "ComputeDomain default/training" in err and "numNodes" in err, err


def test_the_readme_shows_what_explain_prints(capsys):
    readme = (EXAMPLE / "README.md").read_text()
    command = "gpudra explain examples/compute-domain/ --simulate gb200-nvl72 --nodes 4"
    assert f"$ {command}\n" in readme
    argv = command.split()[1:]
    argv[1] = str(EXAMPLE)  # wherever the tests run from
    assert main(argv) == 0
    verdict = capsys.readouterr().out.splitlines()[-1]
    assert f"\n{verdict}\n" in readme
