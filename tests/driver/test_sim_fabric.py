"""The simulated fabric calls through the real pynvml wrappers: the v1 struct, the V call's
v2 and v3 structs, NOT_SUPPORTED off a multi-node NVLink rack, per-node changes."""

from __future__ import annotations

import ctypes
import uuid
from pathlib import Path

import pynvml
import pytest

from gpudra.driver import sim
from gpudra.driver.nvml import Nvml
from gpudra.driver.sim.api_fabric import set_fabric

RACK1 = uuid.UUID("9c6f5af3-53bf-49b5-a436-b66766c413c3")


def test_v1_and_versioned_structs_answer_the_trays_clique(simulate) -> None:  # type: ignore[no-untyped-def]
    simulate("gb200-nvl72")
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    v1 = pynvml.c_nvmlGpuFabricInfo_t()
    pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(v1))
    assert bytes(v1.clusterUuid) == RACK1.bytes
    assert (v1.cliqueId, v1.state, v1.status) == (4026, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
                                                  pynvml.NVML_SUCCESS)
    for struct in (pynvml.c_nvmlGpuFabricInfo_v2_t(), pynvml.c_nvmlGpuFabricInfo_v3_t()):
        pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(struct))
        assert bytes(struct.clusterUuid) == RACK1.bytes and struct.cliqueId == 4026
    v3 = pynvml.c_nvmlGpuFabricInfo_v3_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(v3))
    assert v3.healthSummary == pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    bad = pynvml.c_nvmlGpuFabricInfo_v2_t()
    bad.version = 0x09000024
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(bad))


def test_no_fabric_off_the_rack_and_no_clique_before_registration(
        simulate, sim_state: Path) -> None:  # type: ignore[no-untyped-def]
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(pynvml.c_nvmlGpuFabricInfo_v2_t()))
    assert Nvml().fabric_info(pynvml.nvmlDeviceGetUUID(handle)) is None
    sim.uninstall()
    rack = sim_state.parent / "rack"
    simulate("gb200-nvl72", rack)
    set_fabric(rack, state="IN_PROGRESS")
    uuid0 = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    info = Nvml().fabric_info(uuid0)
    assert info is not None and not info.ready
    assert (info.state, info.clique_id, info.cluster_uuid) == (
        "InProgress", 0, "00000000-0000-0000-0000-000000000000")
    set_fabric(rack, state="COMPLETED", clique_id=7)
    info = Nvml().fabric_info(uuid0)
    assert info is not None and info.ready and info.clique_id == 7
    with pytest.raises(ValueError, match="fabric state"):
        set_fabric(rack, state="DONE")
    with pytest.raises(ValueError, match="unknown fabric fields"):
        set_fabric(rack, cliqueId=3)
    assert Nvml().fabric_info(uuid0).clique_id == 7  # type: ignore[union-attr]


def test_a_lost_gpu_answers_gpu_is_lost(simulate, sim_state: Path) -> None:  # type: ignore[no-untyped-def]
    simulate("gb200-nvl72")
    sim.SimControl(sim_state).set_gpu_lost(1, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetGpuFabricInfoV(pynvml.nvmlDeviceGetHandleByIndex(1),
                                           ctypes.byref(pynvml.c_nvmlGpuFabricInfo_v2_t()))
