"""Simulated load through the real pynvml: utilisation, memory, power and GPM, with the
error codes real NVML gives for MIG devices and pre-Hopper GPUs."""

from __future__ import annotations

import time

import pynvml
import pytest

from gpudra.driver import sim
from gpudra.driver.nvml import Nvml

GIB = 2**30


def gpm_sm(handle, first, second) -> float:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    pynvml.nvmlGpmMetricsGet(request)
    assert request.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
    return request.metrics[0].value


def test_full_gpu_load_is_utilisation_memory_and_power(simulate, sim_state):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    idle_power = pynvml.nvmlDeviceGetPowerUsage(handle)
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 0
    sim.SimControl(sim_state).set_load(3, sm_percent=80, memory_bytes=20 * GIB)
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 80
    assert pynvml.nvmlDeviceGetMemoryInfo(handle).used == 20 * GIB
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert (v2.used, v2.free) == (20 * GIB, v2.total - 20 * GIB)
    assert pynvml.nvmlDeviceGetPowerUsage(handle) > idle_power
    assert pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(2)).gpu == 0


def test_load_for_a_while_ends_by_itself(simulate, sim_state):
    simulate("l4-x4")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    sim.SimControl(sim_state).set_load(0, sm_percent=50, memory_bytes=GIB, duration=0.2)
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 50
    time.sleep(0.25)
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 0
    assert pynvml.nvmlDeviceGetMemoryInfo(handle).used == 0


def test_mig_devices_have_memory_but_no_utilisation_or_power(simulate, sim_state):
    simulate("dgx-a100-static-mig")
    control = sim.SimControl(sim_state)
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    mig_uuid = pynvml.nvmlDeviceGetUUID(mig)
    control.set_load(0, mig_uuid=mig_uuid, sm_percent=60, memory_bytes=GIB)
    assert pynvml.nvmlDeviceGetMemoryInfo(mig).used == GIB
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(parent)  # a GPU in MIG mode
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(mig)
    assert pynvml.nvmlGpmQueryDeviceSupport(parent).isSupportedDevice == 0  # Ampere
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmMigSampleGet(parent, 1, pynvml.nvmlGpmSampleAlloc())


def test_gpm_reports_each_gpu_instance_on_hopper(simulate, sim_state):
    simulate("dgx-h100")
    nvml = Nvml()
    uuid = sim.SimControl(sim_state).gpu_uuid(1)
    nvml.set_mig_mode(uuid, True)
    profile = nvml.mig_profiles(uuid, 80 * GIB)[0]
    busy = nvml.create_mig_device(uuid, profile, profile.placements[0])
    quiet = nvml.create_mig_device(uuid, profile, profile.placements[1])
    sim.SimControl(sim_state).set_load(1, mig_uuid=busy.uuid, sm_percent=40)
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlGpmQueryDeviceSupport(parent).isSupportedDevice == 1
    samples = {}
    for gi in (busy.gpu_instance_id, quiet.gpu_instance_id):
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmMigSampleGet(parent, gi, first)
        pynvml.nvmlGpmMigSampleGet(parent, gi, second)
        samples[gi] = gpm_sm(parent, first, second)
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)
    assert samples == {busy.gpu_instance_id: 40.0, quiet.gpu_instance_id: 0.0}
    whole = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    for sample in whole:
        pynvml.nvmlGpmSampleGet(parent, sample)
    assert gpm_sm(parent, *whole) == pytest.approx(40 / 7)  # one of seven slices at 40 %
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpmMigSampleGet(parent, 99, whole[0])
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmSampleGet(pynvml.nvmlDeviceGetHandleByUUID(busy.uuid), whole[0])


def test_gpm_checks_the_struct_version(simulate):
    simulate("dgx-h100")
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(parent, first)
    pynvml.nvmlGpmSampleGet(parent, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = 7
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlGpmMetricsGet(request)


def test_the_seam_samples_one_gpu_with_its_mig_devices(simulate, sim_state):
    simulate("dgx-h100")
    nvml = Nvml()
    control = sim.SimControl(sim_state)
    uuid = control.gpu_uuid(2)
    nvml.set_mig_mode(uuid, True)
    profile = nvml.mig_profiles(uuid, 80 * GIB)[0]
    mig = nvml.create_mig_device(uuid, profile, profile.placements[0])
    control.set_load(2, mig_uuid=mig.uuid, sm_percent=30, memory_bytes=2 * GIB)
    first = nvml.gpu_usage(uuid, {mig.uuid: mig.gpu_instance_id})
    assert first.sm_percent is None  # GPM needs two samples; MIG mode has no plain figure
    assert first.mig[mig.uuid].sm_percent is None
    assert first.mig[mig.uuid].memory_used_bytes == 2 * GIB
    second = nvml.gpu_usage(uuid, {mig.uuid: mig.gpu_instance_id})
    assert second.mig[mig.uuid].sm_percent == 30
    assert second.sm_percent == pytest.approx(30 / 7)
    assert second.power_watts is not None
    nvml.gpu_usage(uuid, {})  # the MIG device's claim is gone: its GPM sample is freed
    assert [key for key in nvml._gpm_samples if key[0] == uuid] == [(uuid, None)]


def test_load_control_refuses_bad_targets(simulate, sim_state):
    simulate("dgx-a100-static-mig")
    control = sim.SimControl(sim_state)
    with pytest.raises(ValueError, match="MIG mode: load needs a MIG device"):
        control.set_load(0, sm_percent=10)
    with pytest.raises(ValueError, match="no MIG device MIG-nope"):
        control.set_load(0, mig_uuid="MIG-nope", sm_percent=10)
    with pytest.raises(ValueError, match="not within 0-100"):
        control.set_load(0, sm_percent=101)
