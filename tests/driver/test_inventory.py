"""Inventory through the real NVML seam on simulated nodes: attribute sets, MIG, slices."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.controller.slice_validation import ensure_valid
from gpudra.controller.slices import build_slices
from gpudra.driver import sim
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.devices import NodeDevices, Version
from gpudra.driver.inventory import NodeInventory, read_inventory, simulated_pcie_root
from gpudra.driver.nvml import open_nvml

# Pinned on purpose: renaming or dropping an attribute breaks users' CEL, so it must break
# a test first. Names and types follow NVIDIA's driver, plus numaNode and nvlinkDomain (and
# Kubernetes' standard resource.kubernetes.io/numaNode beside ours).
# addressingMode is NVIDIA's too, present where NVML answers (the simulated H100s).
FULL_GPU_ATTRIBUTES = {
    "type": str, "uuid": str, "productName": str, "brand": str, "architecture": str,
    "cudaComputeCapability": Version, "driverVersion": Version, "cudaDriverVersion": Version,
    "resource.kubernetes.io/pciBusID": str, "resource.kubernetes.io/pcieRoot": str,
    "numaNode": int, "nvlinkDomain": str, "addressingMode": str,
    "resource.kubernetes.io/numaNode": int,
}
DYNAMIC_MIG_ATTRIBUTES = {
    "type": str, "parentUUID": str, "profile": str, "productName": str, "brand": str,
    "architecture": str, "cudaComputeCapability": Version, "driverVersion": Version,
    "cudaDriverVersion": Version, "resource.kubernetes.io/pciBusID": str,
    "resource.kubernetes.io/pcieRoot": str, "numaNode": int, "addressingMode": str,
    "resource.kubernetes.io/numaNode": int,
}
STATIC_MIG_ATTRIBUTES = {**DYNAMIC_MIG_ATTRIBUTES, "uuid": str}


def pre_hopper(attributes: dict[str, type]) -> dict[str, type]:
    """The simulated pre-Hopper GPUs' NVML says NOT_SUPPORTED for the addressing mode."""
    return {k: v for k, v in attributes.items() if k != "addressingMode"}


MIG_CAPACITIES = {"multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines",
                  "ofaEngines", "memory"}


def inventory(profile: str, state: Path) -> NodeInventory:
    nvml = open_nvml(simulate=profile, sim_state=state)
    try:
        return read_inventory(nvml, pcie_root=simulated_pcie_root)
    finally:
        nvml.shutdown()


@pytest.fixture(autouse=True)
def _detach_simulator() -> Iterator[None]:
    yield
    sim.uninstall()


def devices_of(profile: str, state: Path, **options: bool) -> NodeDevices:
    return build_devices(inventory(profile, state), ModelOptions(**options))


def assert_attributes(attrs, expected):
    assert set(attrs) == set(expected)
    for name, kind in expected.items():
        value = attrs[name]
        assert type(value) is kind, (name, value)


def test_dgx_h100_full_gpus_carry_every_attribute(sim_state):
    devices = devices_of("dgx-h100", sim_state)
    gpus = [d for d in devices.devices if d.type == "gpu"]
    assert [d.name for d in gpus] == [f"gpu-{i}" for i in range(8)]
    for gpu in gpus:
        assert_attributes(gpu.attributes, FULL_GPU_ATTRIBUTES)
        assert gpu.attributes["productName"] == "NVIDIA H100 80GB HBM3"
        assert gpu.attributes["architecture"] == "Hopper"
        assert gpu.attributes["cudaComputeCapability"] == Version("9.0.0")
        assert gpu.attributes["driverVersion"] == Version("580.126.20")
        assert gpu.capacity["memory"] == 81559 << 20
    assert [g.attributes["numaNode"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.attributes["resource.kubernetes.io/numaNode"] for g in gpus] == [
        0, 0, 0, 0, 1, 1, 1, 1]
    assert gpus[0].attributes["resource.kubernetes.io/pciBusID"] == "0000:1b:00.0"
    # NVSwitch: all eight GPUs share one NVLink domain
    assert len({g.attributes["nvlinkDomain"] for g in gpus}) == 1


def test_addressing_mode_only_where_nvml_answers(sim_state):
    """As NVIDIA's driver: HMM/ATS/None when NVML knows it, no attribute when it says
    NOT_SUPPORTED (the simulated A100s); MIG devices carry their parent's."""
    hopper = devices_of("dgx-h100", sim_state).devices
    assert {d.attributes["addressingMode"] for d in hopper} == {"HMM"}
    sim.uninstall()
    ampere = devices_of("dgx-a100", sim_state / "a100").devices
    assert all("addressingMode" not in d.attributes for d in ampere)


def test_dgx_h100_dynamic_mig_devices_and_counters(sim_state):
    devices = devices_of("dgx-h100", sim_state)
    gpu0 = [d for d in devices.devices if d.group == "gpu-0"]
    # full GPU + 7 (1g) + 7 (1g+me) + 4 (1g.20gb) + 3 (2g) + 2 (3g) + 1 (4g) + 1 (7g)
    assert len(gpu0) == 26
    assert len(devices.devices) == 8 * 26
    assert len(devices.counter_sets) == 8
    counters = {c.name: c for c in devices.counter_sets}["gpu-0-counter-set"].counters
    for device in gpu0[1:]:
        assert_attributes(device.attributes, DYNAMIC_MIG_ATTRIBUTES)
        assert set(device.capacity) == MIG_CAPACITIES
        (used,) = device.consumes_counters
        assert used.counter_set == "gpu-0-counter-set"
        assert set(used.counters) <= set(counters)
    by_name = {d.name: d for d in gpu0}
    three_g = by_name["gpu-0-mig-3g40gb-9-4"]
    assert three_g.attributes["profile"] == "3g.40gb"
    assert three_g.capacity["memory"] == 40448 << 20
    assert three_g.capacity["multiprocessors"] == 60
    slices_used = {k for k in three_g.consumes_counters[0].counters if k.startswith("memory-slice")}
    assert slices_used == {"memory-slice-4", "memory-slice-5", "memory-slice-6", "memory-slice-7"}
    # the full GPU consumes every counter, so it excludes every partition
    assert dict(by_name["gpu-0"].consumes_counters[0].counters) == dict(counters)


def test_without_dynamic_mig_only_full_gpus_are_published(sim_state):
    devices = devices_of("dgx-h100", sim_state, dynamic_mig=False)
    assert [d.name for d in devices.devices] == [f"gpu-{i}" for i in range(8)]
    assert devices.counter_sets == ()
    assert all(not d.consumes_counters for d in devices.devices)


def test_static_mig_is_published_as_it_is(sim_state):
    devices = devices_of("dgx-a100-static-mig", sim_state)
    gpu1 = [d for d in devices.devices if d.group == "gpu-1"]
    assert all(d.type == "mig" for d in gpu1)
    assert all("uuid" in d.attributes for d in gpu1)
    for device in gpu1:
        assert_attributes(device.attributes, pre_hopper(STATIC_MIG_ATTRIBUTES))
        assert str(device.attributes["uuid"]).startswith("MIG-")
        slices = {k for k in device.capacity if k.startswith("memorySlice")}
        assert len(slices) == 1
        assert not device.consumes_counters
    # a GPU with MIG disabled stays dynamic
    assert any(d.name == "gpu-2" and d.type == "gpu" for d in devices.devices)


@pytest.mark.parametrize("profile", ["l4-x4", "t4-x1"])
def test_gpus_without_mig_are_plain(profile, sim_state):
    devices = devices_of(profile, sim_state)
    assert devices.counter_sets == ()
    for device in devices.devices:
        assert device.type == "gpu"
        # no NVLink on these nodes: the attribute is absent rather than empty
        expected = {k: v for k, v in FULL_GPU_ATTRIBUTES.items() if k != "nvlinkDomain"}
        assert_attributes(device.attributes, pre_hopper(expected))


def test_nvlink_bridge_pairs_form_their_own_domain(sim_state):
    devices = devices_of("h100-nvl-x2", sim_state)
    gpus = [d for d in devices.devices if d.type == "gpu"]
    assert len(gpus) == 2
    assert gpus[0].attributes["nvlinkDomain"] == gpus[1].attributes["nvlinkDomain"]


@pytest.mark.parametrize("profile", sim.node_profiles())
@pytest.mark.parametrize("dynamic_mig", [True, False])
def test_every_profile_publishes_valid_slices(profile, dynamic_mig, sim_state):
    devices = devices_of(profile, sim_state, dynamic_mig=dynamic_mig)
    slices = build_slices(devices, driver="gpu.nvidia.com", node_name="node-a")
    ensure_valid(slices)
    published = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert published == [d.name for d in devices.devices]
