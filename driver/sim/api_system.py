"""NVML symbols for the library itself, versions, and finding devices."""

from __future__ import annotations

from .cabi import as_int, as_text, invalid, put, put_handle, put_text
from .codes import ERROR_STRINGS, NvmlFailure, Return
from .core import LibraryCore, symbol
from .profiles import PciAddress


class SystemApi(LibraryCore):
    # --- init / shutdown (reference counted, like NVML) -----------------------------------

    def nvmlInitWithFlags(self, flags: object) -> int:
        with self._init_lock:
            self.init_count += 1
        return int(Return.SUCCESS)

    def nvmlShutdown(self) -> int:
        with self._init_lock:
            if self.init_count <= 0:
                return int(Return.ERROR_UNINITIALIZED)
            self.init_count -= 1
        return int(Return.SUCCESS)

    # A plain function, not a bound method: pynvml sets ``fn.restype`` on it.
    @staticmethod
    def nvmlErrorString(result: object) -> bytes:
        try:
            code = as_int(result)
        except NvmlFailure:
            code = int(Return.ERROR_UNKNOWN)
        return ERROR_STRINGS.get(code, ERROR_STRINGS[Return.ERROR_UNKNOWN]).encode()

    # --- versions ---------------------------------------------------------------------------

    @symbol
    def nvmlSystemGetDriverVersion(self, buffer: object, length: object) -> None:
        put_text(buffer, length, self.node.driver_version)

    @symbol
    def nvmlSystemGetNVMLVersion(self, buffer: object, length: object) -> None:
        # NVML's version is the CUDA major version followed by the driver version.
        major = self.node.cuda_driver_version // 1000
        put_text(buffer, length, f"{major}.{self.node.driver_version}")

    @symbol
    def nvmlSystemGetCudaDriverVersion(self, version: object) -> None:
        put(version, self.node.cuda_driver_version)

    @symbol
    def nvmlSystemGetCudaDriverVersion_v2(self, version: object) -> None:
        put(version, self.node.cuda_driver_version)

    # --- device lookup ------------------------------------------------------------------------

    @symbol
    def nvmlDeviceGetCount_v2(self, count: object) -> None:
        put(count, len(self.node.gpus))

    @symbol
    def nvmlDeviceGetHandleByIndex_v2(self, index: object, device: object) -> None:
        i = as_int(index)
        if not 0 <= i < len(self.node.gpus):
            raise invalid()
        put_handle(device, self.gpu_handle(i))

    @symbol
    def nvmlDeviceGetHandleByUUID(self, uuid: object, device: object) -> None:
        """Full GPUs by ``GPU-…`` and MIG devices by ``MIG-…`` UUID."""
        wanted = as_text(uuid).strip()
        for slot in self.node.gpus:
            if slot.uuid == wanted:
                put_handle(device, self.gpu_handle(slot.index))
                return
        for index, gpu in enumerate(self.state().gpus):
            found = gpu.mig_device(wanted)
            if found is not None:
                put_handle(device, self.mig_handle(index, found[1]))
                return
        raise NvmlFailure(Return.ERROR_NOT_FOUND)

    @symbol
    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: object, device: object) -> None:
        try:
            wanted = PciAddress.parse(as_text(bus_id))
        except ValueError:
            raise invalid() from None
        for slot in self.node.gpus:
            if slot.pci == wanted:
                put_handle(device, self.gpu_handle(slot.index))
                return
        raise NvmlFailure(Return.ERROR_NOT_FOUND)
