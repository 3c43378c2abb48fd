"""VFIO passthrough of whole GPUs: moving a GPU (and its IOMMU group) from ``nvidia`` to
``vfio-pci`` for a claim, and back.

The order is what makes it crash-safe. Before the first driver change, the claim record
names every function that may move and the driver each had (:class:`VfioRecord`, persisted
by :class:`~gpudra.driver.claim_hardware.ClaimHardware`), so :meth:`VfioPassthrough.release`
— after an error, at unprepare, or when start-up rolls back an interrupted prepare — puts
each one back from the record and what sysfs says now: a function still on its old driver
is left alone, one on ``vfio-pci`` or on no driver is rebound. It is idempotent, so a crash
anywhere in it is finished by the kubelet's retry or by the next start.

VFIO hands a group out whole, so every function of the GPU's IOMMU group moves with it: the
card's other functions (audio) and, behind a PCIe switch without ACS, other GPUs. A group
member that is in use (prepared for another claim, or running processes) refuses the claim;
an idle GPU taken along is refused to later claims for as long as the group is passed
through (:meth:`VfioPassthrough.check_free`), as the scheduler cannot know it went too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import structlog

from gpudra.driver.cdi import CdiError, ContainerEdits, DeviceNode
from gpudra.driver.checkpoint_model import Checkpoint, ClaimRecord, VfioFunction, VfioRecord
from gpudra.driver.claims import ClaimError, ClaimToPrepare
from gpudra.driver.faults import crash_point
from gpudra.driver.nvml import Nvml, NvmlError
from gpudra.driver.vfio_sysfs import NVIDIA_DRIVER, VFIO_DRIVER, PciSysfs, SysfsError

log = structlog.get_logger(__name__)

GATE: Final = "PassthroughSupport"
DEFAULT_REBIND_TIMEOUT: Final = 30.0
"""Seconds unprepare waits for NVML to see a GPU rebound to ``nvidia``; past it the
unprepare fails (and is retried), the GPU stays bound to ``nvidia``."""
_POLL: Final = 0.1
COMMON_ENV: Final = ("NVIDIA_VISIBLE_DEVICES=void",)
"""A VM's container gets no CUDA devices: a runtime that reads this variable adds none."""


class VfioError(OSError):
    """Passthrough could not be undone as asked (a GPU NVML does not see again): a device
    operation that failed, retried like the others."""


@dataclass(frozen=True)
class VfioRequest:
    """One vfio device of a claim: the GPU and where it is."""

    device: str
    gpu_uuid: str
    bus_id: str
    """Sysfs form."""


class VfioPassthrough:
    """Binds GPUs to ``vfio-pci`` for claims and back; see the module docstring.

    ``enabled`` is the ``PassthroughSupport`` gate: off, no claim may take a GPU this way,
    but records from before are still released. ``gpu_bus_ids`` maps each GPU UUID the node
    knows to its sysfs bus id (to tell GPUs among a group's functions).
    """

    def __init__(
        self, sysfs: PciSysfs, nvml: Nvml, *, enabled: bool,
        gpu_bus_ids: Callable[[], Mapping[str, str]],
        rebind_timeout: float = DEFAULT_REBIND_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.sysfs = sysfs
        self._nvml = nvml
        self.enabled = enabled
        self._gpu_bus_ids = gpu_bus_ids
        self._timeout = rebind_timeout
        self._clock = clock
        self._sleep = sleep

    # --- prepare -------------------------------------------------------------------------

    def plan(self, claim: ClaimToPrepare, request: VfioRequest, cp: Checkpoint | None,
             has_config: bool) -> VfioRecord:
        """What taking this GPU moves, checked; :class:`ClaimError` (nothing changed) when
        it may not be taken now."""
        where = f"claim {claim.ref}: device {request.device!r}"
        if not self.enabled:
            raise ClaimError(f"{where}: VFIO passthrough is not enabled on this node "
                             f"(feature gate {GATE})")
        if has_config:
            raise ClaimError(f"{where}: a vfio device takes no opaque config (the VM "
                             "configures the GPU); remove the config for this request")
        try:
            group = self.sysfs.iommu_group(request.bus_id)
            driver = self.sysfs.driver(request.bus_id)
            members = [] if group is None else self.sysfs.group_devices(group)
        except (SysfsError, ValueError) as exc:
            raise ClaimError(f"{where}: {exc}") from exc
        if group is None:
            raise ClaimError(f"{where}: GPU {request.bus_id} has no IOMMU group: the kernel "
                             "runs without an IOMMU (intel_iommu=on / amd_iommu=on), so VFIO "
                             "cannot pass it through")
        if not self.sysfs.driver_dir(VFIO_DRIVER).is_dir():
            raise ClaimError(f"{where}: the vfio-pci driver is not loaded on this node "
                             f"(no {self.sysfs.driver_dir(VFIO_DRIVER)}; modprobe vfio-pci)")
        if driver != NVIDIA_DRIVER:
            raise ClaimError(f"{where}: GPU {request.bus_id} is bound to "
                             f"{driver or 'no driver'}, not nvidia; gpudra passes through only "
                             "GPUs it manages")
        uuid_of = {bus: uuid for uuid, bus in self._gpu_bus_ids().items()}
        holders = _holders(cp, exclude=claim.uid)
        functions = [VfioFunction(bus_id=request.bus_id, previous_driver=driver,
                                  gpu_uuid=request.gpu_uuid)]
        for bus in members:
            if bus == request.bus_id:
                continue
            gpu = uuid_of.get(bus)
            try:
                previous = self.sysfs.driver(bus)
            except SysfsError as exc:
                raise ClaimError(f"{where}: {exc}") from exc
            functions.append(VfioFunction(bus_id=bus, previous_driver=previous, gpu_uuid=gpu))
        for function in functions:
            gpu = function.gpu_uuid
            if gpu is None:
                continue
            which = ("the GPU" if function.bus_id == request.bus_id else
                     f"GPU {gpu} ({function.bus_id}), in the same IOMMU group {group},")
            if gpu in holders:
                raise ClaimError(f"{where}: {which} is prepared for claim {holders[gpu]}; "
                                 "VFIO takes a whole IOMMU group, so it cannot be passed through "
                                 "now")
            pids = self._processes(gpu)
            if pids:
                raise ClaimError(f"{where}: {which} has running processes (pids "
                                 f"{', '.join(map(str, pids))}); stop them first (VFIO needs the "
                                 "nvidia driver to let go of it)")
        return VfioRecord(iommu_group=group, functions=functions)

    def check_free(self, claim: ClaimToPrepare, gpus: Iterable[str],
                   cp: Checkpoint | None) -> None:
        """Refuse GPUs that another claim passes through along with its own (its IOMMU group
        took them to ``vfio-pci``)."""
        taken = _passed_through(cp, exclude=claim.uid)
        for gpu in gpus:
            if gpu in taken:
                raise ClaimError(f"claim {claim.ref}: GPU {gpu} is bound to vfio-pci: claim "
                                 f"{taken[gpu]} passes through its IOMMU group to a VM")

    def bind(self, claim: ClaimToPrepare, record: VfioRecord) -> None:
        """Move every function of the record to ``vfio-pci`` (the record is persisted)."""
        for function in record.functions:
            bus = function.bus_id
            try:
                if self.sysfs.driver(bus) != VFIO_DRIVER:
                    self.sysfs.unbind(bus)
                    crash_point("prepare:after-vfio-unbind")
                    self.sysfs.bind(bus, VFIO_DRIVER)
                    crash_point("prepare:after-vfio-bind")
            except SysfsError as exc:
                raise ClaimError(f"claim {claim.ref}: binding {bus} to vfio-pci failed: "
                                 f"{exc}") from exc
        log.info("GPU bound to vfio-pci", claim=claim.ref, group=record.iommu_group,
                 functions=[f.bus_id for f in record.functions])

    # --- undo ----------------------------------------------------------------------------

    def release(self, record: ClaimRecord) -> None:
        """Give each passed-through function back its driver and wait until NVML sees the
        GPUs again; idempotent (see the module docstring)."""
        for device in record.devices:
            if device.vfio is None or device.admin_access:
                continue
            for function in reversed(device.vfio.functions):
                self._restore(record.ref, function)
            for function in device.vfio.functions:
                if function.gpu_uuid is not None and function.previous_driver == NVIDIA_DRIVER:
                    self._wait_seen(function.gpu_uuid, function.bus_id)

    def _restore(self, ref: str, function: VfioFunction) -> None:
        bus, previous = function.bus_id, function.previous_driver
        current = self.sysfs.driver(bus)
        if current == previous:
            return
        if current not in (VFIO_DRIVER, None):
            log.warning("PCI function was rebound by someone else; left as it is", claim=ref,
                        bus_id=bus, driver=current, expected=previous)
            return
        if current is not None:
            self.sysfs.unbind(bus)
            crash_point("unprepare:after-vfio-unbind")
        if previous is None:
            self.sysfs.write(self.sysfs.device_dir(bus) / "driver_override", "\n")
        else:
            self.sysfs.bind(bus, previous)
        crash_point("unprepare:after-vfio-rebind")
        log.info("PCI function given back its driver", claim=ref, bus_id=bus, driver=previous)

    def _wait_seen(self, gpu: str, bus: str) -> None:
        deadline = self._clock() + self._timeout
        while True:
            reason = self._nvml.why_unavailable(gpu)
            if reason is None:
                return
            if self._clock() >= deadline:
                raise VfioError(f"GPU {gpu} ({bus}) is bound to nvidia again but NVML does not "
                                f"see it after {self._timeout:g}s ({reason}); will retry")
            self._sleep(_POLL)

    # --- CDI -----------------------------------------------------------------------------

    def container_edits(self, record: VfioRecord,
                        device_node: Callable[[str], DeviceNode | None]) -> ContainerEdits:
        """The group's node and the VFIO container (legacy), and with iommufd on the host
        ``/dev/iommu`` and the GPU's cdev too; a VMM uses whichever its host has."""
        nodes: list[DeviceNode] = []
        group = device_node(f"/dev/vfio/{record.iommu_group}")
        container = device_node("/dev/vfio/vfio")
        if group is not None and container is not None:
            nodes += [container, group]
        iommu = device_node("/dev/iommu")
        cdev = self.sysfs.vfio_cdev(record.functions[0].bus_id)
        if iommu is not None and cdev is not None:
            cdev_node = device_node(f"/dev/vfio/devices/{cdev}")
            if cdev_node is not None:
                nodes += [iommu, cdev_node]
        if not nodes:
            raise CdiError(f"no VFIO device node for IOMMU group {record.iommu_group}: neither "
                           f"/dev/vfio/{record.iommu_group} with /dev/vfio/vfio nor /dev/iommu "
                           "with the GPU's /dev/vfio/devices/vfioN exists under the device root")
        return ContainerEdits(device_nodes=tuple(nodes))

    def _processes(self, gpu: str) -> list[int]:
        try:
            return self._nvml.running_processes(gpu)
        except NvmlError as exc:
            raise ClaimError(f"GPU {gpu}: cannot list its processes: {exc}") from exc


def common_edits() -> ContainerEdits:
    """What every container of a claim made only of vfio devices gets."""
    return ContainerEdits(env=COMMON_ENV)


def _holders(cp: Checkpoint | None, *, exclude: str) -> dict[str, str]:
    """GPU UUID → the claim (ref) that has it prepared, whole or in part, or passed through."""
    out: dict[str, str] = {}
    if cp is None:
        return out
    for record in cp.claims.values():
        if record.uid == exclude:
            continue
        for device in record.devices:
            if device.admin_access:
                continue
            for gpu in (device.parent_uuid, device.uuid):
                if gpu:
                    out.setdefault(gpu, record.ref)
        out.update({gpu: ref for gpu, ref in _passed_through_by(record).items()
                    if gpu not in out})
    return out


def _passed_through(cp: Checkpoint | None, *, exclude: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if cp is None:
        return out
    for record in cp.claims.values():
        if record.uid != exclude:
            out.update(_passed_through_by(record))
    return out


def _passed_through_by(record: ClaimRecord) -> dict[str, str]:
    return {f.gpu_uuid: record.ref for d in record.devices if d.vfio is not None
            for f in d.vfio.functions if f.gpu_uuid is not None}
