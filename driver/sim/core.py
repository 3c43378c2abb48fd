"""What every part of the simulated library shares: init count, state, handle resolution."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
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
    gpu_uuid,
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
        if self.store.read().profile != profile:
            # Another profile on an existing node: its GPUs were swapped while it was down.
            self.store.replace(lambda old: new_hardware(old, self.node))
        self.handles = HandleTable()
        self.init_count = 0
        self._init_lock = threading.Lock()
        self._boards: dict[tuple[int, int], GpuSlot] = {}

    # --- state ---------------------------------------------------------------------------

    def state(self) -> NodeState:
        """The node's state; every GPU is lost if its hardware was swapped under us."""
        state = self.store.read()
        if state.profile != self.node.name:
            raise NvmlFailure(Return.ERROR_GPU_IS_LOST)
        return state

    def slot(self, index: int, gpu: GpuState) -> GpuSlot:
        """The slot as its current board makes it (a replaced board has its own UUID)."""
        if gpu.board == 0:
            return self.node.gpus[index]
        key = (index, gpu.board)
        found = self._boards.get(key)
        if found is None:
            found = self._boards[key] = replace(
                self.node.gpus[index], uuid=gpu_uuid(self.node.name, index, gpu.board),
                mig_instances=())
        return found

    def present(self, state: NodeState) -> list[int]:
        """Slot indexes of the GPUs NVML enumerates, in order (a pulled board is skipped)."""
        return [i for i, gpu in enumerate(state.gpus) if gpu.enumerated]

    def gpu_handle(self, index: int) -> int:
        # The board is part of the handle: a handle to a board that was replaced is stale.
        return self.handles.address((GPU, index, self.state().gpus[index].board))

    def gi_handle(self, gpu_index: int, gi: GpuInstanceState) -> int:
        return self.handles.address((GPU_INSTANCE, gpu_index, gi.serial))

    def ci_handle(self, gpu_index: int, ci: ComputeInstanceState) -> int:
        return self.handles.address((COMPUTE_INSTANCE, gpu_index, ci.serial))

    def mig_handle(self, gpu_index: int, ci: ComputeInstanceState) -> int:
        return self.handles.address((MIG_DEVICE, gpu_index, ci.serial))

    def forget_gi(self, gpu_index: int, gi: GpuInstanceState) -> None:
        """This process destroyed ``gi``: its handle only has to stay stale."""
        self.handles.forget((GPU_INSTANCE, gpu_index, gi.serial))

    def forget_ci(self, gpu_index: int, ci: ComputeInstanceState) -> None:
        """This process destroyed ``ci``: its handle and its MIG device's only have to stay
        stale."""
        self.handles.forget((COMPUTE_INSTANCE, gpu_index, ci.serial))
        self.handles.forget((MIG_DEVICE, gpu_index, ci.serial))

    # --- handle resolution (INVALID_ARGUMENT for anything unknown or gone) ---------------

    def _key(self, handle: object, *kinds: str) -> HandleKey:
        key = self.handles.key(handle)
        if key is None or key[0] not in kinds:
            raise invalid()
        return key

    def _live(self, gpu: GpuState, live: bool) -> None:
        # A pulled board answers like one fallen off the bus to a process holding its handle;
        # so does one the nvidia driver let go of (bound to vfio-pci).
        if live and (gpu.lost or not gpu.enumerated):
            raise NvmlFailure(Return.ERROR_GPU_IS_LOST)

    def full_gpu(self, handle: object, *, live: bool = True) -> tuple[GpuSlot, GpuState]:
        """A full-GPU handle; ``live`` refuses a lost GPU with GPU_IS_LOST."""
        _, index, board = self._key(handle, GPU)
        gpu = self.state().gpus[index]
        if board != gpu.board:
            raise NvmlFailure(Return.ERROR_GPU_IS_LOST)  # that board is not in the node
        self._live(gpu, live)
        return self.slot(index, gpu), gpu

    def device(self, handle: object, *, live: bool = True) -> Device:
        """A full-GPU or MIG-device handle."""
        kind, index, serial = self._key(handle, GPU, MIG_DEVICE)
        if kind == GPU:
            slot, gpu = self.full_gpu(handle, live=live)
            return Device(slot, gpu, None)
        gpu = self.state().gpus[index]
        self._live(gpu, live)
        return Device(self.slot(index, gpu), gpu, self.find_ci(index, gpu, serial))

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
        slot = self.slot(index, gpu)
        for gi in gpu.gpu_instances:
            if gi.serial == serial:
                return Gi(slot, gpu, gi, self._gi_profile(slot, gi))
        raise invalid()

    def find_ci(self, index: int, gpu: GpuState, serial: int) -> Ci:
        slot = self.slot(index, gpu)
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


def new_hardware(old: NodeState, node: NodeProfile) -> NodeState:
    """The state of ``node`` fresh from the factory, installed where ``old`` was.

    Event sequence numbers go on from the old node's, so none is ever seen twice.
    """
    fresh = initial_state(node)
    fresh.next_event_seq = old.next_event_seq
    return fresh
