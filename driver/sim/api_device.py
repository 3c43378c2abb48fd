"""NVML symbols that describe one device: identity, memory, NVLink, compute mode, processes.

Identity (name, UUID, PCI, index, minor, architecture, CUDA CC, brand, NUMA node) is what
NVML caches at init, so it still answers for a lost GPU; everything else says GPU_IS_LOST.
Calls marked "MIG too" accept a MIG device handle as real NVML does.
"""

from __future__ import annotations

import time
from typing import Any

from .api_mig import fill_shared_engines
from .api_usage import load_memory_bytes
from .cabi import as_int, capacity, invalid, put, put_text, struct_version, target
from .codes import (
    COMPUTEMODE_DEFAULT,
    COMPUTEMODE_EXCLUSIVE_PROCESS,
    COMPUTEMODE_EXCLUSIVE_THREAD,
    COMPUTEMODE_PROHIBITED,
    MIG_ENABLE,
    NVLINK_DEVICE_TYPE_GPU,
    NVLINK_DEVICE_TYPE_SWITCH,
    VALUE_NOT_AVAILABLE_UINT,
    NvmlFailure,
    Return,
)
from .core import Device, LibraryCore, symbol
from .profiles import NvLink, PciAddress
from .state import ProcessState

_MIB = 1024 * 1024
_ARCH_HOPPER = 9  # nvmlDeviceArchitecture_t
_ADDRESSING_MODE_HMM = 1  # nvmlDeviceAddressingModeType_t


def _fill_pci(info: Any, pci: PciAddress, device_id: int) -> None:
    info.busIdLegacy = pci.bus_id_legacy.encode()
    info.busId = pci.bus_id.encode()
    info.domain = pci.domain
    info.bus = pci.bus
    info.device = pci.device
    info.pciDeviceId = device_id
    info.pciSubSystemId = 0  # not in the sources


class DeviceApi(LibraryCore):
    # --- identity -----------------------------------------------------------------------------

    @symbol
    def nvmlDeviceGetName(self, device: object, name: object, length: object) -> None:
        """MIG too: ``NVIDIA A100-SXM4-40GB MIG 1g.5gb``."""
        dev = self.device(device, live=False)
        text = dev.slot.model.name
        if dev.mig is not None:
            text += f" MIG {dev.mig.gi_profile.ci_name(dev.mig.profile)}"
        put_text(name, length, text)

    @symbol
    def nvmlDeviceGetUUID(self, device: object, uuid: object, length: object) -> None:
        """MIG too: ``MIG-…``."""
        dev = self.device(device, live=False)
        put_text(uuid, length, dev.mig.ci.uuid if dev.mig else dev.slot.uuid)

    @symbol
    def nvmlDeviceGetMinorNumber(self, device: object, minor: object) -> None:
        put(minor, self.full_gpu(device, live=False)[0].index)

    @symbol
    def nvmlDeviceGetIndex(self, device: object, index: object) -> None:
        """The enumeration index, which skips pulled boards (the minor number does not)."""
        slot, gpu = self.full_gpu(device, live=False)
        if not gpu.enumerated:
            raise NvmlFailure(Return.ERROR_GPU_IS_LOST)
        put(index, self.present(self.state()).index(slot.index))

    @symbol
    def nvmlDeviceGetPciInfo_v3(self, device: object, pci: object) -> None:
        slot, _ = self.full_gpu(device, live=False)
        _fill_pci(target(pci), slot.pci, slot.model.pci_device_id)

    @symbol
    def nvmlDeviceGetArchitecture(self, device: object, arch: object) -> None:
        put(arch, self.device(device, live=False).slot.model.architecture)

    @symbol
    def nvmlDeviceGetCudaComputeCapability(self, device: object, major: object,
                                           minor: object) -> None:
        cc = self.device(device, live=False).slot.model.cuda_cc
        put(major, cc[0])
        put(minor, cc[1])

    @symbol
    def nvmlDeviceGetBrand(self, device: object, brand: object) -> None:
        put(brand, self.device(device, live=False).slot.model.brand)

    @symbol
    def nvmlDeviceGetNumaNodeId(self, device: object, node: object) -> None:
        put(node, self.full_gpu(device, live=False)[0].numa_node)

    @symbol
    def nvmlDeviceGetAddressingMode(self, device: object, mode: object) -> None:
        """HMM on Hopper and newer (the simulated nodes are x86 with the open kernel
        module); NOT_SUPPORTED before, as on platforms without coherent addressing."""
        architecture = self.device(device, live=False).slot.model.architecture
        if architecture < _ARCH_HOPPER:
            raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
        info = target(mode)
        if struct_version(info) != 1:
            raise NvmlFailure(Return.ERROR_ARGUMENT_VERSION_MISMATCH)
        info.value = _ADDRESSING_MODE_HMM

    # --- memory and attributes (MIG too) ------------------------------------------------------

    @staticmethod
    def _memory(dev: Device) -> tuple[int, int]:
        """(total, used) bytes; used = the simulated processes' and loads' memory."""
        now = time.time()
        if dev.mig is None:
            total = dev.slot.model.memory_mib * _MIB
            procs = dev.gpu.processes
            # A whole GPU's memory includes its MIG devices' loads.
            loaded = sum(load.memory_bytes for load in dev.gpu.loads if load.active(now))
        else:
            total = dev.mig.gi_profile.memory_mib * _MIB
            procs = [p for p in dev.gpu.processes if p.mig_uuid == dev.mig.ci.uuid]
            loaded = load_memory_bytes(dev.gpu, dev.mig.ci.uuid, now)
        used = min(total, sum(p.used_memory_mib for p in procs) * _MIB + loaded)
        return total, used

    @symbol
    def nvmlDeviceGetMemoryInfo(self, device: object, memory: object) -> None:
        total, used = self._memory(self.device(device))
        info = target(memory)
        info.total, info.used, info.free = total, used, total - used

    @symbol
    def nvmlDeviceGetMemoryInfo_v2(self, device: object, memory: object) -> None:
        total, used = self._memory(self.device(device))
        info = target(memory)
        if struct_version(info) != 2:
            raise NvmlFailure(Return.ERROR_ARGUMENT_VERSION_MISMATCH)
        info.total, info.reserved, info.used, info.free = total, 0, used, total - used

    @symbol
    def nvmlDeviceGetAttributes_v2(self, device: object, attributes: object) -> None:
        dev = self.device(device)
        info = target(attributes)
        if dev.mig is None:
            # Full GPU: all SMs and memory; engine counts of the full-size MIG profile where
            # the model has one (the sources give no non-MIG engine counts).
            model = dev.slot.model
            full = max(model.mig.profiles, key=lambda p: p.slices) if model.mig else None
            info.multiprocessorCount = model.multiprocessors
            fill_shared_engines(info, full)
            info.gpuInstanceSliceCount = 0
            info.computeInstanceSliceCount = 0
            info.memorySizeMB = model.memory_mib
            return
        gi, ci = dev.mig.gi_profile, dev.mig.profile
        info.multiprocessorCount = gi.ci_multiprocessors(ci)
        fill_shared_engines(info, gi)
        info.gpuInstanceSliceCount = gi.slices
        info.computeInstanceSliceCount = ci.slices
        info.memorySizeMB = gi.memory_mib

    # --- NVLink -------------------------------------------------------------------------------

    def _link(self, device: object, link: object) -> NvLink:
        slot, _ = self.full_gpu(device)
        if not slot.nvlinks:
            raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
        n = as_int(link)
        if not 0 <= n < len(slot.nvlinks):
            raise invalid()
        return slot.nvlinks[n]

    @symbol
    def nvmlDeviceGetNvLinkState(self, device: object, link: object, active: object) -> None:
        self._link(device, link)
        put(active, 1)

    @symbol
    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, device: object, link: object,
                                            pci: object) -> None:
        nvlink = self._link(device, link)
        _fill_pci(target(pci), nvlink.remote, nvlink.remote_device_id)

    @symbol
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, device: object, link: object,
                                            kind: object) -> None:
        nvlink = self._link(device, link)
        put(kind, NVLINK_DEVICE_TYPE_SWITCH if nvlink.remote_is_switch else NVLINK_DEVICE_TYPE_GPU)

    # --- compute mode (MIG too) ---------------------------------------------------------------

    @symbol
    def nvmlDeviceGetComputeMode(self, device: object, mode: object) -> None:
        dev = self.device(device)
        put(mode, dev.mig.ci.compute_mode if dev.mig else dev.gpu.compute_mode)

    @symbol
    def nvmlDeviceSetComputeMode(self, device: object, mode: object) -> None:
        """On a GPU in MIG mode the mode belongs to each MIG device, not to the parent."""
        dev = self.device(device)
        value = as_int(mode)
        if value == COMPUTEMODE_EXCLUSIVE_THREAD:
            raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
        if value not in (COMPUTEMODE_DEFAULT, COMPUTEMODE_PROHIBITED,
                         COMPUTEMODE_EXCLUSIVE_PROCESS):
            raise invalid()
        index = dev.slot.index
        with self.store.update() as state:
            gpu = state.gpus[index]
            if dev.mig is None:
                if gpu.mig_current == MIG_ENABLE:
                    raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
                gpu.compute_mode = value
            else:
                self.find_ci(index, gpu, dev.mig.ci.serial).ci.compute_mode = value

    # --- processes (MIG too) ------------------------------------------------------------------

    @staticmethod
    def _process_ids(dev: Device, proc: ProcessState) -> tuple[int, int]:
        if proc.mig_uuid is None:
            return VALUE_NOT_AVAILABLE_UINT, VALUE_NOT_AVAILABLE_UINT
        found = dev.gpu.mig_device(proc.mig_uuid)
        return (found[0].id, found[1].id) if found else (VALUE_NOT_AVAILABLE_UINT,) * 2

    @symbol
    def nvmlDeviceGetComputeRunningProcesses_v3(self, device: object, count: object,
                                                infos: object) -> None:
        """Two-call protocol: NULL array (or too small) answers INSUFFICIENT_SIZE + count."""
        dev = self.device(device)
        procs = dev.gpu.processes
        if dev.mig is not None:
            procs = [p for p in procs if p.mig_uuid == dev.mig.ci.uuid]
        room = as_int(target(count).value)
        held = None if infos is None else capacity(infos)
        if held is not None:
            room = min(room, held)
        put(count, len(procs))
        if not procs:
            return
        if infos is None or room < len(procs):
            raise NvmlFailure(Return.ERROR_INSUFFICIENT_SIZE)
        array = target(infos)
        for i, proc in enumerate(procs):
            gi_id, ci_id = self._process_ids(dev, proc)
            entry = array[i]
            entry.pid = proc.pid
            entry.usedGpuMemory = proc.used_memory_mib * _MIB
            entry.gpuInstanceId = gi_id
            entry.computeInstanceId = ci_id
