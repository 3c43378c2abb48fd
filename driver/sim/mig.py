"""MIG rules of the simulated GPUs: placement, capacity, ids, lifecycle, mode changes.

Pure functions over :mod:`.state` objects; a rule that says no raises
:class:`~.codes.NvmlFailure` with the code real NVML returns.

Choices the sources leave open (see ``../shared/gpu-profiles/README.md``):

* GPU-instance ids are the lowest free id in 0..14 and compute-instance ids the lowest free
  in 0..7. Real drivers use other (also non-placement) schemes; callers must not care.
* Compute-instance placements (not found in any source) start at multiples of the CI size
  rounded up to a power of two, as GPU-instance memory placements do (3g at 0 and 4). This
  reproduces every documented CI instance count and the observed ``0:1``, ``1:1`` pair.
* A ``+me`` GI does not exclude other 1g GIs (the mig-parted rule is unconfirmed).
"""

from __future__ import annotations

from .codes import MAX_COMPUTE_INSTANCE_IDS, MAX_GPU_INSTANCE_IDS, MIG_ENABLE, NvmlFailure, Return
from .profiles import (
    ComputeInstanceProfile,
    GpuInstanceProfile,
    GpuModel,
    GpuSlot,
    NodeProfile,
    mig_uuid,
)
from .state import ComputeInstanceState, GpuInstanceState, GpuState, NodeState


def _span(start: int, size: int) -> set[int]:
    return set(range(start, start + size))


def _occupied(gpu: GpuState) -> set[int]:
    taken: set[int] = set()
    for gi in gpu.gpu_instances:
        taken |= _span(gi.start, gi.size)
    return taken


def _count(gpu: GpuState, profile_id: int) -> int:
    return sum(1 for gi in gpu.gpu_instances if gi.profile_id == profile_id)


def _free_starts(gpu: GpuState, profile: GpuInstanceProfile) -> list[int]:
    """Placement starts of ``profile`` that overlap no existing GI, in driver order."""
    taken = _occupied(gpu)
    return [s for s in profile.create_order if not _span(s, profile.placement_size) & taken]


def remaining_gpu_instances(gpu: GpuState, profile: GpuInstanceProfile) -> int:
    # Placements of one profile never overlap each other, so every free one can be used.
    return max(0, min(profile.max_instances - _count(gpu, profile.id),
                      len(_free_starts(gpu, profile))))


def _lowest_free(used: set[int], limit: int) -> int:
    for candidate in range(limit):
        if candidate not in used:
            return candidate
    raise NvmlFailure(Return.ERROR_INSUFFICIENT_RESOURCES)


def create_gpu_instance(state: NodeState, gpu_index: int, profile: GpuInstanceProfile,
                        start: int | None) -> GpuInstanceState:
    """Create a GI at ``start`` (``None``: the driver's choice); MIG must already be on."""
    gpu = state.gpus[gpu_index]
    if gpu.mig_current != MIG_ENABLE:
        raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
    if start is not None and start not in profile.placement_starts:
        raise NvmlFailure(Return.ERROR_INVALID_ARGUMENT)
    if _count(gpu, profile.id) >= profile.max_instances:
        raise NvmlFailure(Return.ERROR_INSUFFICIENT_RESOURCES)
    free = _free_starts(gpu, profile)
    if start is None:
        start = free[0] if free else None
    if start is None or start not in free:
        raise NvmlFailure(Return.ERROR_INSUFFICIENT_RESOURCES)
    gi_id = _lowest_free({gi.id for gi in gpu.gpu_instances}, MAX_GPU_INSTANCE_IDS)
    gi = GpuInstanceState(id=gi_id, profile_id=profile.id, start=start,
                          size=profile.placement_size, serial=state.next_serial())
    gpu.gpu_instances.append(gi)
    return gi


def destroy_gpu_instance(gpu: GpuState, gi: GpuInstanceState) -> None:
    # Processes run on compute instances, so "CIs exist" covers "processes exist" too.
    if gi.compute_instances:
        raise NvmlFailure(Return.ERROR_IN_USE)
    gpu.gpu_instances.remove(gi)


def compute_instance_starts(gi_slices: int, ci_slices: int) -> list[int]:
    """Possible CI placement starts (compute slices) in a GI with ``gi_slices`` slices."""
    align = 1
    while align < ci_slices:
        align *= 2
    return [s for s in range(0, gi_slices, align) if s + ci_slices <= gi_slices]


def remaining_compute_instances(gi: GpuInstanceState, ci: ComputeInstanceProfile,
                                gi_slices: int) -> int:
    return max(0, min(ci.max_instances - _ci_count(gi, ci.id),
                      len(_free_ci_starts(gi, ci, gi_slices))))


def _ci_count(gi: GpuInstanceState, profile_id: int) -> int:
    return sum(1 for c in gi.compute_instances if c.profile_id == profile_id)


def _free_ci_starts(gi: GpuInstanceState, ci: ComputeInstanceProfile, gi_slices: int) -> list[int]:
    taken: set[int] = set()
    for c in gi.compute_instances:
        taken |= _span(c.start, c.size)
    return [s for s in compute_instance_starts(gi_slices, ci.slices)
            if not _span(s, ci.slices) & taken]


def create_compute_instance(state: NodeState, slot: GpuSlot, gi: GpuInstanceState,
                            gi_profile: GpuInstanceProfile, ci: ComputeInstanceProfile, *,
                            start: int | None) -> ComputeInstanceState:
    """Create a CI in ``gi`` at compute-slice ``start`` (``None``: lowest free)."""
    if start is not None and start not in compute_instance_starts(gi_profile.slices, ci.slices):
        raise NvmlFailure(Return.ERROR_INVALID_ARGUMENT)
    if _ci_count(gi, ci.id) >= ci.max_instances:
        raise NvmlFailure(Return.ERROR_INSUFFICIENT_RESOURCES)
    free = _free_ci_starts(gi, ci, gi_profile.slices)
    if start is None:
        start = free[0] if free else None
    if start is None or start not in free:
        raise NvmlFailure(Return.ERROR_INSUFFICIENT_RESOURCES)
    ci_id = _lowest_free({c.id for c in gi.compute_instances}, MAX_COMPUTE_INSTANCE_IDS)
    serial = state.next_serial()
    created = ComputeInstanceState(
        id=ci_id, profile_id=ci.id, start=start, size=ci.slices, serial=serial,
        uuid=mig_uuid(slot.uuid, gi.id, ci_id, serial),
    )
    gi.compute_instances.append(created)
    return created


def destroy_compute_instance(gpu: GpuState, gi: GpuInstanceState,
                             ci: ComputeInstanceState) -> None:
    if any(p.mig_uuid == ci.uuid for p in gpu.processes):
        raise NvmlFailure(Return.ERROR_IN_USE)
    gi.compute_instances.remove(ci)


def set_mig_mode(gpu: GpuState, model: GpuModel, mode: int) -> Return:
    """Request a MIG mode; returns the activation status ``nvmlDeviceSetMigMode`` reports.

    The request "resets" the GPU at once when it is idle (no processes, and for a disable
    no GPU instances left): the new mode is current. Otherwise the status is IN_USE and
    Ampere keeps the request pending until a later idle request or a GPU reset, while
    Hopper+ (reset-less toggling) simply leaves the mode as it was.
    """
    if model.mig is None:
        raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
    if gpu.mig_current == gpu.mig_pending == mode:
        return Return.SUCCESS  # nothing to change, nothing to reset
    busy = bool(gpu.processes) or (mode != MIG_ENABLE and bool(gpu.gpu_instances))
    if not busy:
        gpu.mig_current = gpu.mig_pending = mode
        return Return.SUCCESS
    if model.mig.resetless_toggle:
        return Return.ERROR_IN_USE
    gpu.mig_pending = mode
    # Asking for the current mode again just withdraws the pending change.
    return Return.SUCCESS if gpu.mig_pending == gpu.mig_current else Return.ERROR_IN_USE


def reset_gpu(gpu: GpuState) -> None:
    """A GPU reset: the pending MIG mode applies, MIG devices and compute modes are gone."""
    if gpu.processes:
        raise NvmlFailure(Return.ERROR_IN_USE)
    gpu.mig_current = gpu.mig_pending
    gpu.gpu_instances.clear()
    gpu.compute_mode = 0


def full_compute_profile(profile: GpuInstanceProfile) -> ComputeInstanceProfile:
    """The CI profile that spans the whole GI (what ``nvidia-smi mig -cgi … -C`` creates)."""
    for ci in profile.compute_profiles:
        if ci.slices == profile.slices:
            return ci
    raise ValueError(f"{profile.name} has no full-size compute instance profile")


def initial_state(node: NodeProfile) -> NodeState:
    """Fresh state for a node profile, with its pre-created (static) MIG instances."""
    state = NodeState(profile=node.name, gpus=[])
    for slot in node.gpus:
        mode = MIG_ENABLE if slot.mig_enabled else 0
        state.gpus.append(GpuState(mig_current=mode, mig_pending=mode))
        for profile, start in slot.mig_instances:
            try:
                gi = create_gpu_instance(state, slot.index, profile, start)
                create_compute_instance(state, slot, gi, profile,
                                        full_compute_profile(profile), start=None)
            except NvmlFailure as exc:
                raise ValueError(f"{node.name}: GPU {slot.index} cannot hold "
                                 f"{profile.name}@{start}: {exc}") from None
    return state
