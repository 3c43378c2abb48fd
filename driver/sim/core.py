"""What every part of the simulated library shares: init count, state, handle resolution."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from .cabi import HandleKey, HandleTable, invalid
from .codes import NvmlFailure, Return
from .mig import initial_state
from .profiles import (
    ComputeInstanceProfile,
    GpuInstanceProfile,
    GpuSlot,
    NodeProfile,
    node_profile,
)
from .state import ComputeInstanceState, GpuInstanceState, GpuState, NodeState, StateStore

P = ParamSpec("P")
L = TypeVar("L", bound="LibraryCore")

GPU = "gpu"
GPU_INSTANCE = "gi"
COMPUTE_INSTANCE = "ci"
MIG_DEVICE = "mig"
EVENT_SET = "events"


def symbol(fn: Callable[Concatenate[L, P], None]) -> Callable[Concatenate[L, P], int]:
    """Make a method an NVML C symbol: UNINITIALIZED before ``nvmlInit``, the code of a
    raised :class:`NvmlFailure`, otherwise SUCCESS."""

    @functools.wraps(fn)
    def call(self: L, /, *args: P.args, **kwargs: P.kwargs) -> int:
        if self.init_count <= 0:
            return int(Return.ERROR_UNINITIALIZED)
        try:
            fn(self, *args, **kwargs)
        except NvmlFailure as exc:
            return int(exc.code)
        return int(Return.SUCCESS)

    return call


@dataclass(frozen=True)
class Gi:
    """A live GPU instance with everything needed to describe it."""

    slot: GpuSlot
    gpu: GpuState
    gi: GpuInstanceState
    profile: GpuInstanceProfile


@dataclass(frozen=True)
class Ci:
    """A live compute instance (= a MIG device) with its GPU instance."""

    slot: GpuSlot
    gpu: GpuState
    gi: GpuInstanceState
    gi_profile: GpuInstanceProfile
    ci: ComputeInstanceState
    profile: ComputeInstanceProfile


@dataclass(frozen=True)
class Device:
    """What a device handle names: a full GPU, or a MIG device when ``mig`` is set."""

    slot: GpuSlot
    gpu: GpuState
    mig: Ci | None


class LibraryCore:
    """Shared machinery of :class:`~.library.SimulatedNvml`."""

    def __init__(self, profile: str, state_dir: Path) -> None:
        self.node: NodeProfile = node_profile(profile)
        self.store = StateStore(state_dir)
        self.store.seed(lambda: initial_state(self.node))
        found = self.store.read().profile
        if found != profile:
            raise ValueError(
                f"{state_dir} holds a simulated {found!r} node, not {profile!r}; "
                "use another state directory")
        self.handles = HandleTable()
        self.init_count = 0
        self._init_lock = threading.Lock()

    # --- state ---------------------------------------------------------------------------

    def state(self) -> NodeState:
        return self.store.read()

    def gpu_handle(self, index: int) -> int:
        return self.handles.address((GPU, index, 0))

    def gi_handle(self, gpu_index: int, gi: GpuInstanceState) -> int:
        return self.handles.address((GPU_INSTANCE, gpu_index, gi.serial))

    def ci_handle(self, gpu_index: int, ci: ComputeInstanceState) -> int:
        return self.handles.address((COMPUTE_INSTANCE, gpu_index, ci.serial))

    def mig_handle(self, gpu_index: int, ci: ComputeInstanceState) -> int:
        return self.handles.address((MIG_DEVICE, gpu_index, ci.serial))

    # --- handle resolution (INVALID_ARGUMENT for anything unknown or gone) ---------------

    def _key(self, handle: object, *kinds: str) -> HandleKey:
        key = self.handles.key(handle)
        if key is None or key[0] not in kinds:
            raise invalid()
        return key

    def _live(self, gpu: GpuState, live: bool) -> None:
        if live and gpu.lost:
            raise NvmlFailure(Return.ERROR_GPU_IS_LOST)

    def full_gpu(self, handle: object, *, live: bool = True) -> tuple[GpuSlot, GpuState]:
        """A full-GPU handle; ``live`` refuses a lost GPU with GPU_IS_LOST."""
        _, index, _ = self._key(handle, GPU)
        gpu = self.state().gpus[index]
        self._live(gpu, live)
        return self.node.gpus[index], gpu

    def device(self, handle: object, *, live: bool = True) -> Device:
        """A full-GPU or MIG-device handle."""
        kind, index, serial = self._key(handle, GPU, MIG_DEVICE)
        gpu = self.state().gpus[index]
        self._live(gpu, live)
        slot = self.node.gpus[index]
        if kind == GPU:
            return Device(slot, gpu, None)
        return Device(slot, gpu, self.find_ci(index, gpu, serial))

    def gpu_instance(self, handle: object) -> Gi:
        _, index, serial = self._key(handle, GPU_INSTANCE)
        gpu = self.state().gpus[index]
        self._live(gpu, True)
        return self.find_gi(index, gpu, serial)

    def compute_instance(self, handle: object) -> Ci:
        _, index, serial = self._key(handle, COMPUTE_INSTANCE)
        gpu = self.state().gpus[index]
        self._live(gpu, True)
        return self.find_ci(index, gpu, serial)

    def find_gi(self, index: int, gpu: GpuState, serial: int) -> Gi:
        """The GI with ``serial`` in ``gpu`` (which may be a fresh copy inside an update)."""
        slot = self.node.gpus[index]
        for gi in gpu.gpu_instances:
            if gi.serial == serial:
                return Gi(slot, gpu, gi, self._gi_profile(slot, gi))
        raise invalid()

    def find_ci(self, index: int, gpu: GpuState, serial: int) -> Ci:
        slot = self.node.gpus[index]
        for gi in gpu.gpu_instances:
            for ci in gi.compute_instances:
                if ci.serial == serial:
                    gi_profile = self._gi_profile(slot, gi)
                    ci_profile = gi_profile.compute_profile(ci.profile_id)
                    if ci_profile is None:
                        raise invalid()
                    return Ci(slot, gpu, gi, gi_profile, ci, ci_profile)
        raise invalid()

    @staticmethod
    def _gi_profile(slot: GpuSlot, gi: GpuInstanceState) -> GpuInstanceProfile:
        profile = slot.model.mig.by_id(gi.profile_id) if slot.model.mig else None
        if profile is None:
            raise invalid()
        return profile
