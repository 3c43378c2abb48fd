"""NVML symbols that report load: utilisation, power and GPM samples.

The load comes from :meth:`~.control.SimControl.set_load` (``gpudra sim load``). What real
NVML does and this follows: ``nvmlDeviceGetUtilizationRates`` and ``nvmlDeviceGetPowerUsage``
answer for a full GPU only (NOT_SUPPORTED on a MIG device handle and on a GPU in MIG mode for
utilisation); per-MIG SM activity exists only through GPM (Hopper and newer), where
``nvmlGpmMigSampleGet`` samples one GPU instance.

Approximations: a GPM metric is the mean of the two samples' instantaneous load (real GPM
integrates counters between them); power is a straight line from an idle to a full-load
figure that is the same for every model; the memory-utilisation figure equals the SM one.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass

from .cabi import address, as_int, invalid, put, put_handle, target
from .codes import MIG_ENABLE, NvmlFailure, Return
from .core import Device, LibraryCore, symbol
from .state import GpuState

_ARCH_HOPPER = 9  # nvmlDeviceArchitecture_t
_GPM_METRIC_SM_UTIL = 2
_GPM_METRICS_GET_VERSION = 1
_GPM_SUPPORT_VERSION = 1
IDLE_MILLIWATTS = 60_000
FULL_LOAD_MILLIWATTS = 400_000


def gpu_sm_percent(gpu: GpuState, compute_slices: int, mig_slices: dict[str, int],
                   now: float) -> float:
    """The whole GPU's SM %: its own load, plus each MIG device's load by its share of slices."""
    total = 0.0
    for load in gpu.loads:
        if not load.active(now):
            continue
        if load.mig_uuid is None:
            total += load.sm_percent
        elif load.mig_uuid in mig_slices:
            total += load.sm_percent * mig_slices[load.mig_uuid] / compute_slices
    return min(100.0, total)


def load_memory_bytes(gpu: GpuState, mig_uuid: str | None, now: float) -> int:
    """Memory the simulated load holds on the GPU (``mig_uuid`` None) or on one MIG device."""
    return sum(load.memory_bytes for load in gpu.loads
               if load.mig_uuid == mig_uuid and load.active(now))


@dataclass(frozen=True)
class _GpmSample:
    at: float
    sm_percent: float


class UsageApi(LibraryCore):
    # Process-wide, as GPM sample buffers are in the C library.
    _gpm_lock = threading.Lock()
    _gpm_buffers: dict[int, ctypes.Array[ctypes.c_char]] = {}
    _gpm_samples: dict[int, _GpmSample] = {}

    def _sm_percent(self, dev: Device, gi_id: int | None = None) -> float:
        now = time.time()
        mig = dev.slot.model.mig
        if mig is None or dev.gpu.mig_current != MIG_ENABLE:
            return gpu_sm_percent(dev.gpu, 1, {}, now)
        slices: dict[str, int] = {}
        for gi in dev.gpu.gpu_instances:
            for ci in gi.compute_instances:
                profile = next(p for p in mig.profiles if p.id == gi.profile_id)
                ci_profile = profile.compute_profile(ci.profile_id)
                ci_slices = ci_profile.slices if ci_profile is not None else gi.size
                if gi_id is None:
                    slices[ci.uuid] = ci_slices
                elif gi.id == gi_id:
                    slices[ci.uuid] = ci_slices * mig.compute_slices // profile.slices
        return gpu_sm_percent(dev.gpu, mig.compute_slices, slices, now)

    @symbol
    def nvmlDeviceGetUtilizationRates(self, device: object, utilization: object) -> None:
        dev = self.device(device)
        if dev.mig is not None or dev.gpu.mig_current == MIG_ENABLE:
            raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
        info = target(utilization)
        sm = round(self._sm_percent(dev))
        info.gpu, info.memory = sm, sm

    @symbol
    def nvmlDeviceGetPowerUsage(self, device: object, power: object) -> None:
        """Milliwatts of the board; NOT_SUPPORTED for a MIG device, as on real GPUs."""
        dev = self.device(device)
        if dev.mig is not None:
            raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
        busy = self._sm_percent(dev) / 100
        put(power, int(IDLE_MILLIWATTS + busy * (FULL_LOAD_MILLIWATTS - IDLE_MILLIWATTS)))

    # --- GPM (Hopper and newer) ---------------------------------------------------------------

    def _gpm_device(self, device: object) -> Device:
        dev = self.device(device)
        if dev.mig is not None:
            raise invalid()  # GPM takes the parent GPU's handle (plus a GPU instance id)
        if dev.slot.model.architecture < _ARCH_HOPPER:
            raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
        return dev

    @symbol
    def nvmlGpmQueryDeviceSupport(self, device: object, support: object) -> None:
        dev = self.device(device)
        info = target(support)
        if int(info.version) != _GPM_SUPPORT_VERSION:
            raise NvmlFailure(Return.ERROR_ARGUMENT_VERSION_MISMATCH)
        info.isSupportedDevice = int(dev.mig is None
                                     and dev.slot.model.architecture >= _ARCH_HOPPER)

    @symbol
    def nvmlGpmSampleAlloc(self, sample: object) -> None:
        buf = ctypes.create_string_buffer(64)
        with self._gpm_lock:
            self._gpm_buffers[ctypes.addressof(buf)] = buf
        put_handle(sample, ctypes.addressof(buf))

    @symbol
    def nvmlGpmSampleFree(self, sample: object) -> None:
        addr = address(sample)
        with self._gpm_lock:
            if addr is None or self._gpm_buffers.pop(addr, None) is None:
                raise invalid()
            self._gpm_samples.pop(addr, None)

    def _record(self, sample: object, sm_percent: float) -> None:
        addr = address(sample)
        with self._gpm_lock:
            if addr is None or addr not in self._gpm_buffers:
                raise invalid()
            self._gpm_samples[addr] = _GpmSample(time.monotonic(), sm_percent)

    @symbol
    def nvmlGpmSampleGet(self, device: object, sample: object) -> None:
        dev = self._gpm_device(device)
        self._record(sample, self._sm_percent(dev))

    @symbol
    def nvmlGpmMigSampleGet(self, device: object, gpu_instance_id: object,
                            sample: object) -> None:
        dev = self._gpm_device(device)
        gi_id = as_int(gpu_instance_id)
        if dev.gpu.mig_current != MIG_ENABLE:
            raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
        if dev.gpu.gpu_instance(gi_id) is None:
            raise NvmlFailure(Return.ERROR_NOT_FOUND)
        self._record(sample, self._sm_percent(dev, gi_id))

    @symbol
    def nvmlGpmMetricsGet(self, metrics_get: object) -> None:
        info = target(metrics_get)
        if int(info.version) != _GPM_METRICS_GET_VERSION:
            raise NvmlFailure(Return.ERROR_ARGUMENT_VERSION_MISMATCH)
        with self._gpm_lock:
            first = self._gpm_samples.get(address(info.sample1) or 0)
            second = self._gpm_samples.get(address(info.sample2) or 0)
        if first is None or second is None:
            raise invalid()
        count = as_int(info.numMetrics)
        if not 0 < count <= len(info.metrics):
            raise invalid()
        for i in range(count):
            metric = info.metrics[i]
            if metric.metricId == _GPM_METRIC_SM_UTIL:
                metric.value = (first.sm_percent + second.sm_percent) / 2
                metric.nvmlReturn = int(Return.SUCCESS)
            else:
                metric.nvmlReturn = int(Return.ERROR_NOT_SUPPORTED)
