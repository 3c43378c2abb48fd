"""The one seam through which the driver talks to NVML.

Production loads the real ``libnvidia-ml.so.1`` through ``pynvml`` (nvidia-ml-py); with
``simulate`` the simulated library is installed *under* ``pynvml``, so every call below
runs the same ``pynvml`` wrappers either way. Nothing else in gpudra imports ``pynvml``.
Results are plain dataclasses so callers never hold ctypes objects.

One file on purpose: it is the only module allowed to import ``pynvml``
(``tests/test_architecture.py``), so every NVML call, its error mapping and its locking
stay reviewable in one place; splitting it would make two seams.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.faults import crash_point
from gpudra.driver.mig import MigProfile, Placement, profile_name

T = TypeVar("T")

# Profile indexes that exist in NVML (0 .. NVML_GPU_INSTANCE_PROFILE_COUNT-1).
_GI_PROFILE_INDEX_COUNT = 18
_CI_PROFILE_INDEX_COUNT = 9
_NVLINK_MAX_LINKS = 36
NVLINK_REMOTE_GPU = 0
NVLINK_REMOTE_SWITCH = 2
ADDRESSING_MODES = {0: "None", 1: "HMM", 2: "ATS"}
"""nvmlDeviceAddressingModeType_t → the string NVIDIA's driver publishes (go-nvlib's)."""

COMPUTE_MODE_DEFAULT = 0
COMPUTE_MODE_PROHIBITED = 2
COMPUTE_MODE_EXCLUSIVE_PROCESS = 3


class NvmlError(Exception):
    """An NVML call failed; ``code`` is the ``nvmlReturn_t`` value."""

    def __init__(self, operation: str, code: int, message: str) -> None:
        super().__init__(f"{operation}: {message} (NVML error {code})")
        self.operation = operation
        self.code = code

    @property
    def is_not_supported(self) -> bool:
        return self.code == int(pynvml.NVML_ERROR_NOT_SUPPORTED)

    @property
    def is_insufficient_resources(self) -> bool:
        return self.code == int(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    @property
    def is_not_found(self) -> bool:
        return self.code == int(pynvml.NVML_ERROR_NOT_FOUND)

    @property
    def is_gpu_lost(self) -> bool:
        return self.code == int(pynvml.NVML_ERROR_GPU_IS_LOST)


class GpuNotFound(NvmlError):
    """No GPU with this UUID is on the bus: removed, or replaced since it was recorded."""


class NvmlUnavailable(Exception):
    """No usable NVIDIA driver on this machine; the message is one line for humans."""


@dataclass(frozen=True)
class GpuProbe:
    """Static facts about one full GPU."""

    index: int
    minor: int
    uuid: str
    name: str
    brand: int
    architecture: int
    cuda_compute_capability: tuple[int, int]
    memory_bytes: int
    multiprocessors: int
    pci_bus_id: str
    """Normalised ``DDDD:BB:DD.F``, lower case (the form sysfs and DRA use)."""
    numa_node: int | None
    addressing_mode: str | None = None
    """``HMM``, ``ATS`` or ``None`` (coherent platforms); ``None`` (Python) when NVML cannot
    say, as NVIDIA's driver omits the attribute then."""


@dataclass(frozen=True)
class UnreadableGpu:
    """A GPU NVML enumerates but cannot describe: lost, or failing. Only its identity
    (what NVML still answers for a lost GPU) is known, and maybe not even that."""

    index: int
    uuid: str | None
    minor: int | None
    pci_bus_id: str | None
    lost: bool
    """It answered GPU_IS_LOST: fallen off the bus, or it needs a reset."""
    reason: str


@dataclass(frozen=True)
class NvLink:
    """One active NVLink: the PCI bus id at its far end and what sits there."""

    link: int
    remote_bus_id: str
    remote_is_switch: bool


@dataclass(frozen=True)
class MigMode:
    current: bool
    pending: bool


@dataclass(frozen=True)
class MigInstance:
    """One live MIG device: a GPU instance with one compute instance."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile_id: int
    placement: Placement


@dataclass(frozen=True)
class GpuInstance:
    """One GPU instance, with or without compute instances: a bare one (a kill between the
    two creates) is no MIG device, so only an enumeration of GPU instances finds it."""

    gpu_instance_id: int
    profile_id: int
    placement: Placement
    compute_instance_ids: tuple[int, ...]


FABRIC_STATES = {0: "NotSupported", 1: "NotStarted", 2: "InProgress", 3: "Completed"}
"""``nvmlGpuFabricState_t`` values by the names nvidia-smi shows."""


@dataclass(frozen=True)
class FabricInfo:
    """A GPU's place in a multi-node NVLink fabric (``nvmlDeviceGetGpuFabricInfoV``)."""

    cluster_uuid: str
    clique_id: int
    state: str
    """One of :data:`FABRIC_STATES`' names; cluster and clique mean something once Completed."""
    status: int
    """The fabric probe's NVML return code (0: success); meaningful once Completed."""

    @property
    def ready(self) -> bool:
        return self.state == "Completed" and self.status == 0


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:1B:00.0`` → ``0000:1b:00.0`` (NVML's 8-digit domain to the sysfs form)."""
    domain, bus, rest = bus_id.strip().split(":", 2)
    return f"{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}"


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """An initialised NVML session, safe to use from several threads.

    NVML itself is thread-safe, so calls are not serialised here: creating a MIG device
    on one GPU (slow on real hardware) must not hold up work on another.
    The lock only guards this object's handle cache. Callers serialise work per GPU.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._handles: dict[str, Any] = {}
        self._gpm_support: dict[str, bool] = {}
        self._gpm_samples: dict[tuple[str, int | None], Any] = {}

    @contextmanager
    def _call(self, operation: str) -> Iterator[None]:
        try:
            yield
        except pynvml.NVMLError as exc:
            raise NvmlError(operation, int(exc.value), str(exc)) from exc

    def _run(self, operation: str, fn: Callable[[], T]) -> T:
        with self._call(operation):
            return fn()

    def shutdown(self) -> None:
        self._run("nvmlShutdown", pynvml.nvmlShutdown)

    # --- system -----------------------------------------------------------------------

    def driver_version(self) -> str:
        return _decode(self._run("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> int:
        return int(self._run("nvmlSystemGetCudaDriverVersion",
                             pynvml.nvmlSystemGetCudaDriverVersion))

    # --- full GPUs --------------------------------------------------------------------

    def device_count(self) -> int:
        return int(self._run("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))

    def handle(self, uuid: str) -> Any:
        """The device handle for a GPU UUID, cached (UUID lookups can be slow on real GPUs).

        Raises :class:`GpuNotFound` when no such GPU is on the bus.
        """
        with self._lock:
            cached = self._handles.get(uuid)
            if cached is None:
                try:
                    cached = self._run("nvmlDeviceGetHandleByUUID",
                                       lambda: pynvml.nvmlDeviceGetHandleByUUID(uuid))
                except NvmlError as exc:
                    if exc.is_not_found:
                        raise GpuNotFound(f"GPU {uuid}", exc.code,
                                          "not on this node (removed or replaced)") from exc
                    raise
                self._handles[uuid] = cached
            return cached

    def probe_all(self) -> list[GpuProbe | UnreadableGpu]:
        """Every GPU NVML enumerates; one that cannot be read is an :class:`UnreadableGpu`
        (it degrades only itself)."""
        found: list[GpuProbe | UnreadableGpu] = []
        for index in range(self.device_count()):
            try:
                with self._call(f"nvmlDeviceGetHandleByIndex {index}"):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except NvmlError as exc:
                found.append(UnreadableGpu(index, None, None, None, exc.is_gpu_lost, str(exc)))
                continue
            found.append(self._probe_or_identity(index, handle))
        return found

    def probe_gpu(self, index: int, uuid: str) -> GpuProbe | UnreadableGpu:
        """One GPU again (``index`` as enumerated), e.g. a lost one that may answer now."""
        try:
            handle = self.handle(uuid)
        except NvmlError as exc:
            return UnreadableGpu(index, uuid, None, None, exc.is_gpu_lost, str(exc))
        return self._probe_or_identity(index, handle)

    def _probe_or_identity(self, index: int, handle: Any) -> GpuProbe | UnreadableGpu:
        try:
            probe = self._probe(index, handle)
        except NvmlError as exc:
            return self._identity(index, handle, exc)
        with self._lock:
            self._handles[probe.uuid] = handle
        return probe

    @staticmethod
    def _identity(index: int, handle: Any, error: NvmlError) -> UnreadableGpu:
        """What NVML still says about a GPU that fails: identity calls, each if it can."""
        def ask(call: Callable[[], T]) -> T | None:
            try:
                return call()
            except pynvml.NVMLError:
                return None

        uuid = ask(lambda: _decode(pynvml.nvmlDeviceGetUUID(handle)))
        minor = ask(lambda: int(pynvml.nvmlDeviceGetMinorNumber(handle)))
        bus_id = ask(lambda: normalize_bus_id(_decode(pynvml.nvmlDeviceGetPciInfo(handle).busId)))
        lost = error.is_gpu_lost
        reason = ("GPU is lost (NVML GPU_IS_LOST): fallen off the bus, or it needs a reset"
                  if lost else str(error))
        return UnreadableGpu(index, uuid, minor, bus_id, lost, reason)

    def _probe(self, index: int, handle: Any) -> GpuProbe:
        with self._call(f"probe GPU {index}"):
            uuid = _decode(pynvml.nvmlDeviceGetUUID(handle))
            pci = pynvml.nvmlDeviceGetPciInfo(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor_cc = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            attributes = pynvml.nvmlDeviceGetAttributes(handle)
            return GpuProbe(
                index=index,
                minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
                uuid=uuid,
                name=_decode(pynvml.nvmlDeviceGetName(handle)),
                brand=int(pynvml.nvmlDeviceGetBrand(handle)),
                architecture=int(pynvml.nvmlDeviceGetArchitecture(handle)),
                cuda_compute_capability=(int(major), int(minor_cc)),
                memory_bytes=int(memory.total),
                multiprocessors=int(attributes.multiprocessorCount),
                pci_bus_id=normalize_bus_id(_decode(pci.busId)),
                numa_node=self._numa_node(handle),
                addressing_mode=self._addressing_mode(handle),
            )

    def _numa_node(self, handle: Any) -> int | None:
        try:
            node = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
        except pynvml.NVMLError:
            return None
        return node if node >= 0 else None

    def _addressing_mode(self, handle: Any) -> str | None:
        try:
            mode = int(pynvml.nvmlDeviceGetAddressingMode(handle))
        except pynvml.NVMLError:  # NOT_SUPPORTED, or a driver older than the call
            return None
        return ADDRESSING_MODES.get(mode)

    def nvlinks(self, uuid: str) -> list[NvLink]:
        """Active NVLinks of a GPU; empty when it has none or NVML cannot say."""
        handle = self.handle(uuid)
        links: list[NvLink] = []
        with self._lock:
            for link in range(_NVLINK_MAX_LINKS):
                try:
                    if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                        continue
                    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                    kind = int(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
                except pynvml.NVMLError as exc:
                    if exc.value in (pynvml.NVML_ERROR_INVALID_ARGUMENT,
                                     pynvml.NVML_ERROR_NOT_SUPPORTED):
                        break
                    raise NvmlError("nvmlDeviceGetNvLinkState", int(exc.value), str(exc)) from exc
                links.append(NvLink(link, normalize_bus_id(_decode(remote.busId)),
                                    kind == NVLINK_REMOTE_SWITCH))
        return links

    def fabric_info(self, uuid: str) -> FabricInfo | None:
        """The GPU's NVLink fabric cluster and clique; None when the GPU has no multi-node
        NVLink (NOT_SUPPORTED, or a driver older than the call)."""
        handle = self.handle(uuid)
        try:
            info = pynvml.c_nvmlGpuFabricInfo_v2_t()
            try:
                pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
            except pynvml.NVMLError_FunctionNotFound:  # drivers before the V call: v1 struct
                info = pynvml.c_nvmlGpuFabricInfo_t()
                pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        except pynvml.NVMLError as exc:
            if exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED,
                             pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                return None
            raise NvmlError("nvmlDeviceGetGpuFabricInfoV", int(exc.value), str(exc)) from exc
        raw = bytes(info.clusterUuid)
        cluster = (f"{raw[:4].hex()}-{raw[4:6].hex()}-{raw[6:8].hex()}-{raw[8:10].hex()}-"
                   f"{raw[10:].hex()}")
        return FabricInfo(cluster, int(info.cliqueId),
                          FABRIC_STATES.get(int(info.state), f"Unknown({int(info.state)})"),
                          int(info.status))

    # --- compute mode and processes ----------------------------------------------------

    def compute_mode(self, uuid: str) -> int:
        return int(self._run("nvmlDeviceGetComputeMode",
                             lambda: pynvml.nvmlDeviceGetComputeMode(self._any_handle(uuid))))

    def set_compute_mode(self, uuid: str, mode: int) -> None:
        self._run("nvmlDeviceSetComputeMode",
                  lambda: pynvml.nvmlDeviceSetComputeMode(self._any_handle(uuid), mode))

    def running_processes(self, uuid: str) -> list[int]:
        procs = self._run("nvmlDeviceGetComputeRunningProcesses",
                          lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(self.handle(uuid)))
        return [int(p.pid) for p in procs]

    def _any_handle(self, uuid: str) -> Any:
        """Handle for a full GPU (``GPU-…``) or a MIG device (``MIG-…``)."""
        if uuid.startswith("MIG-"):
            with self._lock:
                cached = self._handles.get(uuid)
                if cached is None:
                    cached = self._run("nvmlDeviceGetHandleByUUID",
                                       lambda: pynvml.nvmlDeviceGetHandleByUUID(uuid))
                    self._handles[uuid] = cached
                return cached
        return self.handle(uuid)

    # --- MIG ----------------------------------------------------------------------------

    def mig_mode(self, uuid: str) -> MigMode | None:
        """MIG mode, or ``None`` when the GPU cannot do MIG."""
        try:
            current, pending = self._run("nvmlDeviceGetMigMode",
                                         lambda: pynvml.nvmlDeviceGetMigMode(self.handle(uuid)))
        except NvmlError as exc:
            if exc.is_not_supported:
                return None
            raise
        return MigMode(bool(current), bool(pending))

    def set_mig_mode(self, uuid: str, enabled: bool) -> None:
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        status = self._run("nvmlDeviceSetMigMode",
                           lambda: pynvml.nvmlDeviceSetMigMode(self.handle(uuid), mode))
        if status not in (None, pynvml.NVML_SUCCESS):
            message = _decode(pynvml.nvmlErrorString(status))
            raise NvmlError("nvmlDeviceSetMigMode (activation)", int(status), message)

    def mig_profiles(self, uuid: str, memory_bytes: int) -> list[MigProfile]:
        """Every GPU-instance profile the GPU offers, with its possible placements."""
        handle = self.handle(uuid)
        profiles = []
        for index in range(_GI_PROFILE_INDEX_COUNT):
            try:
                with self._call("nvmlDeviceGetGpuInstanceProfileInfo"):
                    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            except NvmlError as exc:
                # Enumerate until INVALID_ARGUMENT; profiles this GPU lacks are NOT_SUPPORTED.
                if exc.code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
                    break
                if exc.is_not_supported:
                    continue
                raise
            placements = self._placements(handle, int(info.id), int(info.instanceCount))
            profiles.append(MigProfile(
                index=index,
                profile_id=int(info.id),
                slice_count=int(info.sliceCount),
                instance_count=int(info.instanceCount),
                memory_mib=int(info.memorySizeMB),
                multiprocessors=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                encoders=int(info.encoderCount),
                jpeg_engines=int(info.jpegCount),
                ofa_engines=int(info.ofaCount),
                placements=placements,
                name=profile_name(index=index, slice_count=int(info.sliceCount),
                                  memory_mib=int(info.memorySizeMB),
                                  device_total_bytes=memory_bytes),
            ))
        return profiles

    def _placements(self, handle: Any, profile_id: int, capacity: int) -> tuple[Placement, ...]:
        size = max(capacity, 8) * 2
        array = (pynvml.c_nvmlGpuInstancePlacement_t * size)()
        count = ctypes.c_uint(size)
        self._run("nvmlDeviceGetGpuInstancePossiblePlacements",
                  lambda: pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                      handle, profile_id, array, ctypes.byref(count)))
        return tuple(sorted(Placement(int(array[i].start), int(array[i].size))
                            for i in range(count.value)))

    def mig_instances(self, uuid: str) -> list[MigInstance]:
        """Live MIG devices on a GPU (empty when MIG is off)."""
        handle = self.handle(uuid)
        mode = self.mig_mode(uuid)
        if mode is None or not mode.current:
            return []
        with self._call("list MIG devices"):
            placements: dict[int, tuple[int, Placement]] = {}
            for gi in self._gpu_instances(handle):
                info = pynvml.nvmlGpuInstanceGetInfo(gi)
                placements[int(info.id)] = (
                    int(info.profileId),
                    Placement(int(info.placement.start), int(info.placement.size)),
                )
            found = []
            for i in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
                except pynvml.NVMLError as exc:
                    if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                        continue
                    raise
                gi_id = int(pynvml.nvmlDeviceGetGpuInstanceId(mig))
                ci_id = int(pynvml.nvmlDeviceGetComputeInstanceId(mig))
                mig_uuid = _decode(pynvml.nvmlDeviceGetUUID(mig))
                self._handles[mig_uuid] = mig
                profile_id, placement = placements[gi_id]
                found.append(MigInstance(mig_uuid, gi_id, ci_id, profile_id, placement))
        return sorted(found, key=lambda m: (m.placement.start, m.gpu_instance_id))

    def gpu_instances(self, uuid: str) -> list[GpuInstance]:
        """Every GPU instance on a GPU, bare ones included (empty when MIG is off)."""
        handle = self.handle(uuid)
        mode = self.mig_mode(uuid)
        if mode is None or not mode.current:
            return []
        found = []
        with self._call("list GPU instances"):
            for gi in self._gpu_instances(handle):
                info = pynvml.nvmlGpuInstanceGetInfo(gi)
                found.append(GpuInstance(
                    int(info.id), int(info.profileId),
                    Placement(int(info.placement.start), int(info.placement.size)),
                    tuple(sorted(int(pynvml.nvmlComputeInstanceGetInfo(ci).id)
                                 for ci in self._compute_instances(gi)))))
        return sorted(found, key=lambda g: (g.placement.start, g.gpu_instance_id))

    @staticmethod
    def _compute_instances(gi: Any) -> list[Any]:
        instances: list[Any] = []
        for index in range(_CI_PROFILE_INDEX_COUNT):
            try:
                info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, 0)
            except pynvml.NVMLError:
                continue  # a profile this GPU instance does not have
            array = (pynvml.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(0)
            pynvml.nvmlGpuInstanceGetComputeInstances(gi, int(info.id), array,
                                                      ctypes.byref(count))
            instances.extend(array[i] for i in range(count.value))
        return instances

    def _gpu_instances(self, handle: Any) -> list[Any]:
        instances: list[Any] = []
        for index in range(_GI_PROFILE_INDEX_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_INVALID_ARGUMENT:
                    break
                continue
            array = (pynvml.c_nvmlGpuInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(0)
            pynvml.nvmlDeviceGetGpuInstances(handle, int(info.id), array, ctypes.byref(count))
            instances.extend(array[i] for i in range(count.value))
        return instances


    # --- MIG lifecycle -------------------------------------------------------------------

    def create_mig_device(
        self, uuid: str, profile: MigProfile, placement: Placement
    ) -> MigInstance:
        """Create a GPU instance at exactly ``placement`` and its full-size compute instance.

        A taken placement raises :class:`NvmlError` with ``is_insufficient_resources``. When
        the compute instance cannot be made, the GPU instance is destroyed again.
        """
        handle = self.handle(uuid)
        with self._call(f"create {profile.name} at {placement.start}:{placement.size}"):
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile.index)
            c_placement = pynvml.c_nvmlGpuInstancePlacement_t()
            c_placement.start = placement.start
            c_placement.size = placement.size
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, int(info.id), c_placement)
            # A kill here leaves a GPU instance without a compute instance, which NVML's MIG
            # device listing does not show: recovery must enumerate GPU instances.
            crash_point("prepare:after-mig-gpu-instance")
            try:
                gi_id = int(pynvml.nvmlGpuInstanceGetInfo(gi).id)
                ci_profile = self._full_compute_profile(gi, profile.slice_count)
                ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
                ci_id = int(pynvml.nvmlComputeInstanceGetInfo(ci).id)
            except pynvml.NVMLError:
                pynvml.nvmlGpuInstanceDestroy(gi)
                raise
        for instance in self.mig_instances(uuid):
            if instance.gpu_instance_id == gi_id and instance.compute_instance_id == ci_id:
                return instance
        raise NvmlError("find created MIG device", int(pynvml.NVML_ERROR_NOT_FOUND),
                        f"GPU instance {gi_id} / compute instance {ci_id} has no MIG device")

    @staticmethod
    def _full_compute_profile(gi: Any, gi_slices: int) -> int:
        """The compute-instance profile id that spans the whole GPU instance.

        Chosen by slice count, never by a fixed index: a fixed guess is how NVIDIA's driver
        created the wrong CI on A100 7g and B300 1g (upstream issues #1480, #1454).
        """
        best: tuple[int, int] | None = None
        for index in range(9):
            if index == 7:  # 1_SLICE_REV1 is a special-purpose profile
                continue
            try:
                info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, 0)
            except pynvml.NVMLError:
                continue
            slices = int(info.sliceCount)
            if slices <= gi_slices and (best is None or slices > best[0]):
                best = (slices, int(info.id))
        if best is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return best[1]

    def destroy_mig_device(self, uuid: str, gpu_instance_id: int, compute_instance_id: int) -> bool:
        """Destroy a MIG device (compute instance, then GPU instance); ``False`` if it was gone."""
        handle = self.handle(uuid)
        with self._call(f"destroy MIG device {gpu_instance_id}/{compute_instance_id}"):
            try:
                gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            except (pynvml.NVMLError_NotFound, pynvml.NVMLError_NotSupported):
                return False  # destroyed already, or MIG is off and nothing exists
            try:
                ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, compute_instance_id)
            except pynvml.NVMLError_NotFound:
                pass
            else:
                pynvml.nvmlComputeInstanceDestroy(ci)
            pynvml.nvmlGpuInstanceDestroy(gi)
        with self._lock:
            for key in [k for k in self._handles if k.startswith("MIG-")]:
                del self._handles[key]
        return True

    def destroy_gpu_instance(self, uuid: str, gpu_instance_id: int) -> bool:
        """Destroy a GPU instance and whatever compute instances it has; ``False`` if gone."""
        handle = self.handle(uuid)
        with self._call(f"destroy GPU instance {gpu_instance_id}"):
            try:
                gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            except (pynvml.NVMLError_NotFound, pynvml.NVMLError_NotSupported):
                return False
            for ci in self._compute_instances(gi):
                pynvml.nvmlComputeInstanceDestroy(ci)
            pynvml.nvmlGpuInstanceDestroy(gi)
        with self._lock:
            for key in [k for k in self._handles if k.startswith("MIG-")]:
                del self._handles[key]
        return True

    # --- events (XID watching) -----------------------------------------------------------
    #
    # The event wait is the one NVML call that blocks, so it never runs under ``_lock``: a
    # prepare must not queue behind it. NVML itself is thread-safe; the lock only keeps our
    # multi-call sequences (handle caching, MIG create + find) from interleaving, so set-up
    # and teardown of event sets still take it.

    def create_event_set(self) -> EventSet:
        return EventSet(self._run("nvmlEventSetCreate", pynvml.nvmlEventSetCreate))

    def register_xid_events(self, event_set: EventSet, uuid: str) -> bool:
        """Register a full GPU for XID critical errors; ``False`` when it cannot report them.

        Only XIDs are asked for: uncorrectable ECC errors arrive as XIDs too (48, 63, 94 …)
        and a bare ECC event carries nothing the health policy acts on.
        """
        handle = self.handle(uuid)
        with self._call(f"nvmlDeviceRegisterEvents {uuid}"):
            supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
            if not supported & pynvml.nvmlEventTypeXidCriticalError:
                return False
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError,
                                            event_set.raw)
            event_set.add(_handle_address(handle), uuid)
        return True

    def wait_event(
        self, event_set: EventSet, timeout_ms: int
    ) -> XidEvent | GpuLostEvent | None:
        """The next XID of a registered GPU, waiting up to ``timeout_ms``; ``None`` on timeout.

        Takes no lock (see above), so keep ``timeout_ms`` short and call it from one thread.
        """
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set.raw, timeout_ms)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                return None
            if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                return GpuLostEvent()
            raise NvmlError("nvmlEventSetWait", int(exc.value), str(exc)) from exc
        if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
            return None  # a type we did not register for: nothing to report
        uuid = event_set.uuid_of(_handle_address(data.device))
        if uuid is None:
            try:  # an identity call: NVML answers it even for a lost GPU
                uuid = _decode(pynvml.nvmlDeviceGetUUID(data.device))
            except pynvml.NVMLError as exc:
                raise NvmlError("nvmlDeviceGetUUID (event)", int(exc.value), str(exc)) from exc
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        if _NO_INSTANCE_ID in (gi, ci):
            return XidEvent(uuid, int(data.eventData))
        return XidEvent(uuid, int(data.eventData), gi, ci)

    def free_event_set(self, event_set: EventSet) -> None:
        """Free the set (idempotent). Never while another thread waits on it."""
        if event_set.freed:
            return
        event_set.freed = True
        self._run("nvmlEventSetFree", lambda: pynvml.nvmlEventSetFree(event_set.raw))

    def gpu_is_lost(self, uuid: str) -> bool:
        """A cheap probe: does the GPU answer a non-identity query?

        Only GPU_IS_LOST counts as lost; any other failure (NOT_SUPPORTED …) is an answer.
        """
        try:
            self.compute_mode(uuid)
        except NvmlError as exc:
            return exc.is_gpu_lost
        return False

    def gpu_recovery_action(self, uuid: str) -> int | None:
        """The recovery the driver says the GPU needs (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``:
        an ``NVML_GPU_RECOVERY_ACTION_*``, 0 none); None where the driver does not offer the
        field. GPU_IS_LOST and other failures raise."""
        field = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        try:
            values = self._run("nvmlDeviceGetFieldValues",
                               lambda: pynvml.nvmlDeviceGetFieldValues(self.handle(uuid),
                                                                       [field]))
        except NvmlError as exc:
            if exc.is_not_supported or exc.code == int(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                return None
            raise
        entry = values[0]
        if int(entry.nvmlReturn) != int(pynvml.NVML_SUCCESS):
            return None  # the call works, this field does not (an older driver)
        return int(entry.value.uiVal)

    def why_unavailable(self, uuid: str) -> str | None:
        """``None`` when the GPU is on the bus and answers; else why not, in a few words.

        The same cheap probe as :meth:`gpu_is_lost`; a GPU that is not on the bus (removed,
        or replaced by another board) is unavailable too.
        """
        try:
            self.compute_mode(uuid)
        except GpuNotFound:
            return "not on this node (removed or replaced)"
        except NvmlError as exc:
            if exc.is_gpu_lost:
                return "GPU is lost (NVML GPU_IS_LOST): fallen off the bus, or it needs a reset"
        return None

    # --- usage --------------------------------------------------------------------------

    def gpu_usage(self, uuid: str, mig_devices: dict[str, int | None]) -> GpuUsage:
        """One sampling pass over a GPU and the given MIG devices (UUID → GPU instance id,
        None when unknown: no SM figure then).

        SM % of a MIG device comes from GPM (Hopper and newer) over the time since the
        previous pass, so the first pass has none; elsewhere it is None (NVML has no per-MIG
        utilisation before GPM). Not thread-safe per GPU: one sampler calls it.
        """
        handle = self.handle(uuid)
        used, total = self._memory(handle, "nvmlDeviceGetMemoryInfo")
        sm = self._optional("nvmlDeviceGetUtilizationRates",
                            lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        power = self._optional("nvmlDeviceGetPowerUsage",
                               lambda: int(pynvml.nvmlDeviceGetPowerUsage(handle)) / 1000)
        gpm = self._gpm_supported(uuid, handle)
        if sm is None and gpm:
            sm = self._gpm_sm(uuid, None, handle)
        migs = {}
        for mig_uuid, gi_id in mig_devices.items():
            mig_used, mig_total = self._memory(self._any_handle(mig_uuid),
                                               "nvmlDeviceGetMemoryInfo (MIG)")
            mig_sm = self._gpm_sm(uuid, gi_id, handle) if gpm and gi_id is not None else None
            migs[mig_uuid] = MigUsage(mig_uuid, mig_sm, mig_used, mig_total)
        self._forget_gpm(uuid, keep={gi for gi in mig_devices.values() if gi is not None})
        return GpuUsage(uuid, sm, used, total, power, migs)

    def _memory(self, handle: Any, operation: str) -> tuple[int, int]:
        info = self._run(operation, lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
        return int(info.used), int(info.total)

    def _optional(self, operation: str, fn: Callable[[], T]) -> T | None:
        """None when NVML does not support the query for this device."""
        try:
            return self._run(operation, fn)
        except NvmlError as exc:
            if exc.is_not_supported:
                return None
            raise

    def _gpm_supported(self, uuid: str, handle: Any) -> bool:
        with self._lock:
            known = self._gpm_support.get(uuid)
        if known is None:
            support = self._optional("nvmlGpmQueryDeviceSupport",
                                     lambda: pynvml.nvmlGpmQueryDeviceSupport(handle))
            known = bool(support is not None and support.isSupportedDevice)
            with self._lock:
                self._gpm_support[uuid] = known
        return known

    def _gpm_sm(self, uuid: str, gi_id: int | None, handle: Any) -> float | None:
        """SM % between the previous GPM sample of this GPU (instance) and a new one."""
        key = (uuid, gi_id)
        with self._call("nvmlGpmSampleGet"):
            sample = pynvml.nvmlGpmSampleAlloc()
            try:
                if gi_id is None:
                    pynvml.nvmlGpmSampleGet(handle, sample)
                else:
                    pynvml.nvmlGpmMigSampleGet(handle, gi_id, sample)
            except pynvml.NVMLError:
                pynvml.nvmlGpmSampleFree(sample)
                raise
        with self._lock:
            previous = self._gpm_samples.get(key)
            self._gpm_samples[key] = sample
        if previous is None:
            return None
        try:
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 1
            request.sample1, request.sample2 = previous, sample
            request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
            self._run("nvmlGpmMetricsGet", lambda: pynvml.nvmlGpmMetricsGet(request))
            metric = request.metrics[0]
            if int(metric.nvmlReturn) != pynvml.NVML_SUCCESS:
                return None
            return float(metric.value)
        finally:
            self._run("nvmlGpmSampleFree", lambda: pynvml.nvmlGpmSampleFree(previous))

    def _forget_gpm(self, uuid: str, keep: set[int]) -> None:
        """Free the GPM samples of GPU instances that are gone (claim unprepared)."""
        with self._lock:
            stale = [key for key in self._gpm_samples
                     if key[0] == uuid and key[1] is not None and key[1] not in keep]
            samples = [self._gpm_samples.pop(key) for key in stale]
        with self._call("nvmlGpmSampleFree"):
            for sample in samples:
                pynvml.nvmlGpmSampleFree(sample)


@dataclass(frozen=True)
class MigUsage:
    """A MIG device's figures; ``sm_percent`` None where NVML has none (no GPM)."""

    uuid: str
    sm_percent: float | None
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class GpuUsage:
    """One sampling pass over a GPU: the board's figures and those of its MIG devices.

    ``sm_percent`` is None for a GPU in MIG mode without GPM; ``power_watts`` None where the
    board does not report power.
    """

    uuid: str
    sm_percent: float | None
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float | None
    mig: dict[str, MigUsage]


# --- event types ---------------------------------------------------------------------------

_NO_INSTANCE_ID = 0xFFFFFFFF
"""``gpuInstanceId`` / ``computeInstanceId`` of an event not tied to one MIG device."""


@dataclass(frozen=True)
class XidEvent:
    """An XID critical error NVML delivered for a GPU, or for one MIG device on it."""

    gpu_uuid: str
    xid: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    """Both set when NVML attributes the error to one MIG device, else both ``None``."""


@dataclass(frozen=True)
class GpuLostEvent:
    """The wait failed with GPU_IS_LOST: a registered GPU fell off the bus.

    NVML does not say which one; probe each with :meth:`Nvml.gpu_is_lost`.
    """


class EventSet:
    """An NVML event set and the GPUs registered on it; opaque outside :class:`Nvml`."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.freed = False
        self._uuid_by_handle: dict[int, str] = {}

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(self._uuid_by_handle.values())

    def add(self, handle_address: int | None, uuid: str) -> None:
        if handle_address is not None:
            self._uuid_by_handle[handle_address] = uuid

    def uuid_of(self, handle_address: int | None) -> str | None:
        return None if handle_address is None else self._uuid_by_handle.get(handle_address)


def _handle_address(handle: Any) -> int | None:
    """The pointer value of an NVML handle (``None`` for NULL), to map event handles back."""
    value = ctypes.cast(handle, ctypes.c_void_p).value
    return int(value) if value else None


def _load_from_driver_root(driver_root: Path) -> None:
    """Point pynvml at the driver root's ``libnvidia-ml.so.1`` (a containerised daemon sees
    the host driver under a mount, not on its own library path)."""
    candidate = DriverRoot(driver_root).find_library("libnvidia-ml.so.1")
    if candidate is None:
        return  # fall back to the loader's search path (driver root "/")
    try:
        library = ctypes.CDLL(str(candidate))
    except OSError as exc:
        raise NvmlUnavailable(f"cannot load {candidate}: {exc}") from exc
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()


def open_nvml(
    *, simulate: str | None = None, sim_state: Path | None = None,
    driver_root: Path | None = None,
) -> Nvml:
    """Initialise NVML (real, or the simulated node ``simulate`` with state in ``sim_state``).

    With a real driver, ``driver_root`` (when not ``/``) is searched for the library first.
    Raises :class:`NvmlUnavailable` with a one-line reason when there is no driver.
    """
    if simulate is None and driver_root is not None and driver_root != Path("/"):
        _load_from_driver_root(driver_root)
    if simulate is not None:
        if sim_state is None:
            raise ValueError("a simulated node needs a state directory (sim_state)")
        from gpudra.driver import sim

        sim.install(simulate, sim_state)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound as exc:
        raise NvmlUnavailable(
            "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver on this machine "
            "(use --simulate PROFILE to run on a simulated GPU node)") from exc
    except pynvml.NVMLError_DriverNotLoaded as exc:
        raise NvmlUnavailable("the NVIDIA kernel driver is not loaded") from exc
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML failed to initialise: {exc}") from exc
    return Nvml()
