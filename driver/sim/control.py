"""``SimControl``: the test and operator side of a simulated node (processes, XIDs, faults,
hardware changes).

Works from any process on the same state directory: every change is one locked update of
the state file, which every simulated NVML call (in any process) sees on its next call.

Hardware changes are made per slot, as on a real server: a board pulled out of its slot
(:meth:`SimControl.remove_gpu`) is not enumerated any more and answers GPU_IS_LOST to a
process still holding its handle; :meth:`SimControl.insert_gpu` puts the same board back
and :meth:`SimControl.replace_gpu` puts a new board of the same model (a new UUID, MIG off,
nothing on it) in. A whole node is swapped by installing another profile on the same state
directory (:func:`gpudra.driver.sim.install`). GPU indexes here are slots (the minor
number), which stay put when a board is missing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from . import mig, recovery
from .codes import MIG_ENABLE, NvmlFailure
from .profiles import NodeProfile, gpu_uuid, node_profile
from .state import GpuState, LoadState, NodeState, ProcessState, StateStore, XidEvent


class SimControl:
    """Drive a simulated node from outside NVML."""

    def __init__(self, state_dir: Path) -> None:
        self.store = StateStore(state_dir)
        if not self.store.exists():
            raise FileNotFoundError(
                f"no simulated node in {state_dir} (install() the simulator there first)")
        self.node: NodeProfile = node_profile(self.store.read().profile)

    def _gpu(self, state: NodeState, gpu_index: int, *, present: bool = True) -> GpuState:
        if not 0 <= gpu_index < len(state.gpus):
            raise ValueError(f"no GPU {gpu_index} on this {len(state.gpus)}-GPU node")
        gpu = state.gpus[gpu_index]
        if present and not gpu.present:
            raise ValueError(f"GPU {gpu_index} is removed (insert-gpu or replace-gpu first)")
        return gpu

    def gpu_uuid(self, gpu_index: int) -> str:
        """The UUID of the board in slot ``gpu_index`` now."""
        gpu = self._gpu(self.store.read(), gpu_index, present=False)
        return gpu_uuid(self.node.name, gpu_index, gpu.board)

    def add_process(self, gpu_index: int, pid: int, mig_uuid: str | None = None, *,
                    used_memory_mib: int = 0) -> None:
        """Start a (pretend) CUDA process on a GPU, or on one of its MIG devices."""
        with self.store.update() as state:
            gpu = self._gpu(state, gpu_index)
            if mig_uuid is None and gpu.mig_current == MIG_ENABLE:
                raise ValueError(f"GPU {gpu_index} is in MIG mode: a process needs a MIG device")
            if mig_uuid is not None and gpu.mig_device(mig_uuid) is None:
                raise ValueError(f"GPU {gpu_index} has no MIG device {mig_uuid}")
            if any(p.pid == pid for p in gpu.processes):
                raise ValueError(f"process {pid} already runs on GPU {gpu_index}")
            gpu.processes.append(ProcessState(pid, mig_uuid, used_memory_mib))

    def remove_process(self, gpu_index: int, pid: int) -> None:
        with self.store.update() as state:
            gpu = self._gpu(state, gpu_index)
            before = len(gpu.processes)
            gpu.processes = [p for p in gpu.processes if p.pid != pid]
            if len(gpu.processes) == before:
                raise ValueError(f"process {pid} does not run on GPU {gpu_index}")

    def set_load(self, gpu_index: int, *, mig_uuid: str | None = None, sm_percent: float = 0.0,
                 memory_bytes: int = 0, duration: float | None = None) -> None:
        """Simulated work on a GPU or MIG device (replacing any there) for ``duration`` s."""
        if not 0 <= sm_percent <= 100:
            raise ValueError(f"SM utilisation {sm_percent} is not within 0-100 %")
        if memory_bytes < 0:
            raise ValueError(f"memory {memory_bytes} is negative")
        if duration is not None and duration <= 0:
            raise ValueError(f"duration {duration} is not positive")
        until = None if duration is None else time.time() + duration
        with self.store.update() as state:
            gpu = self._gpu(state, gpu_index)
            if mig_uuid is None and gpu.mig_current == MIG_ENABLE:
                raise ValueError(f"GPU {gpu_index} is in MIG mode: load needs a MIG device")
            if mig_uuid is not None and gpu.mig_device(mig_uuid) is None:
                raise ValueError(f"GPU {gpu_index} has no MIG device {mig_uuid}")
            now = time.time()
            gpu.loads = [load for load in gpu.loads
                         if load.mig_uuid != mig_uuid and load.active(now)]
            gpu.loads.append(LoadState(mig_uuid, sm_percent, memory_bytes, until))

    def clear_load(self, gpu_index: int, mig_uuid: str | None = None) -> None:
        """Stop the simulated work on a GPU or MIG device."""
        with self.store.update() as state:
            gpu = self._gpu(state, gpu_index)
            gpu.loads = [load for load in gpu.loads if load.mig_uuid != mig_uuid]

    def raise_xid(self, gpu_index: int, xid: int, mig_uuid: str | None = None, *,
                  recovery_action: int | None = None) -> None:
        """Deliver an XID critical error to every event set registered for the GPU; with
        ``recovery_action``, the driver also asks for that recovery (in the same update, so
        a watcher that reads the field on the event sees it)."""
        with self.store.update() as state:
            gpu = self._gpu(state, gpu_index)
            if recovery_action is not None:
                if gpu.recovery_action is None:
                    raise ValueError(f"GPU {gpu_index}'s driver does not offer the recovery "
                                     "action field (set_recovery_action first)")
                gpu.recovery_action = recovery_action
            gi_id = ci_id = None
            if mig_uuid is not None:
                found = gpu.mig_device(mig_uuid)
                if found is None:
                    raise ValueError(f"GPU {gpu_index} has no MIG device {mig_uuid}")
                gi_id, ci_id = found[0].id, found[1].id
            state.add_event(XidEvent(state.next_event_seq, gpu_index, xid, gi_id, ci_id))
            state.next_event_seq += 1

    def set_recovery_action(self, gpu_index: int, action: int | None) -> None:
        """What the driver reports as the GPU's recovery action (``recovery.NONE`` once it is
        healthy); None: a driver that does not offer the field."""
        if action is not None and action not in recovery.NAMES.values():
            raise ValueError(f"{action} is not a GPU recovery action")
        with self.store.update() as state:
            self._gpu(state, gpu_index, present=False).recovery_action = action

    def set_gpu_lost(self, gpu_index: int, lost: bool) -> None:
        """A lost GPU ("fallen off the bus") answers GPU_IS_LOST to all but identity calls."""
        with self.store.update() as state:
            self._gpu(state, gpu_index).lost = lost

    def remove_gpu(self, gpu_index: int) -> None:
        """Pull the board out of its slot; its state (MIG layout …) goes with it."""
        with self.store.update() as state:
            self._gpu(state, gpu_index).present = False

    def insert_gpu(self, gpu_index: int) -> None:
        """Put the board that was pulled out back, as it was."""
        with self.store.update() as state:
            gpu = self._gpu(state, gpu_index, present=False)
            if gpu.present:
                raise ValueError(f"GPU {gpu_index} is in its slot already")
            gpu.present = True

    def replace_gpu(self, gpu_index: int) -> None:
        """A new board of the same model in the slot: a new UUID, MIG off, nothing on it."""
        with self.store.update() as state:
            old = self._gpu(state, gpu_index, present=False)
            state.gpus[gpu_index] = GpuState(board=old.board + 1)

    def reset_gpu(self, gpu_index: int) -> None:
        """Reset a GPU: a pending MIG mode applies, all MIG devices are gone, and the driver
        reports no recovery action pending any more (a reset is what it asked for)."""
        with self.store.update() as state:
            gpu = self._gpu(state, gpu_index)
            try:
                mig.reset_gpu(gpu)
            except NvmlFailure:
                raise ValueError(f"GPU {gpu_index} is in use; stop its processes first") from None
            if gpu.recovery_action is not None:
                gpu.recovery_action = recovery.NONE

    def snapshot(self) -> dict[str, Any]:
        """The whole simulated node: static identity plus every piece of mutable state."""
        state = self.store.read()
        gpus = []
        for slot, gpu in zip(self.node.gpus, state.gpus, strict=True):
            profiles = {p.id: p for p in slot.model.mig.profiles} if slot.model.mig else {}
            gpus.append({
                "index": slot.index,
                "uuid": gpu_uuid(self.node.name, slot.index, gpu.board),
                "model": slot.model.key,
                "pci_bus_id": slot.pci.bus_id,
                "mig_mode": {"current": gpu.mig_current, "pending": gpu.mig_pending},
                "compute_mode": gpu.compute_mode,
                "lost": gpu.lost,
                "recovery_action": gpu.recovery_action,
                "present": gpu.present,
                "gpu_instances": [
                    {
                        "id": gi.id,
                        "profile_id": gi.profile_id,
                        "profile": profiles[gi.profile_id].name,
                        "placement": {"start": gi.start, "size": gi.size},
                        "compute_instances": [
                            {
                                "id": ci.id,
                                "profile_id": ci.profile_id,
                                "placement": {"start": ci.start, "size": ci.size},
                                "uuid": ci.uuid,
                                "compute_mode": ci.compute_mode,
                            }
                            for ci in gi.compute_instances
                        ],
                    }
                    for gi in sorted(gpu.gpu_instances, key=lambda g: g.id)
                ],
                "processes": [
                    {"pid": p.pid, "mig_uuid": p.mig_uuid, "used_memory_mib": p.used_memory_mib}
                    for p in gpu.processes
                ],
                "loads": [
                    {"mig_uuid": load.mig_uuid, "sm_percent": load.sm_percent,
                     "memory_bytes": load.memory_bytes, "until": load.until}
                    for load in gpu.loads if load.active(time.time())
                ],
            })
        return {
            "profile": self.node.name,
            "driver_version": self.node.driver_version,
            "cuda_driver_version": self.node.cuda_driver_version,
            "gpus": gpus,
            "events": [
                {"seq": e.seq, "gpu": e.gpu, "xid": e.xid, "gpu_instance_id": e.gpu_instance_id,
                 "compute_instance_id": e.compute_instance_id}
                for e in state.events
            ],
        }
