"""Per-device calls through the real pynvml: compute mode, processes, NVLink, errors."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from gpudra.driver import sim

MIB = 1024 * 1024
EXCLUSIVE_PROCESS = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS


def test_compute_mode_round_trip(simulate):
    simulate("l4-x4")
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_DEFAULT
    pynvml.nvmlDeviceSetComputeMode(handle, EXCLUSIVE_PROCESS)
    assert pynvml.nvmlDeviceGetComputeMode(handle) == EXCLUSIVE_PROCESS
    assert pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(0)) == 0
    pynvml.nvmlDeviceSetComputeMode(handle, pynvml.NVML_COMPUTEMODE_PROHIBITED)
    assert pynvml.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_PROHIBITED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceSetComputeMode(handle, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceSetComputeMode(handle, 7)


def test_compute_mode_under_mig_targets_the_mig_device(simulate):
    simulate("dgx-a100-static-mig")
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceSetComputeMode(parent, EXCLUSIVE_PROCESS)
    first, second = (pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i) for i in (0, 1))
    pynvml.nvmlDeviceSetComputeMode(first, EXCLUSIVE_PROCESS)
    assert pynvml.nvmlDeviceGetComputeMode(first) == EXCLUSIVE_PROCESS
    assert pynvml.nvmlDeviceGetComputeMode(second) == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert pynvml.nvmlDeviceGetComputeMode(parent) == pynvml.NVML_COMPUTEMODE_DEFAULT


def test_running_processes_and_memory(simulate, sim_state):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(4)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    control = sim.SimControl(sim_state)
    control.add_process(4, 11, used_memory_mib=1024)
    control.add_process(4, 12, used_memory_mib=2048)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    unavailable = 0xFFFFFFFF
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [
        (11, 1024 * MIB, unavailable, unavailable), (12, 2048 * MIB, unavailable, unavailable)]
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    assert memory.used == 3072 * MIB and memory.free == memory.total - memory.used
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert (v2.total, v2.used, v2.reserved) == (81559 * MIB, 3072 * MIB, 0)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(handle, version=3 << 24 | 40)
    count = ctypes.c_uint(1)
    one = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    assert fn(handle, ctypes.byref(count), one) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    with pytest.raises(ValueError, match="already runs"):
        control.add_process(4, 11)
    control.remove_process(4, 11)
    with pytest.raises(ValueError, match="does not run"):
        control.remove_process(4, 11)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)] == [12]


def test_nvswitch_links(simulate):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    remotes = []
    for link in range(18):
        assert pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
        assert (pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
                == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
        remotes.append(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
    assert len(set(remotes)) == 4  # four NVSwitch chips
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(handle, 18)


def test_bridged_pair_links_to_its_peer(simulate):
    simulate("h100-nvl-x2")
    first, second = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    for me, peer in ((first, second), (second, first)):
        for link in range(12):
            assert pynvml.nvmlDeviceGetNvLinkState(me, link)
            assert (pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(me, link)
                    == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)
            remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(me, link)
            assert remote.busId == pynvml.nvmlDeviceGetPciInfo(peer).busId
            assert remote.pciDeviceId == 0x232110DE
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetNvLinkState(me, 12)


@pytest.mark.parametrize("profile", ["a30-x4", "l4-x4", "t4-x1"])
def test_no_nvlink_is_not_supported(simulate, profile):
    simulate(profile)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(handle, 0)


def test_lookups_that_find_nothing(simulate):
    simulate("dgx-a100")
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByPciBusId("00000000:99:00.0")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByPciBusId("not-a-bus-id")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(8)
    legacy = pynvml.nvmlDeviceGetHandleByPciBusId("0000:0f:00.0")
    assert pynvml.nvmlDeviceGetIndex(legacy) == 1
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(pynvml.c_nvmlDevice_t())  # NULL handle


def test_errors_strings_and_missing_functions(simulate):
    library = simulate("t4-x1")
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_IN_USE) == "In use by another client"
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)) == (
        "Insufficient resources")
    assert library.nvmlErrorString(12345) == b"Unknown Error"
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # not simulated
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    name = ctypes.create_string_buffer(4)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")
    assert fn(handle, name, ctypes.c_uint(4)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE


def test_init_is_reference_counted(simulate):
    simulate("t4-x1")
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 1


def test_a_lost_gpu_keeps_its_identity_and_fails_everything_else(simulate, sim_state):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(6)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    control = sim.SimControl(sim_state)
    control.set_gpu_lost(6, True)
    assert pynvml.nvmlDeviceGetUUID(handle) == uuid
    assert pynvml.nvmlDeviceGetPciInfo(handle).busId == "00000000:D1:00.0"
    for call in (pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlDeviceGetMigMode,
                 pynvml.nvmlDeviceGetComputeMode, pynvml.nvmlDeviceGetComputeRunningProcesses):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(handle)
    assert pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(5)).total > 0
    control.set_gpu_lost(6, False)
    assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 0]


def test_a_removed_gpu_is_not_enumerated_and_fails_a_handle_held_from_before(
        simulate, sim_state):
    simulate("l4-x4")
    held = pynvml.nvmlDeviceGetHandleByIndex(2)
    uuid = pynvml.nvmlDeviceGetUUID(held)
    control = sim.SimControl(sim_state)
    control.remove_gpu(2)
    assert pynvml.nvmlDeviceGetCount() == 3
    # indexes close up; minor numbers (the /dev/nvidiaN slot) stay
    third = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetMinorNumber(third) == 3
    assert pynvml.nvmlDeviceGetIndex(third) == 2
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID(uuid)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetComputeMode(held)
    with pytest.raises(ValueError, match="GPU 2 is removed"):
        control.raise_xid(2, 79)
    control.insert_gpu(2)
    assert pynvml.nvmlDeviceGetCount() == 4
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == uuid
    assert pynvml.nvmlDeviceGetComputeMode(held) == 0
    with pytest.raises(ValueError, match="in its slot already"):
        control.insert_gpu(2)


def test_a_replaced_gpu_is_a_new_board_in_the_same_slot(simulate, sim_state):
    simulate("dgx-h100")
    held = pynvml.nvmlDeviceGetHandleByIndex(1)
    old_uuid = pynvml.nvmlDeviceGetUUID(held)
    pynvml.nvmlDeviceSetMigMode(held, pynvml.NVML_DEVICE_MIG_ENABLE)
    control = sim.SimControl(sim_state)
    control.replace_gpu(1)
    new_uuid = control.gpu_uuid(1)
    assert new_uuid != old_uuid
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetUUID(handle) == new_uuid
    assert pynvml.nvmlDeviceGetMinorNumber(handle) == 1
    assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 0]  # fresh from the factory
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID(old_uuid)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # a handle to the board taken out
        pynvml.nvmlDeviceGetMigMode(held)
    snapshot = control.snapshot()["gpus"][1]
    assert (snapshot["uuid"], snapshot["present"]) == (new_uuid, True)
