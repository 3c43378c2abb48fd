"""Every example validates and allocates on the simulated node its README names, and every
folder is ``kubectl apply -f folder/``-ready: its claims come with the pods that use them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudra.cli.main import main
from gpudra.driver import sim

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# (file, node profile, the (request, device) pairs the reference allocator must choose)
CASES = [
    ("single-gpu/gpu.yaml", "dgx-h100", [("gpu", "gpu-0")]),
    ("gpu-by-product/claim.yaml", "dgx-h100", [("gpu", "gpu-0")]),
    ("gpu-by-memory/claim.yaml", "hgx-h200", [("gpu", "gpu-0")]),
    ("gpu-by-compute-capability/claim.yaml", "dgx-h100", [("gpu", "gpu-0")]),
    ("two-gpus-nvlink/claim.yaml", "h100-nvl-x2", [("gpus", "gpu-0"), ("gpus", "gpu-1")]),
    ("mig-1g-dynamic/claim.yaml", "dgx-h100", [("mig", "gpu-0-mig-1g10gb-19-6")]),
    ("two-mig-same-gpu/claim.yaml", "dgx-a100",
     [("medium", "gpu-0-mig-2g10gb-14-4"), ("small", "gpu-0-mig-1g5gb-19-6")]),
    ("first-available/claim.yaml", "dgx-h100", [("gpu/h100", "gpu-0")]),
    ("first-available/claim.yaml", "dgx-a100", [("gpu/a100", "gpu-0")]),
    ("time-sliced-shared/shared.yaml", "dgx-h100", [("gpu", "gpu-0")]),
    ("mps/claim.yaml", "dgx-h100", [("gpu", "gpu-0")]),
    ("exclusive-compute/claim.yaml", "dgx-h100", [("gpu", "gpu-0")]),
    ("admin-access/monitor.yaml", "l4-x4", [("gpus", f"gpu-{i}") for i in range(4)]),
    ("fractional-gpu/claims.yaml", "dgx-h100", [("gpu", "gpu-0-shared")]),
    ("time-slice-shares/claim.yaml", "dgx-h100", [("gpu", "gpu-0-shared")]),
]
# Extra flags for the simulated node, per folder (its README says the same).
FLAGS = {
    "fractional-gpu": ["--shareable-gpus", "all"],
    "time-slice-shares": ["--shareable-gpus", "all"],
}
# Folders whose node offers MIG devices made on demand (off by default: README).
DYNAMIC_MIG = {"mig-1g-dynamic": ["--dynamic-mig-gpus", "all"],
               # an A100 with MIG mode off: switching it needs a reset, so an admin opts in
               "two-mig-same-gpu": ["--dynamic-mig-gpus", "all",
                                    "--allow-mig-mode-change", "all"]}
# Examples that must NOT fit on a node, and the reason explain must give.
MISFITS = [
    ("gpu-by-product/claim.yaml", "dgx-a100", "selector #0 is false"),
    ("gpu-by-memory/claim.yaml", "dgx-a100", "selector #0 is false"),
    ("two-gpus-nvlink/claim.yaml", "l4-x4", "nvlinkDomain: the device has no such attribute"),
]


# The one folder without a claim: its pod asks for `nvidia.com/gpu: 1` and the scheduler
# makes the claim (the DeviceClass's extendedResourceName).
EXTENDED_RESOURCE = "extended-resource"
# The one folder whose workload is a KubeVirt VM, not a Pod, on a node with the
# PassthroughSupport gate: tests/integration/test_vfio.py runs it through the real daemon.
VFIO_PASSTHROUGH = "vfio-passthrough"
# The one folder whose channel claim template the controller makes (from the ComputeDomain)
# and whose pods come from a Job: tests/integration/test_compute_domain_e2e.py runs it
# through the real daemons and the controller.
COMPUTE_DOMAIN = "compute-domain"


@pytest.fixture(autouse=True)
def _detach() -> None:
    yield
    sim.uninstall()


def explain_json(capsys, path: str, profile: str) -> dict:
    code = main(["explain", str(EXAMPLES / path), "--simulate", profile, "-o", "json",
                 *FLAGS.get(path.split("/", maxsplit=1)[0], []),
                 *DYNAMIC_MIG.get(path.split("/", maxsplit=1)[0], [])])
    out = json.loads(capsys.readouterr().out)
    if "items" in out:  # several pods in one file (they share the claim): take the first
        out = out["items"][0]
    out["exit"] = code
    return out


def folder_objects(folder: Path) -> list[dict[str, Any]]:
    """Every object ``kubectl apply -f folder/`` would create."""
    return [doc for path in sorted(folder.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def _folders() -> list[str]:
    return sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir())


def test_every_example_validates(capsys):
    files = sorted(str(p) for p in EXAMPLES.glob("*/*.yaml"))
    assert len(files) >= 13
    assert main(["validate", *files]) == 0, capsys.readouterr().out


def test_every_example_folder_has_a_readme_naming_its_profile():
    for folder in sorted(p for p in EXAMPLES.iterdir() if p.is_dir()):
        readme = (folder / "README.md").read_text()
        assert "Simulated node" in readme, folder.name
        assert any(profile in readme for profile in sim.node_profiles()), folder.name


@pytest.mark.parametrize(("path", "profile", "expected"), CASES,
                         ids=[f"{c[0].split('/')[0]}@{c[1]}" for c in CASES])
def test_example_allocates_the_expected_devices(path, profile, expected, capsys):
    out = explain_json(capsys, path, profile)
    assert out["exit"] == 0, out["verdict"]
    chosen = [(r["request"], r["device"]) for result in out["results"]
              for r in result["devices"]["results"]]
    assert chosen == expected


def test_example_configs_are_carried_into_the_allocation(capsys):
    out = explain_json(capsys, "mps/claim.yaml", "dgx-h100")
    (config,) = out["results"][0]["devices"]["config"]
    assert config["source"] == "FromClaim"
    assert config["opaque"]["parameters"]["sharing"]["strategy"] == "MPS"


@pytest.mark.parametrize(("path", "profile", "reason"), MISFITS,
                         ids=[f"{m[0].split('/')[0]}@{m[1]}" for m in MISFITS])
def test_example_that_does_not_fit_says_why(path, profile, reason, capsys):
    out = explain_json(capsys, path, profile)
    assert out["exit"] == 1
    assert not out["allocatable"]
    assert reason in json.dumps(out), out["verdict"]


# --- kubectl apply -f folder/ -----------------------------------------------------------

@pytest.mark.parametrize("folder", sorted(set(_folders()) - {VFIO_PASSTHROUGH, COMPUTE_DOMAIN}))
def test_every_folder_has_pods_that_use_its_claims(folder):
    objects = folder_objects(EXAMPLES / folder)
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert pods, f"{folder}: no Pod to run"
    if folder == EXTENDED_RESOURCE:
        (device_class,) = [o for o in objects if o["kind"] == "DeviceClass"]
        resource = device_class["spec"]["extendedResourceName"]
        assert all(c["resources"]["limits"][resource] for p in pods
                   for c in p["spec"]["containers"])
        return
    claims = {o["metadata"]["name"]: o["spec"] for o in objects
              if o["kind"] == "ResourceClaim"}
    claims.update({o["metadata"]["name"]: o["spec"]["spec"] for o in objects
                   if o["kind"] == "ResourceClaimTemplate"})
    defined = {o["metadata"]["name"] for o in objects
               if o["kind"] in ("ResourceClaim", "ResourceClaimTemplate")}
    used = set()
    for pod in pods:
        entries = {e["name"]: e.get("resourceClaimName") or e.get("resourceClaimTemplateName")
                   for e in pod["spec"]["resourceClaims"]}
        assert set(entries.values()) <= defined, f"{folder}: {pod['metadata']['name']}"
        used.update(entries.values())
        for container in pod["spec"]["containers"]:
            assert container["image"].startswith("nvcr.io/nvidia/")
            for ref in container["resources"]["claims"]:
                # what the apiserver (the name) and the kubelet (the request) check
                assert ref["name"] in entries, f"{folder}: {container['name']}: {ref}"
                if "request" in ref:
                    requests = claims[entries[ref["name"]]]["devices"]["requests"]
                    assert ref["request"] in {r["name"] for r in requests}
    assert used == defined, f"{folder}: claims no pod uses: {defined - used}"


@pytest.mark.parametrize(("path", "profile", "expected"), CASES,
                         ids=[f"{c[0].split('/')[0]}@{c[1]}" for c in CASES])
def test_every_pod_of_the_folder_gets_the_expected_devices(path, profile, expected, capsys):
    folder = path.split("/")[0]
    code = main(["explain", str(EXAMPLES / folder), "--simulate", profile, "-o", "json",
                 *FLAGS.get(folder, []), *DYNAMIC_MIG.get(folder, [])])
    out = json.loads(capsys.readouterr().out)
    items = out.get("items", [out])
    assert code == 0, [item["verdict"] for item in items]
    pods = [p for p in folder_objects(EXAMPLES / folder) if p["kind"] == "Pod"]
    # claims a pod uses are explained with the pod, not again on their own
    assert [item["subject"] for item in items] == [
        f"Pod {p['metadata'].get('namespace') + '/' if p['metadata'].get('namespace') else ''}"
        f"{p['metadata']['name']}" for p in pods]
    for item in items:
        chosen = [(r["request"], r["device"]) for result in item["results"]
                  for r in result["devices"]["results"]]
        assert chosen == expected, item["subject"]


def test_every_case_folder_is_covered():
    covered = {path.split("/")[0] for path, _, _ in CASES}
    assert covered == set(_folders()) - {EXTENDED_RESOURCE, VFIO_PASSTHROUGH, COMPUTE_DOMAIN}


@pytest.mark.parametrize("folder", sorted(FLAGS))
def test_the_shares_of_a_folder_fit_on_one_gpu_together(folder, tmp_path):
    """Every pod's claim allocated after the others' (as the scheduler would, one by one):
    all land on gpu-0-shared, each with its own shareID, and the consumed amounts add up
    within the H100."""
    from gpudra.controller.slices import build_slices
    from gpudra.driver.device_model import ModelOptions, build_devices
    from gpudra.driver.gpu_shares import ALL
    from gpudra.driver.inventory import read_inventory, simulated_pcie_root
    from gpudra.driver.nvml import open_nvml
    from gpudra.scheduling.allocator import Allocator

    objects = folder_objects(EXAMPLES / folder)
    templates = {o["metadata"]["name"]: o["spec"] for o in objects
                 if o["kind"] == "ResourceClaimTemplate"}
    classes = [o for o in objects if o["kind"] == "DeviceClass"]
    nvml = open_nvml(simulate="dgx-h100", sim_state=tmp_path)
    try:
        inventory = read_inventory(nvml, pcie_root=simulated_pcie_root)
    finally:
        nvml.shutdown()
    slices = build_slices(build_devices(inventory, ModelOptions(shareable=ALL)),
                          driver="gpu.nvidia.com", node_name="node-a")
    taken: list[dict[str, Any]] = []
    memory = 0
    for pod in (o for o in objects if o["kind"] == "Pod"):
        (entry,) = pod["spec"]["resourceClaims"]
        claim = {"metadata": {"name": pod["metadata"]["name"], "namespace": "default"},
                 **templates[entry["resourceClaimTemplateName"]]}
        allocation = Allocator(slices, classes, taken).allocate(claim, "node-a")
        assert allocation.allocatable, allocation.blocking
        (result,) = allocation.results[0]["devices"]["results"]
        assert result["device"] == "gpu-0-shared" and result["shareID"]
        memory += int(result["consumedCapacity"]["memory"].removesuffix("Gi"))
        taken += allocation.results
    ids = [r["shareID"] for a in taken for r in a["devices"]["results"]]
    assert len(set(ids)) == len(ids) >= 2
    assert memory * 1024 <= 81559  # MiB of an H100 80GB
