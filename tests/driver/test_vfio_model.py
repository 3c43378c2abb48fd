"""The vfio devices (pure): each full GPU published again as ``gpu-vfio-<minor>`` sharing
all of a counter set with it, so the scheduler never hands one GPU out as both — checked with
the Kubernetes 1.36 scheduler's own allocator (``dra-allocate``) and with ours."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudra.controller.slice_validation import ensure_valid
from gpudra.controller.slices import build_slices
from gpudra.driver import sim
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.inventory import NodeInventory, read_inventory, simulated_pcie_root
from gpudra.driver.mig_offer import EVERY, NOTHING
from gpudra.driver.nvml import open_nvml
from gpudra.driver.vfio_model import VfioOffer, device_minor, device_name
from gpudra.driver.vfio_sysfs import sysfs_bus_id
from gpudra.scheduling.allocator import Allocator

ROOT = Path(__file__).resolve().parents[2]
CLASSES = sorted((ROOT / "deploy" / "deviceclasses").glob("*.yaml"))
DRIVER = "gpu.nvidia.com"


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> NodeInventory:
    nvml = open_nvml(simulate="dgx-h100", sim_state=tmp_path_factory.mktemp("sim"))
    try:
        return read_inventory(nvml, pcie_root=simulated_pcie_root)
    finally:
        nvml.shutdown()
        sim.uninstall()


@pytest.fixture(autouse=True)
def _detach() -> Iterator[None]:
    yield
    sim.uninstall()


def offer(inventory: NodeInventory) -> VfioOffer:
    return VfioOffer({sysfs_bus_id(g.probe.pci_bus_id): 30 + g.probe.minor
                      for g in inventory.gpus})


def slices(inventory: NodeInventory, *, mig: bool) -> list[dict[str, Any]]:
    options = ModelOptions(mig=EVERY if mig else NOTHING, vfio=offer(inventory))
    built = build_slices(build_devices(inventory, options), driver=DRIVER, node_name="n")
    return list(json.loads(json.dumps(built)))


def devices(built: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in built for d in s["spec"].get("devices", [])}


def test_names_round_trip():
    assert device_name(3) == "gpu-vfio-3" and device_minor("gpu-vfio-3") == 3
    assert device_minor("gpu-3") is None and device_minor("gpu-vfio-x") is None


@pytest.mark.parametrize("mig", [False, True], ids=["full-gpus", "dynamic-mig"])
def test_every_full_gpu_has_a_vfio_twin_on_the_same_counter(h100, mig):
    built = slices(h100, mig=mig)
    ensure_valid(built)
    found = devices(built)
    for gpu in h100.gpus:
        minor = gpu.probe.minor
        full, vfio = found[f"gpu-{minor}"], found[f"gpu-vfio-{minor}"]
        assert vfio["attributes"]["type"] == {"string": "vfio"}
        assert vfio["attributes"]["iommuGroup"] == {"int": 30 + minor}
        assert vfio["attributes"]["uuid"] == full["attributes"]["uuid"]
        assert vfio["consumesCounters"] == full["consumesCounters"]
        assert vfio["capacity"] == {"addressableMemory": full["capacity"]["memory"]}
    counter_sets = [c for s in built for c in s["spec"].get("sharedCounters", [])]
    assert len(counter_sets) == len(h100.gpus)  # one per GPU, never a second one


def test_without_an_iommu_group_no_vfio_device_and_no_counter(h100):
    options = ModelOptions(mig=NOTHING, vfio=VfioOffer())
    built = build_devices(h100, options)
    assert not [d for d in built.devices if d.type == "vfio"]
    assert built.counter_sets == ()  # the default layout is untouched


def test_the_vfio_device_follows_its_gpu_in_its_slice(h100):
    built = slices(h100, mig=True)
    [gpu0] = [s for s in built if s["metadata"]["name"].endswith("-gpu-0")]
    names = [d["name"] for d in gpu0["spec"]["devices"]]
    assert names[0] == "gpu-0" and names[-1] == "gpu-vfio-0"


# --- the scheduler's view ------------------------------------------------------------------

def claim(name: str, device_class: str, *, count: int = 1, uuid: str | None = None,
          allocated: list[str] | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if uuid is not None:
        request["selectors"] = [{"cel": {"expression":
                                         f'device.attributes["{DRIVER}"].uuid == "{uuid}"'}}]
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default",
                     "uid": f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": request}]}}}
    if allocated is not None:
        obj["status"] = {"allocation": {"devices": {"results": [
            {"request": "r", "driver": DRIVER, "pool": "n", "device": d} for d in allocated]}}}
    return obj


def _classes() -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text()) for path in CLASSES]


def _dra_allocate() -> str:
    given = os.environ.get("DRA_ALLOCATE")
    path = Path(given) if given else ROOT.parent / "shared" / "tools" / "dra-allocate" / \
        "dra-allocate"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"dra-allocate not found at {path} (set $DRA_ALLOCATE to the binary)")
    return str(path)


def _cases(h100: NodeInventory) -> list[tuple[str, bool, list[dict[str, Any]], str]]:
    gpu0 = next(g.probe.uuid for g in h100.gpus if g.probe.minor == 0)
    return [
        ("gpu taken as vfio: not as gpu", False, [
            claim("vm", "vfio.gpu.nvidia.com", allocated=["gpu-vfio-0"]),
            claim("pod", "gpu.nvidia.com", uuid=gpu0)], "unschedulable"),
        ("gpu taken as gpu: not as vfio", False, [
            claim("pod", "gpu.nvidia.com", allocated=["gpu-0"]),
            claim("vm", "vfio.gpu.nvidia.com", uuid=gpu0)], "unschedulable"),
        ("another gpu is free", False, [
            claim("vm", "vfio.gpu.nvidia.com", allocated=["gpu-vfio-0"]),
            claim("pod", "gpu.nvidia.com", count=7)], "allocated"),
        ("one pod: 8 as vfio and 1 as gpu do not fit 8 GPUs", False, [
            claim("vm", "vfio.gpu.nvidia.com", count=8),
            claim("pod", "gpu.nvidia.com", count=1)], "unschedulable"),
        ("one pod: 7 as vfio and 1 as gpu fit", False, [
            claim("vm", "vfio.gpu.nvidia.com", count=7),
            claim("pod", "gpu.nvidia.com", count=1)], "allocated"),
        ("a MIG device excludes passthrough of its GPU", True, [
            claim("mig", "mig.nvidia.com", allocated=["gpu-0-mig-1g10gb-19-6"]),
            claim("vm", "vfio.gpu.nvidia.com", uuid=gpu0)], "unschedulable"),
        ("a passed-through GPU offers no MIG device", True, [
            claim("vm", "vfio.gpu.nvidia.com", allocated=["gpu-vfio-0"]),
            claim("mig", "mig.nvidia.com", count=1, uuid=None)], "allocated"),
    ]


def test_the_real_scheduler_never_hands_a_gpu_out_twice(h100, tmp_path):
    binary = _dra_allocate()
    for what, mig, claims, expected in _cases(h100):
        built = slices(h100, mig=mig)
        cluster = tmp_path / "cluster.json"
        cluster.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                       "items": [*built, *claims]}))
        done = subprocess.run([binary, "-node", "n", *map(str, CLASSES), str(cluster)],
                              capture_output=True, text=True, check=False, timeout=120)
        report = json.loads(done.stdout)
        assert report["outcome"] == expected, (what, report)
        if what == "a passed-through GPU offers no MIG device":
            [result] = report["results"]["default/mig"]["devices"]["results"]
            assert not result["device"].startswith("gpu-0-"), result


def test_our_allocator_agrees(h100):
    for what, mig, claims, expected in _cases(h100):
        taken = [c for c in claims if "status" in c]
        pending = [c for c in claims if "status" not in c]
        allocator = Allocator(slices(h100, mig=mig), _classes(), taken)
        outcome = allocator.allocate(pending, "n")
        assert outcome.allocatable is (expected == "allocated"), what
