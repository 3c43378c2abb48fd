"""The simulated hardware catalogue: every node enumerates as documented, data is coherent."""

from __future__ import annotations

import math
from pathlib import Path

import pynvml
import pytest
import yaml

from gpudra.driver import sim
from gpudra.driver.sim import codes, profiles
from gpudra.driver.sim.library import symbols

MIB = 1024 * 1024

# (GPU count, product name, MiB, bus ids, NUMA nodes) as the shared hardware facts give them.
A100_BUS = ["07", "0F", "47", "4E", "87", "90", "B7", "BD"]
A100_NUMA = [3, 3, 1, 1, 7, 7, 5, 5]
EXPECTED_NODES = {
    "dgx-a100": ("NVIDIA A100-SXM4-40GB", 40960, A100_BUS, A100_NUMA),
    "dgx-a100-static-mig": ("NVIDIA A100-SXM4-40GB", 40960, A100_BUS, A100_NUMA),
    "dgx-h100": ("NVIDIA H100 80GB HBM3", 81559,
                 ["1B", "43", "52", "61", "9D", "C3", "D1", "DF"], [0, 0, 0, 0, 1, 1, 1, 1]),
    "hgx-h200": ("NVIDIA H200", 143771,
                 ["0A", "18", "3B", "44", "87", "90", "B9", "C2"], [0, 0, 0, 0, 1, 1, 1, 1]),
    "h100-nvl-x2": ("NVIDIA H100 NVL", 95830, ["41", "61"], [0, 0]),
    "a30-x4": ("NVIDIA A30", 24576, ["17", "65", "CA", "E3"], [0, 0, 1, 1]),
    "l4-x4": ("NVIDIA L4", 23034, ["00"] * 4, [0, 0, 0, 0]),
    "t4-x1": ("Tesla T4", 15360, ["00"], [0]),
    "gb200-nvl72": ("NVIDIA GB200", 189471, ["01", "02", "41", "42"], [0, 0, 1, 1]),
    "gb200-nvl72-rack2": ("NVIDIA GB200", 189471, ["01", "02", "41", "42"], [0, 0, 1, 1]),
}
EXPECTED_DRIVERS = {
    "dgx-h100": ("580.126.20", 13000),
    "hgx-h200": ("570.158.01", 12080),
    "h100-nvl-x2": ("560.35.03", 12060),
    "dgx-a100": ("580.95.05", 13000),
}


def test_catalogue_lists_every_node_and_model():
    assert set(sim.node_profiles()) == set(EXPECTED_NODES)
    assert sim.gpu_models() == sorted([
        "A100-SXM4-40GB", "A100-SXM4-80GB", "A30-24GB", "H100-SXM5-80GB", "H100-NVL-94GB",
        "H200-SXM5-141GB", "L4", "T4", "GB200"])


@pytest.mark.parametrize("profile", sorted(EXPECTED_NODES))
def test_node_enumerates_as_documented(simulate, profile):
    name, mib, buses, numa = EXPECTED_NODES[profile]
    simulate(profile)
    assert pynvml.nvmlDeviceGetCount() == len(buses)
    uuids = set()
    for index, (bus, node) in enumerate(zip(buses, numa, strict=True)):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        assert pynvml.nvmlDeviceGetName(handle) == name
        assert pynvml.nvmlDeviceGetMemoryInfo(handle).total == mib * MIB
        pci = pynvml.nvmlDeviceGetPciInfo(handle)
        assert pci.busId.split(":")[1] == bus
        assert pci.busId.startswith("00000000:")
        assert pynvml.nvmlDeviceGetNumaNodeId(handle) == node
        assert pynvml.nvmlDeviceGetIndex(handle) == index
        assert pynvml.nvmlDeviceGetMinorNumber(handle) == index
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        assert len(uuid) == 40 and uuid.startswith("GPU-")
        uuids.add(uuid)
        assert pynvml.nvmlDeviceGetHandleByUUID(uuid).contents is not None
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == index
        by_bus = pynvml.nvmlDeviceGetHandleByPciBusId(pci.busId)
        assert pynvml.nvmlDeviceGetIndex(by_bus) == index
    assert len(uuids) == len(buses)


@pytest.mark.parametrize("profile", sorted(EXPECTED_DRIVERS))
def test_versions(simulate, profile):
    driver, cuda = EXPECTED_DRIVERS[profile]
    simulate(profile)
    assert pynvml.nvmlSystemGetDriverVersion() == driver
    assert pynvml.nvmlSystemGetCudaDriverVersion() == cuda
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == cuda
    assert pynvml.nvmlSystemGetNVMLVersion() == f"{cuda // 1000}.{driver}"


def test_uuids_are_deterministic_per_profile_and_index(simulate, tmp_path):
    simulate("dgx-h100", tmp_path / "a")
    first = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(3))
    simulate("dgx-h100", tmp_path / "b")
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(3)) == first
    simulate("hgx-h200", tmp_path / "c")
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(3)) != first


@pytest.mark.parametrize(("profile", "arch", "cc", "brand", "sms"), [
    ("dgx-a100", pynvml.NVML_DEVICE_ARCH_AMPERE, (8, 0), pynvml.NVML_BRAND_NVIDIA, 108),
    ("a30-x4", pynvml.NVML_DEVICE_ARCH_AMPERE, (8, 0), pynvml.NVML_BRAND_NVIDIA, 56),
    ("dgx-h100", pynvml.NVML_DEVICE_ARCH_HOPPER, (9, 0), pynvml.NVML_BRAND_NVIDIA, 132),
    ("l4-x4", pynvml.NVML_DEVICE_ARCH_ADA, (8, 9), pynvml.NVML_BRAND_NVIDIA, 58),
    ("t4-x1", pynvml.NVML_DEVICE_ARCH_TURING, (7, 5), pynvml.NVML_BRAND_TESLA, 40),
])
def test_model_identity(simulate, profile, arch, cc, brand, sms):
    simulate(profile)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetArchitecture(handle) == arch
    assert pynvml.nvmlDeviceGetCudaComputeCapability(handle) == cc
    assert pynvml.nvmlDeviceGetBrand(handle) == brand
    assert pynvml.nvmlDeviceGetAttributes(handle).multiprocessorCount == sms


def _go_nvlib_name(slices: int, memory_mib: int, total_mib: int, suffix: str) -> str:
    """go-nvlib's MIG profile name rule (README 3.2), to check the data against it."""
    total = total_mib * MIB
    # Go's math.Round: halves away from zero (Python's round() would give 3g.70gb on H200)
    gb = math.floor(math.ceil(memory_mib * MIB / total * 8) / 8 * math.ceil(total / 1024**3) + 0.5)
    return f"{slices}g.{gb}gb{suffix}"


@pytest.mark.parametrize("key", sim.gpu_models())
def test_profile_names_follow_the_go_nvlib_rule(key):
    model = profiles.gpu_model(key)
    for p in model.mig.profiles if model.mig else ():
        suffix = "+me" if p.index in (7, 8) else ""
        assert p.name == _go_nvlib_name(p.slices, p.memory_mib, model.memory_mib, suffix)


@pytest.mark.parametrize("key", sim.gpu_models())
def test_compute_instance_tables_are_coherent(key):
    from gpudra.driver.sim.mig import compute_instance_starts

    model = profiles.gpu_model(key)
    for gi in model.mig.profiles if model.mig else ():
        full = [ci for ci in gi.compute_profiles if ci.slices == gi.slices]
        assert len(full) == 1, f"{gi.name} needs exactly one full-size CI profile"
        for ci in gi.compute_profiles:
            # the derived placement rule must allow exactly the documented instance count
            assert len(compute_instance_starts(gi.slices, ci.slices)) == ci.max_instances
            assert gi.ci_multiprocessors(ci) <= gi.multiprocessors


def test_hopper_gpu_instance_facts_from_real_output():
    """Spot values straight from real `nvidia-smi mig -lgip` rows (README section 4)."""
    h100 = profiles.gpu_model("H100-SXM5-80GB").mig
    assert h100 is not None
    assert [(p.id, p.multiprocessors) for p in h100.profiles] == [
        (19, 16), (20, 16), (15, 26), (14, 32), (9, 60), (5, 64), (0, 132)]
    h200 = profiles.gpu_model("H200-SXM5-141GB").mig
    assert h200 is not None and h200.by_id(9) is not None
    assert h200.by_id(9).memory_mib == 71168  # 3g.71gb
    assert profiles.gpu_model("H100-SXM5-80GB").mig.by_id(19).create_order == (6, 4, 5, 0, 1, 2, 3)


def test_nvml_constants_match_pynvml_and_the_data_file():
    data = profiles.nvml_data()
    for name, value in data["return_codes"].items():
        assert getattr(pynvml, name) == value
        assert codes.Return[name.removeprefix("NVML_")] == value
    assert len(codes.Return) == len(data["return_codes"])
    assert codes.GPU_INSTANCE_PROFILE_COUNT == pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    assert codes.COMPUTE_INSTANCE_PROFILE_COUNT == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT
    assert pynvml.nvmlEventTypeXidCriticalError == codes.EVENT_XID_CRITICAL
    assert codes.BRAND == {"TESLA": pynvml.NVML_BRAND_TESLA, "NVIDIA": pynvml.NVML_BRAND_NVIDIA}
    assert codes.DEVICE_ARCH["HOPPER"] == pynvml.NVML_DEVICE_ARCH_HOPPER
    assert data["device_arch"] == codes.DEVICE_ARCH


def test_every_symbol_exists_in_pynvml_or_nvml():
    """Each simulated symbol is one pynvml looks up (guards against typos in names)."""
    source = Path(pynvml.__file__).read_text()
    missing = [s for s in symbols() if f'"{s}"' not in source]
    assert missing == []


def test_data_files_are_plain_yaml():
    from importlib import resources

    for name in ("gpus.yaml", "nodes.yaml"):
        text = resources.files("gpudra.driver.sim").joinpath("data", name).read_text()
        assert yaml.safe_load(text)["schema_version"] == 1


def test_unknown_profile_is_a_clear_error(sim_state):
    with pytest.raises(ValueError, match="unknown node profile 'dgx-z9'"):
        sim.install("dgx-z9", sim_state)
