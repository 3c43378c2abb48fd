"""MIG through the real pynvml wrappers: profiles, placements, lifecycle, mode changes."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from gpudra.driver import sim
from gpudra.driver.sim import profiles

MIB = 1024 * 1024
ENABLE, DISABLE = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE

# Placements per profile id as README section 4 states them (starts, size).
EIGHT_SLICE_PLACEMENTS = {
    19: ([0, 1, 2, 3, 4, 5, 6], 1), 20: ([0, 1, 2, 3, 4, 5, 6], 1), 15: ([0, 2, 4, 6], 2),
    14: ([0, 2, 4], 2), 9: ([0, 4], 4), 5: ([0], 4), 0: ([0], 8),
}
A30_PLACEMENTS = {14: ([0, 1, 2, 3], 1), 21: ([0, 1, 2, 3], 1), 5: ([0, 2], 2),
                  6: ([0, 2], 2), 0: ([0], 4)}
MODEL_OF_PROFILE = {
    "dgx-a100": ("A100-SXM4-40GB", EIGHT_SLICE_PLACEMENTS),
    "dgx-h100": ("H100-SXM5-80GB", EIGHT_SLICE_PLACEMENTS),
    "hgx-h200": ("H200-SXM5-141GB", EIGHT_SLICE_PLACEMENTS),
    "h100-nvl-x2": ("H100-NVL-94GB", EIGHT_SLICE_PLACEMENTS),
    "a30-x4": ("A30-24GB", A30_PLACEMENTS),
}


def placements(handle, profile_id):
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None,
                                                      ctypes.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array,
                                                      ctypes.byref(count))
    return [array[i].start for i in range(count.value)], {array[i].size for i in range(count.value)}


def create(handle, profile_id, start, size):
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
    return pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id,
                                                           ctypes.byref(placement))


def gpu_instances(handle, profile_id, capacity=8):
    array = (pynvml.c_nvmlGpuInstance_t * capacity)()
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstances(handle, profile_id, array, ctypes.byref(count))
    return [array[i] for i in range(count.value)]


def gi_info(gi):
    info = pynvml.nvmlGpuInstanceGetInfo(gi)
    return info.id, info.profileId, info.placement.start, info.placement.size


@pytest.fixture
def h100(simulate):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_SUCCESS
    return handle


# --- profile information ----------------------------------------------------------------


@pytest.mark.parametrize("profile", sorted(MODEL_OF_PROFILE))
@pytest.mark.parametrize("version", [1, 2])
def test_profile_info_for_every_index(simulate, profile, version):
    key, documented = MODEL_OF_PROFILE[profile]
    simulate(profile)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    mig = profiles.gpu_model(key).mig
    assert mig is not None
    seen = {}
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        row = mig.by_index(index)
        if row is None:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, version)
            continue
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, version)
        got = (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB,
               info.multiprocessorCount, info.copyEngineCount, info.decoderCount,
               info.encoderCount, info.jpegCount, info.ofaCount, info.isP2pSupported)
        assert got == (row.id, row.slices, row.max_instances, row.memory_mib,
                       row.multiprocessors, row.copy_engines, row.decoders, row.encoders,
                       row.jpeg, row.ofa, 0)
        if version == 2:
            assert info.name == f"MIG {row.name}"
        seen[info.id] = placements(handle, info.id)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT,
                                                   version)
    assert seen == {pid: (starts, {size}) for pid, (starts, size) in documented.items()}


def test_versioned_profile_info_checks_the_struct_version(simulate):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 9 << 24 | ctypes.sizeof(info)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
    assert fn(handle, 0, ctypes.byref(info)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert fn(handle, 0, None) == pynvml.NVML_ERROR_INVALID_ARGUMENT  # NULL info


def test_placements_answer_with_mig_disabled_and_reject_bad_ids(simulate):
    simulate("dgx-a100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(handle) == [DISABLE, DISABLE]
    assert placements(handle, 9) == ([0, 4], {4})
    with pytest.raises(pynvml.NVMLError_NotSupported):
        placements(handle, 42)
    too_small = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    count = ctypes.c_uint(2)
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, 19, too_small,
                                                          ctypes.byref(count))
    assert count.value == 7


@pytest.mark.parametrize("profile", ["l4-x4", "t4-x1"])
def test_mig_calls_are_not_supported_without_mig(simulate, profile):
    simulate(profile)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    calls = [
        lambda: pynvml.nvmlDeviceGetMigMode(handle),
        lambda: pynvml.nvmlDeviceSetMigMode(handle, ENABLE),
        lambda: pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0),
        lambda: placements(handle, 19),
        lambda: create(handle, 19, 0, 1),
        lambda: pynvml.nvmlDeviceGetGpuInstanceById(handle, 0),
        lambda: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0),
    ]
    for call in calls:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 0
    assert not pynvml.nvmlDeviceIsMigDeviceHandle(handle)


def test_instance_calls_are_not_supported_while_mig_is_disabled(simulate):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 0
    for call in (lambda: create(handle, 19, 0, 1),
                 lambda: pynvml.nvmlDeviceCreateGpuInstance(handle, 19),
                 lambda: gpu_instances(handle, 19),
                 lambda: pynvml.nvmlDeviceGetGpuInstanceById(handle, 0),
                 lambda: pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 19),
                 lambda: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()


# --- creating and destroying GPU instances ----------------------------------------------


@pytest.mark.parametrize("profile", ["dgx-a100", "dgx-h100"])
def test_create_at_every_placement_of_every_profile(simulate, profile):
    simulate(profile)
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    pynvml.nvmlDeviceSetMigMode(handle, ENABLE)
    for profile_id, (starts, size) in EIGHT_SLICE_PLACEMENTS.items():
        for start in starts:
            gi = create(handle, profile_id, start, size)
            gi_id, got_profile, got_start, got_size = gi_info(gi)
            assert (got_profile, got_start, got_size) == (profile_id, start, size)
            assert [gi_info(g) for g in gpu_instances(handle, profile_id)] == [gi_info(gi)]
            same = pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            assert gi_info(same) == gi_info(gi)
            pynvml.nvmlGpuInstanceDestroy(gi)
            assert gpu_instances(handle, profile_id) == []
            with pytest.raises(pynvml.NVMLError_NotFound):
                pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)


def test_overlap_and_bad_placements(h100):
    create(h100, 9, 4, 4)  # 3g on memory slices 4..7
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(h100, 9, 4, 4)  # taken
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(h100, 19, 5, 1)  # inside the 3g
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(h100, 0, 0, 8)  # 7g needs everything
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        create(h100, 14, 1, 2)  # 2g cannot start at 1
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        create(h100, 14, 0, 4)  # wrong size for 2g
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        create(h100, 77, 0, 1)  # no such profile id
    create(h100, 5, 0, 4)  # 4g + 3g coexist (R510+)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h100, 19) == 0


def test_instance_caps(h100):
    for start in (0, 2, 4):
        create(h100, 14, start, 2)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h100, 14) == 0
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h100, 15) == 1  # 6:2 still free
    create(h100, 20, 6, 1)  # 1g+me, capped at one instance
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(h100, 20, 6, 1)
    for gi in gpu_instances(h100, 14) + gpu_instances(h100, 20):
        pynvml.nvmlGpuInstanceDestroy(gi)
    create(h100, 20, 0, 1)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(h100, 20, 3, 1)  # free memory, but the +me cap is 1


def test_driver_chosen_placements_follow_the_observed_order(h100):
    starts = [gi_info(pynvml.nvmlDeviceCreateGpuInstance(h100, 19))[2] for _ in range(7)]
    assert starts == [6, 4, 5, 0, 1, 2, 3]
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlDeviceCreateGpuInstance(h100, 19)


def test_creation_order_matters_without_placements(simulate):
    """MIG UG: `-cgi 19,19,14,9` fails at the 3g while `-cgi 9,19,14,19` succeeds."""
    simulate("dgx-a100")
    first, second = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    for handle in (first, second):
        pynvml.nvmlDeviceSetMigMode(handle, ENABLE)
    for profile_id in (19, 19, 14):
        pynvml.nvmlDeviceCreateGpuInstance(first, profile_id)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlDeviceCreateGpuInstance(first, 9)
    for profile_id in (9, 19, 14, 19):
        pynvml.nvmlDeviceCreateGpuInstance(second, profile_id)


def test_ids_come_from_the_driver_not_from_the_placement(h100):
    a = create(h100, 19, 5, 1)
    b = create(h100, 19, 2, 1)
    ids = {gi_info(a)[0], gi_info(b)[0]}
    assert len(ids) == 2 and all(0 <= i < 15 for i in ids)


# --- compute instances, MIG devices, teardown ---------------------------------------------


def test_compute_instance_profiles_of_a_3g(h100):
    gi = create(h100, 9, 0, 4)
    got = {}
    for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, 0)
        except pynvml.NVMLError_NotSupported:
            continue
        got[info.id] = (info.sliceCount, info.instanceCount, info.multiprocessorCount,
                        info.sharedCopyEngineCount, info.name)
    assert got == {0: (1, 3, 20, 3, "MIG 1c.3g.40gb"), 1: (2, 1, 40, 3, "MIG 2c.3g.40gb"),
                   2: (3, 1, 60, 3, "MIG 3g.40gb")}
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 9, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 1)
    v1 = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 2, 0, version=1)
    assert (v1.id, v1.multiprocessorCount) == (2, 60)
    # two 1c CIs land at compute slices 0 and 1, as seen on real hardware
    cis = [pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0) for _ in range(2)]
    assert [pynvml.nvmlComputeInstanceGetInfo(ci).placement.start for ci in cis] == [0, 1]
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 0) == 1
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 2) == 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 2)


def test_mig_device_handles(simulate):
    simulate("dgx-a100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetMigMode(handle, ENABLE)
    gi = create(handle, 14, 2, 2)  # 2g.10gb
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 1)
    info = pynvml.nvmlComputeInstanceGetInfo(ci)
    mig = info.device
    uuid = pynvml.nvmlDeviceGetUUID(mig)
    assert uuid.startswith("MIG-") and len(uuid) == 40
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig)
    assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 2g.10gb"
    assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 9856 * MIB
    memory = pynvml.nvmlDeviceGetMemoryInfo(mig, version=pynvml.nvmlMemory_v2)
    assert memory.total == 9856 * MIB and memory.free == memory.total
    attrs = pynvml.nvmlDeviceGetAttributes(mig)
    assert (attrs.multiprocessorCount, attrs.gpuInstanceSliceCount,
            attrs.computeInstanceSliceCount, attrs.memorySizeMB) == (28, 2, 2, 9856)
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == gi_info(gi)[0]
    assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == info.id
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert pynvml.nvmlDeviceGetIndex(parent) == 0
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 7
    by_index = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    assert pynvml.nvmlDeviceGetUUID(by_index) == uuid
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 7)
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == uuid
    assert pynvml.nvmlGpuInstanceGetInfo(info.gpuInstance).id == gi_info(gi)[0]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(handle)  # a full GPU is no MIG device


SHARED_ENGINES = ("sharedCopyEngineCount", "sharedDecoderCount", "sharedEncoderCount",
                  "sharedJpegCount", "sharedOfaCount")


def engines_of_gi_profile(info):
    return info.copyEngineCount, info.decoderCount, info.encoderCount, info.jpegCount, info.ofaCount


def shared_engines(info):
    return tuple(getattr(info, name) for name in SHARED_ENGINES)


def test_devices_and_compute_instances_share_their_gpu_instance_engines(simulate):
    simulate("dgx-a100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    full = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle,
                                                      pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
    # A full GPU reports the engines of its full-size MIG profile.
    assert shared_engines(pynvml.nvmlDeviceGetAttributes(handle)) == engines_of_gi_profile(full)
    assert engines_of_gi_profile(full)[:2] != (0, 0)
    pynvml.nvmlDeviceSetMigMode(handle, ENABLE)
    two = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle,
                                                     pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE)
    gi = create(handle, two.id, 2, 2)
    ci_profile = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0)  # 1c.2g
    mig = pynvml.nvmlComputeInstanceGetInfo(pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0))
    assert shared_engines(ci_profile) == engines_of_gi_profile(two)
    assert shared_engines(pynvml.nvmlDeviceGetAttributes(mig.device)) == engines_of_gi_profile(two)


def test_teardown_order_and_in_use(simulate, sim_state):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetMigMode(handle, ENABLE)
    gi = create(handle, 19, 3, 1)
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlComputeInstanceGetInfo(ci).device)
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlGpuInstanceDestroy(gi)  # a compute instance exists
    control = sim.SimControl(sim_state)
    control.add_process(0, 4242, uuid, used_memory_mib=512)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [
        (4242, 512 * MIB, gi_info(gi)[0], pynvml.nvmlComputeInstanceGetInfo(ci).id)]
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlComputeInstanceDestroy(ci)  # a process runs on it
    control.remove_process(0, 4242)
    pynvml.nvmlComputeInstanceDestroy(ci)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlComputeInstanceGetInfo(ci)  # stale handle
    pynvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceDestroy(gi)


def test_compute_instance_lookup(h100):
    gi = create(h100, 0, 0, 8)
    cis = [pynvml.nvmlGpuInstanceCreateComputeInstance(gi, profile) for profile in (3, 1, 0)]
    placed = [(pynvml.nvmlComputeInstanceGetInfo(c).placement.start,
               pynvml.nvmlComputeInstanceGetInfo(c).placement.size) for c in cis]
    assert placed == [(0, 4), (4, 2), (6, 1)]  # 4c + 2c + 1c fill a 7g
    array = (pynvml.c_nvmlComputeInstance_t * 7)()
    count = ctypes.c_uint(0)
    pynvml.nvmlGpuInstanceGetComputeInstances(gi, 1, array, ctypes.byref(count))
    assert count.value == 1
    ci_id = pynvml.nvmlComputeInstanceGetInfo(array[0]).id
    same = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
    assert pynvml.nvmlComputeInstanceGetInfo(same).placement.start == 4
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, 7)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 8)  # no such CI profile in a 7g


# --- MIG mode ---------------------------------------------------------------------------------


def test_hopper_toggles_mig_at_once_unless_busy(simulate, sim_state):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    control = sim.SimControl(sim_state)
    control.add_process(0, 100)
    assert pynvml.nvmlDeviceSetMigMode(handle, DISABLE) == pynvml.NVML_SUCCESS  # no change
    assert pynvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_ERROR_IN_USE
    assert pynvml.nvmlDeviceGetMigMode(handle) == [DISABLE, DISABLE]
    control.remove_process(0, 100)
    assert pynvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(handle) == [ENABLE, ENABLE]
    gi = create(handle, 19, 0, 1)
    assert pynvml.nvmlDeviceSetMigMode(handle, DISABLE) == pynvml.NVML_ERROR_IN_USE
    pynvml.nvmlGpuInstanceDestroy(gi)
    assert pynvml.nvmlDeviceSetMigMode(handle, DISABLE) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(handle) == [DISABLE, DISABLE]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceSetMigMode(handle, 2)


def test_ampere_keeps_a_busy_change_pending_until_reset(simulate, sim_state):
    simulate("dgx-a100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    control = sim.SimControl(sim_state)
    control.add_process(0, 100)
    assert pynvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_ERROR_IN_USE
    assert pynvml.nvmlDeviceGetMigMode(handle) == [DISABLE, ENABLE]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        create(handle, 19, 0, 1)  # still disabled until the reset
    assert pynvml.nvmlDeviceSetMigMode(handle, DISABLE) == pynvml.NVML_SUCCESS  # withdrawn
    assert pynvml.nvmlDeviceGetMigMode(handle) == [DISABLE, DISABLE]
    assert pynvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_ERROR_IN_USE
    with pytest.raises(ValueError, match="in use"):
        control.reset_gpu(0)
    control.remove_process(0, 100)
    control.reset_gpu(0)
    assert pynvml.nvmlDeviceGetMigMode(handle) == [ENABLE, ENABLE]
    create(handle, 19, 0, 1)


def test_static_mig_profile_is_pre_partitioned(simulate, sim_state):
    simulate("dgx-a100-static-mig")
    layout = {}
    for index in range(3):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        found = []
        for profile_id in (19, 14, 9):
            found += [gi_info(gi)[1:] for gi in gpu_instances(handle, profile_id)] if (
                pynvml.nvmlDeviceGetMigMode(handle)[0]) else []
        layout[index] = sorted(found, key=lambda f: f[1])
    assert layout[0] == [(19, 0, 1), (19, 1, 1), (14, 2, 2), (9, 4, 4)]
    assert layout[1] == [(19, s, 1) for s in range(7)]
    assert layout[2] == []
    snapshot = sim.SimControl(sim_state).snapshot()
    assert [len(g["gpu_instances"]) for g in snapshot["gpus"]] == [4, 7, 0, 0, 0, 0, 0, 0]
    assert all(len(gi["compute_instances"]) == 1 for gi in snapshot["gpus"][1]["gpu_instances"])
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(1), 6)
    assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 1g.5gb"


def test_mig_devices_coming_and_going_keep_the_handle_table_flat(simulate):
    library = simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceSetMigMode(handle, ENABLE) == pynvml.NVML_SUCCESS
    stale = []
    for _ in range(300):
        gi = create(handle, 19, 0, 1)
        ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)
        mig_uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlComputeInstanceGetInfo(ci).device)
        pynvml.nvmlComputeInstanceDestroy(ci)
        pynvml.nvmlGpuInstanceDestroy(gi)
        stale.append((gi, ci, mig_uuid))
    # What a create/destroy cycle leaves behind is an 8-byte cell, not a table entry ...
    assert len(library.handles) == 1  # GPU 0's
    assert library.handles.cells == 1 + 3 * 300  # per cycle: GI, CI, MIG device
    # ... and every stale handle still answers for its own (gone) object, never a newcomer.
    newcomer = create(handle, 19, 0, 1)
    for gi, ci, _ in (stale[0], stale[-1]):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlGpuInstanceGetInfo(gi)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlComputeInstanceGetInfo(ci)
    assert len({uuid for _, _, uuid in stale}) == 300
    assert gi_info(newcomer)[2:] == (0, 1)


def test_a_bare_gpu_instance_is_no_mig_device_but_is_enumerated(simulate):
    # A kill between the GPU-instance and the compute-instance create leaves this state:
    # the MIG-device listing does not show it, the GPU-instance enumeration must.
    from gpudra.driver.mig import Placement
    from gpudra.driver.nvml import GpuInstance, Nvml

    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    pynvml.nvmlDeviceSetMigMode(handle, ENABLE)
    bare = create(handle, 19, 6, 1)  # 1g.10gb, no compute instance
    whole = create(handle, 9, 0, 4)  # 3g.40gb with its full compute instance
    pynvml.nvmlGpuInstanceCreateComputeInstance(whole, 2)
    nvml = Nvml()
    assert [m.gpu_instance_id for m in nvml.mig_instances(uuid)] == [gi_info(whole)[0]]
    assert nvml.gpu_instances(uuid) == [
        GpuInstance(gi_info(whole)[0], 9, Placement(0, 4), (0,)),
        GpuInstance(gi_info(bare)[0], 19, Placement(6, 1), ()),
    ]
    assert nvml.destroy_gpu_instance(uuid, gi_info(bare)[0]) is True
    assert nvml.destroy_gpu_instance(uuid, gi_info(whole)[0]) is True  # its CI first
    assert nvml.gpu_instances(uuid) == []
    assert nvml.destroy_gpu_instance(uuid, 3) is False  # gone already
    # and MIG can be turned off again: nothing is left on the GPU
    assert pynvml.nvmlDeviceSetMigMode(handle, DISABLE) == pynvml.NVML_SUCCESS
    assert nvml.gpu_instances(uuid) == []
