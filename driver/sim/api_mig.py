"""NVML symbols for MIG: mode, GPU/compute-instance profiles, lifecycle, MIG device handles.

Profile info and possible placements answer whether or not MIG is enabled (the DRA driver
publishes partitions of a GPU before it turns MIG on); creating, listing and destroying
instances need MIG enabled (NOT_SUPPORTED otherwise).
"""

from __future__ import annotations

from typing import Any

from . import mig
from .cabi import (
    as_int,
    capacity,
    elements,
    invalid,
    put,
    put_handle,
    put_handle_at,
    put_pointer_field,
    struct_version,
    target,
)
from .codes import (
    COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT,
    COMPUTE_INSTANCE_PROFILE_COUNT,
    GPU_INSTANCE_PROFILE_COUNT,
    MIG_DISABLE,
    MIG_ENABLE,
    NvmlFailure,
    Return,
)
from .core import Ci, Gi, LibraryCore, symbol
from .profiles import ComputeInstanceProfile, GpuInstanceProfile, GpuSlot
from .state import GpuState


def _not_supported() -> NvmlFailure:
    return NvmlFailure(Return.ERROR_NOT_SUPPORTED)


def _fill_gi_profile(info: Any, p: GpuInstanceProfile, *, named: bool) -> None:
    info.id = p.id
    info.isP2pSupported = 0  # every real -lgip row here prints "P2P No"
    info.sliceCount = p.slices
    info.instanceCount = p.max_instances
    info.multiprocessorCount = p.multiprocessors
    info.copyEngineCount = p.copy_engines
    info.decoderCount = p.decoders
    info.encoderCount = p.encoders
    info.jpegCount = p.jpeg
    info.ofaCount = p.ofa
    info.memorySizeMB = p.memory_mib
    if named:
        info.name = f"MIG {p.name}".encode()


def fill_shared_engines(info: Any, gi: GpuInstanceProfile | None) -> None:
    """The engine counts a device or compute instance shares: its GPU instance's (0 without)."""
    info.sharedCopyEngineCount = gi.copy_engines if gi else 0
    info.sharedDecoderCount = gi.decoders if gi else 0
    info.sharedEncoderCount = gi.encoders if gi else 0
    info.sharedJpegCount = gi.jpeg if gi else 0
    info.sharedOfaCount = gi.ofa if gi else 0


def _fill_ci_profile(info: Any, gi: GpuInstanceProfile, ci: ComputeInstanceProfile, *,
                     named: bool) -> None:
    info.id = ci.id
    info.sliceCount = ci.slices
    info.instanceCount = ci.max_instances
    info.multiprocessorCount = gi.ci_multiprocessors(ci)
    fill_shared_engines(info, gi)
    if named:
        info.name = f"MIG {gi.ci_name(ci)}".encode()


def _fill_placements(placements: object, count: object, starts: list[int], size: int) -> None:
    """The two-call protocol of the placement queries: NULL array → only the count."""
    target(count)  # NULL count is INVALID_ARGUMENT before anything is written
    if placements is not None:
        held = capacity(placements)
        if held is not None and held < len(starts):
            put(count, len(starts))
            raise NvmlFailure(Return.ERROR_INSUFFICIENT_SIZE)
        array = elements(placements)
        for i, start in enumerate(starts):
            array[i].start = start
            array[i].size = size
    put(count, len(starts))


def _mig_enabled(slot: GpuSlot, gpu: GpuState) -> None:
    if slot.model.mig is None or gpu.mig_current != MIG_ENABLE:
        raise _not_supported()


class MigApi(LibraryCore):
    # --- MIG mode -----------------------------------------------------------------------------

    @symbol
    def nvmlDeviceGetMigMode(self, device: object, current: object, pending: object) -> None:
        slot, gpu = self.full_gpu(device)
        if slot.model.mig is None:
            raise _not_supported()
        put(current, gpu.mig_current)
        put(pending, gpu.mig_pending)

    @symbol
    def nvmlDeviceSetMigMode(self, device: object, mode: object, status: object) -> None:
        """Returns SUCCESS; whether the mode took effect is in ``status`` (see mig.set_mig_mode)."""
        slot, _ = self.full_gpu(device)
        if slot.model.mig is None:
            raise _not_supported()
        value = as_int(mode)
        if value not in (MIG_DISABLE, MIG_ENABLE):
            raise invalid()
        target(status)
        with self.store.update() as state:
            activation = mig.set_mig_mode(state.gpus[slot.index], slot.model, value)
        put(status, int(activation))

    # --- GPU-instance profiles ----------------------------------------------------------------

    def _gi_profile_at(self, device: object, index: object) -> GpuInstanceProfile:
        slot, _ = self.full_gpu(device)
        if slot.model.mig is None:
            raise _not_supported()
        i = as_int(index)
        if not 0 <= i < GPU_INSTANCE_PROFILE_COUNT:
            raise invalid()
        profile = slot.model.mig.by_index(i)
        if profile is None:
            raise _not_supported()
        return profile

    @staticmethod
    def _gi_profile_id(slot: GpuSlot, profile_id: object, missing: Return) -> GpuInstanceProfile:
        if slot.model.mig is None:
            raise _not_supported()
        profile = slot.model.mig.by_id(as_int(profile_id))
        if profile is None:
            raise NvmlFailure(missing)
        return profile

    @symbol
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: object, profile: object,
                                            info: object) -> None:
        _fill_gi_profile(target(info), self._gi_profile_at(device, profile), named=False)

    @symbol
    def nvmlDeviceGetGpuInstanceProfileInfoV(self, device: object, profile: object,
                                             info: object) -> None:
        found = self._gi_profile_at(device, profile)
        out = target(info)
        if struct_version(out) != 2:
            raise invalid()
        _fill_gi_profile(out, found, named=True)

    @symbol
    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(self, device: object, profile_id: object,
                                                      placements: object, count: object) -> None:
        slot, _ = self.full_gpu(device)
        profile = self._gi_profile_id(slot, profile_id, Return.ERROR_NOT_SUPPORTED)
        _fill_placements(placements, count, list(profile.placement_starts),
                         profile.placement_size)

    @symbol
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: object, profile_id: object,
                                                  count: object) -> None:
        slot, gpu = self.full_gpu(device)
        profile = self._gi_profile_id(slot, profile_id, Return.ERROR_NOT_SUPPORTED)
        _mig_enabled(slot, gpu)
        put(count, mig.remaining_gpu_instances(gpu, profile))

    # --- GPU instances ------------------------------------------------------------------------

    def _create_gpu_instance(self, device: object, profile_id: object, start: int | None,
                             size: int | None, out: object) -> None:
        slot, _ = self.full_gpu(device)
        target(out)
        profile = self._gi_profile_id(slot, profile_id, Return.ERROR_INVALID_ARGUMENT)
        if size is not None and size != profile.placement_size:
            raise invalid()
        with self.store.update() as state:
            gi = mig.create_gpu_instance(state, slot.index, profile, start)
        put_handle(out, self.gi_handle(slot.index, gi))

    @symbol
    def nvmlDeviceCreateGpuInstance(self, device: object, profile_id: object,
                                    gpu_instance: object) -> None:
        """The driver picks the placement (see ``create_order`` in gpus.yaml)."""
        self._create_gpu_instance(device, profile_id, None, None, gpu_instance)

    @symbol
    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: object, profile_id: object,
                                                 placement: object,
                                                 gpu_instance: object) -> None:
        p = target(placement)
        self._create_gpu_instance(device, profile_id, as_int(p.start), as_int(p.size),
                                  gpu_instance)

    @symbol
    def nvmlGpuInstanceDestroy(self, gpu_instance: object) -> None:
        found = self.gpu_instance(gpu_instance)
        index = found.slot.index
        with self.store.update() as state:
            gpu = state.gpus[index]
            mig.destroy_gpu_instance(gpu, self.find_gi(index, gpu, found.gi.serial).gi)
        self.forget_gi(index, found.gi)

    @symbol
    def nvmlDeviceGetGpuInstances(self, device: object, profile_id: object, instances: object,
                                  count: object) -> None:
        slot, gpu = self.full_gpu(device)
        _mig_enabled(slot, gpu)
        profile = self._gi_profile_id(slot, profile_id, Return.ERROR_INVALID_ARGUMENT)
        target(count)
        found = sorted((gi for gi in gpu.gpu_instances if gi.profile_id == profile.id),
                       key=lambda gi: gi.id)
        held = capacity(instances)
        if held is not None and held < len(found):
            put(count, len(found))
            raise NvmlFailure(Return.ERROR_INSUFFICIENT_SIZE)
        for i, gi in enumerate(found):
            put_handle_at(instances, i, self.gi_handle(slot.index, gi))
        put(count, len(found))

    @symbol
    def nvmlDeviceGetGpuInstanceById(self, device: object, gi_id: object,
                                     gpu_instance: object) -> None:
        slot, gpu = self.full_gpu(device)
        _mig_enabled(slot, gpu)
        gi = gpu.gpu_instance(as_int(gi_id))
        if gi is None:
            raise NvmlFailure(Return.ERROR_NOT_FOUND)
        put_handle(gpu_instance, self.gi_handle(slot.index, gi))

    @symbol
    def nvmlGpuInstanceGetInfo(self, gpu_instance: object, info: object) -> None:
        found = self.gpu_instance(gpu_instance)
        out = target(info)
        put_pointer_field(out, "device", self.gpu_handle(found.slot.index))
        out.id = found.gi.id
        out.profileId = found.gi.profile_id
        out.placement.start = found.gi.start
        out.placement.size = found.gi.size

    # --- compute-instance profiles ------------------------------------------------------------

    @staticmethod
    def _ci_profile_at(gi: Gi, index: object, engine: object) -> ComputeInstanceProfile:
        i, eng = as_int(index), as_int(engine)
        if not 0 <= i < COMPUTE_INSTANCE_PROFILE_COUNT:
            raise invalid()
        if not 0 <= eng < COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT:
            raise invalid()
        # CI profile ids equal their NVML_COMPUTE_INSTANCE_PROFILE_* index.
        profile = gi.profile.compute_profile(i)
        if profile is None:
            raise _not_supported()
        return profile

    @staticmethod
    def _ci_profile_id(gi: Gi, profile_id: object) -> ComputeInstanceProfile:
        profile = gi.profile.compute_profile(as_int(profile_id))
        if profile is None:
            raise _not_supported()
        return profile

    @symbol
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gpu_instance: object, profile: object,
                                                     engine: object, info: object) -> None:
        gi = self.gpu_instance(gpu_instance)
        ci = self._ci_profile_at(gi, profile, engine)
        _fill_ci_profile(target(info), gi.profile, ci, named=False)

    @symbol
    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, gpu_instance: object,
                                                      profile: object, engine: object,
                                                      info: object) -> None:
        gi = self.gpu_instance(gpu_instance)
        ci = self._ci_profile_at(gi, profile, engine)
        out = target(info)
        if struct_version(out) != 2:
            raise invalid()
        _fill_ci_profile(out, gi.profile, ci, named=True)

    @symbol
    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(self, gpu_instance: object,
                                                           profile_id: object,
                                                           count: object) -> None:
        gi = self.gpu_instance(gpu_instance)
        ci = self._ci_profile_id(gi, profile_id)
        put(count, mig.remaining_compute_instances(gi.gi, ci, gi.profile.slices))

    @symbol
    def nvmlGpuInstanceGetComputeInstancePossiblePlacements(self, gpu_instance: object,
                                                            profile_id: object,
                                                            placements: object,
                                                            count: object) -> None:
        gi = self.gpu_instance(gpu_instance)
        ci = self._ci_profile_id(gi, profile_id)
        _fill_placements(placements, count,
                         mig.compute_instance_starts(gi.profile.slices, ci.slices), ci.slices)

    # --- compute instances --------------------------------------------------------------------

    def _create_compute_instance(self, gpu_instance: object, profile_id: object,
                                 start: int | None, size: int | None, out: object) -> None:
        found = self.gpu_instance(gpu_instance)
        target(out)
        ci_profile = self._ci_profile_id(found, profile_id)
        if size is not None and size != ci_profile.slices:
            raise invalid()
        index = found.slot.index
        with self.store.update() as state:
            gi = self.find_gi(index, state.gpus[index], found.gi.serial)
            ci = mig.create_compute_instance(state, found.slot, gi.gi, gi.profile, ci_profile,
                                             start=start)
        put_handle(out, self.ci_handle(index, ci))

    @symbol
    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: object, profile_id: object,
                                             compute_instance: object) -> None:
        self._create_compute_instance(gpu_instance, profile_id, None, None, compute_instance)

    @symbol
    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(self, gpu_instance: object,
                                                          profile_id: object, placement: object,
                                                          compute_instance: object) -> None:
        p = target(placement)
        self._create_compute_instance(gpu_instance, profile_id, as_int(p.start), as_int(p.size),
                                      compute_instance)

    @symbol
    def nvmlComputeInstanceDestroy(self, compute_instance: object) -> None:
        found = self.compute_instance(compute_instance)
        index = found.slot.index
        with self.store.update() as state:
            gpu = state.gpus[index]
            fresh = self.find_ci(index, gpu, found.ci.serial)
            mig.destroy_compute_instance(gpu, fresh.gi, fresh.ci)
        self.forget_ci(index, found.ci)

    @symbol
    def nvmlGpuInstanceGetComputeInstances(self, gpu_instance: object, profile_id: object,
                                           instances: object, count: object) -> None:
        gi = self.gpu_instance(gpu_instance)
        ci_profile = self._ci_profile_id(gi, profile_id)
        target(count)
        found = sorted((c for c in gi.gi.compute_instances if c.profile_id == ci_profile.id),
                       key=lambda c: c.id)
        held = capacity(instances)
        if held is not None and held < len(found):
            put(count, len(found))
            raise NvmlFailure(Return.ERROR_INSUFFICIENT_SIZE)
        for i, ci in enumerate(found):
            put_handle_at(instances, i, self.ci_handle(gi.slot.index, ci))
        put(count, len(found))

    @symbol
    def nvmlGpuInstanceGetComputeInstanceById(self, gpu_instance: object, ci_id: object,
                                              compute_instance: object) -> None:
        gi = self.gpu_instance(gpu_instance)
        wanted = as_int(ci_id)
        for ci in gi.gi.compute_instances:
            if ci.id == wanted:
                put_handle(compute_instance, self.ci_handle(gi.slot.index, ci))
                return
        raise NvmlFailure(Return.ERROR_NOT_FOUND)

    @symbol
    def nvmlComputeInstanceGetInfo_v2(self, compute_instance: object, info: object) -> None:
        """``info.device`` is the MIG device handle, so its UUID can be read from it."""
        found = self.compute_instance(compute_instance)
        out = target(info)
        index = found.slot.index
        put_pointer_field(out, "device", self.mig_handle(index, found.ci))
        put_pointer_field(out, "gpuInstance", self.gi_handle(index, found.gi))
        out.id = found.ci.id
        out.profileId = found.ci.profile_id
        out.placement.start = found.ci.start
        out.placement.size = found.ci.size

    # --- MIG device handles -------------------------------------------------------------------

    def _mig_device(self, device: object) -> Ci:
        dev = self.device(device)
        if dev.mig is None:
            raise _not_supported()
        return dev.mig

    @symbol
    def nvmlDeviceIsMigDeviceHandle(self, device: object, is_mig: object) -> None:
        put(is_mig, int(self.device(device, live=False).mig is not None))

    @symbol
    def nvmlDeviceGetGpuInstanceId(self, device: object, gi_id: object) -> None:
        put(gi_id, self._mig_device(device).gi.id)

    @symbol
    def nvmlDeviceGetComputeInstanceId(self, device: object, ci_id: object) -> None:
        put(ci_id, self._mig_device(device).ci.id)

    @symbol
    def nvmlDeviceGetMaxMigDeviceCount(self, device: object, count: object) -> None:
        slot, gpu = self.full_gpu(device)
        enabled = slot.model.mig is not None and gpu.mig_current == MIG_ENABLE
        put(count, slot.model.mig.max_gpu_instances if slot.model.mig and enabled else 0)

    @symbol
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: object, index: object,
                                            mig_device: object) -> None:
        """MIG devices in (GPU-instance id, compute-instance id) order."""
        slot, gpu = self.full_gpu(device)
        capability = slot.model.mig
        if capability is None or gpu.mig_current != MIG_ENABLE:
            raise _not_supported()
        i = as_int(index)
        if not 0 <= i < capability.max_gpu_instances:
            raise invalid()
        cis = [ci for gi in sorted(gpu.gpu_instances, key=lambda g: g.id)
               for ci in sorted(gi.compute_instances, key=lambda c: c.id)]
        if i >= len(cis):
            raise NvmlFailure(Return.ERROR_NOT_FOUND)
        put_handle(mig_device, self.mig_handle(slot.index, cis[i]))

    @symbol
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig_device: object,
                                                     device: object) -> None:
        dev = self.device(mig_device, live=False)
        if dev.mig is None:
            raise invalid()
        put_handle(device, self.gpu_handle(dev.slot.index))
