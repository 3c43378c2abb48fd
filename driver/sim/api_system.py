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

    # Only boards in their slots are enumerated; device indexes close up around a pulled
    # one, as they do when a GPU is missing at driver load.

    @symbol
    def nvmlDeviceGetCount_v2(self, count: object) -> None:
        put(count, len(self.present(self.state())))

    @symbol
    def nvmlDeviceGetHandleByIndex_v2(self, index: object, device: object) -> None:
        i = as_int(index)
        present = self.present(self.state())
        if not 0 <= i < len(present):
            raise invalid()
        put_handle(device, self.gpu_handle(present[i]))

    @symbol
    def nvmlDeviceGetHandleByUUID(self, uuid: object, device: object) -> None:
        """Full GPUs by ``GPU-…`` and MIG devices by ``MIG-…`` UUID."""
        wanted = as_text(uuid).strip()
        state = self.state()
        for index in self.present(state):
            if self.slot(index, state.gpus[index]).uuid == wanted:
                put_handle(device, self.gpu_handle(index))
                return
        for index in self.present(state):
            found = state.gpus[index].mig_device(wanted)
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
        for index in self.present(self.state()):
            if self.node.gpus[index].pci == wanted:
                put_handle(device, self.gpu_handle(index))
                return
        raise NvmlFailure(Return.ERROR_NOT_FOUND)
