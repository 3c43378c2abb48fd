"""A simulated node's PCI sysfs and the kernel's part in it: driver binding and IOMMU groups.

The tree (``<sim-state>/sys``) is laid out as the kernel's is: ``bus/pci/devices/<bdf>/``
with ``vendor``, ``device``, ``class``, ``driver_override``, a ``driver`` symlink into
``bus/pci/drivers/<name>`` and an ``iommu_group`` symlink into ``kernel/iommu_groups/<n>``,
whose ``devices/`` lists every function of the group. :class:`SimPciSysfs` is the real
:class:`~gpudra.driver.vfio_sysfs.PciSysfs` with the kernel's reaction to each control-file
write played here: unbinding a GPU from ``nvidia`` makes the simulated NVML stop
enumerating it (:attr:`~gpudra.driver.sim.state.GpuState.pci_driver`), binding it back makes
it reappear; binding ``vfio-pci`` creates ``/dev/vfio/<group>`` (and, with iommufd, the
device's ``/dev/vfio/devices/vfioN`` cdev) under the simulated device root.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from gpudra.driver.vfio_sysfs import NVIDIA_DRIVER, VFIO_DRIVER, PciSysfs, SysfsError

from .profiles import node_profile
from .state import StateStore

NVIDIA_VENDOR: Final = "0x10de"
FIRST_GROUP: Final = 16
"""IOMMU group of GPU 0; GPU ``i`` is in ``FIRST_GROUP + i`` unless grouped otherwise."""
DRIVERS: Final = (NVIDIA_DRIVER, VFIO_DRIVER, "snd_hda_intel")
_NULL: Final = "(null)"


def sysfs_root(state_dir: Path) -> Path:
    return Path(state_dir) / "sys"


def populate(state_dir: Path, dev_root: Path | None = None, *, iommufd: bool = False) -> Path:
    """Lay out the sysfs of the simulated node in ``state_dir`` (once; later calls keep what
    is there, bindings included). ``dev_root`` gets ``/dev/vfio/vfio`` (and ``/dev/iommu``
    with ``iommufd``), as loading the vfio modules makes them."""
    root = sysfs_root(state_dir)
    if dev_root is not None:
        (dev_root / "dev/vfio").mkdir(parents=True, exist_ok=True)
        (dev_root / "dev/vfio/vfio").touch()
        if iommufd:
            (dev_root / "dev/iommu").touch()
    if (root / "bus/pci/drivers_probe").exists():
        return root
    profile = node_profile(StateStore(state_dir).read().profile)
    for name in DRIVERS:
        driver = root / "bus/pci/drivers" / name
        driver.mkdir(parents=True, exist_ok=True)
        for control in ("bind", "unbind", "new_id"):
            (driver / control).touch()
    for slot in profile.gpus:
        bus_id = slot.pci.bus_id_legacy.lower()
        _add_function(root, bus_id, vendor=NVIDIA_VENDOR,
                      device=f"0x{slot.model.pci_device_id:04x}", pci_class="0x030200",
                      group=FIRST_GROUP + slot.index, driver=NVIDIA_DRIVER)
    (root / "bus/pci/drivers_probe").touch()  # last: marks the tree complete
    return root


def _add_function(root: Path, bus_id: str, *, vendor: str, device: str, pci_class: str,
                  group: int, driver: str | None) -> None:
    path = root / "bus/pci/devices" / bus_id
    path.mkdir(parents=True, exist_ok=True)
    (path / "vendor").write_text(vendor + "\n")
    (path / "device").write_text(device + "\n")
    (path / "class").write_text(pci_class + "\n")
    (path / "driver_override").write_text(_NULL + "\n")
    (path / "default_driver").write_text((driver or "") + "\n")  # the simulator's own note
    _join_group(root, bus_id, group)
    if driver is not None:
        _link(path / "driver", f"../../drivers/{driver}")


def _join_group(root: Path, bus_id: str, group: int) -> None:
    device = root / "bus/pci/devices" / bus_id
    old = device / "iommu_group"
    if old.is_symlink():
        (old.resolve() / "devices" / bus_id).unlink(missing_ok=True)
    members = root / "kernel/iommu_groups" / str(group) / "devices"
    members.mkdir(parents=True, exist_ok=True)
    _link(members / bus_id, f"../../../../bus/pci/devices/{bus_id}")
    _link(old, f"../../../../kernel/iommu_groups/{group}")


def _link(path: Path, target: str) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def share_iommu_group(state_dir: Path, gpu_indexes: Sequence[int]) -> int:
    """Put GPUs in one IOMMU group (GPUs behind a PCIe switch without ACS); its number."""
    root = populate(state_dir)
    profile = node_profile(StateStore(state_dir).read().profile)
    group = FIRST_GROUP + min(gpu_indexes)
    for index in gpu_indexes:
        _join_group(root, profile.gpus[index].pci.bus_id_legacy.lower(), group)
    return group


def add_function(state_dir: Path, gpu_index: int, function: int, *,
                 driver: str | None = "snd_hda_intel") -> str:
    """Another function of a GPU's card (its audio device), in the GPU's IOMMU group."""
    root = populate(state_dir)
    slot = node_profile(StateStore(state_dir).read().profile).gpus[gpu_index]
    gpu_bus = slot.pci.bus_id_legacy.lower()
    bus_id = gpu_bus[:-1] + str(function)
    group = int((root / "bus/pci/devices" / gpu_bus / "iommu_group").readlink().name)
    _add_function(root, bus_id, vendor=NVIDIA_VENDOR, device="0x22a3", pci_class="0x040300",
                  group=group, driver=driver)
    return bus_id


class SimPciSysfs(PciSysfs):
    """:class:`PciSysfs` over the simulated tree, the kernel's side played on each write."""

    def __init__(self, state_dir: Path, dev_root: Path, *, iommufd: bool = False) -> None:
        super().__init__(populate(state_dir, dev_root, iommufd=iommufd))
        self._store = StateStore(state_dir)
        self._dev = dev_root / "dev"
        self._iommufd = iommufd
        self._profile = node_profile(self._store.read().profile)

    def write(self, path: Path, value: str) -> None:
        rel = path.relative_to(self.root).parts
        text = value.strip()
        if rel[:3] == ("bus", "pci", "devices") and rel[4:] == ("driver_override",):
            path.write_text((text or _NULL) + "\n")
        elif rel == ("bus", "pci", "drivers_probe"):
            self._probe(text)
        elif rel[:3] == ("bus", "pci", "drivers") and rel[4:] == ("unbind",):
            self._unbind(text, rel[3])
        elif rel[:3] == ("bus", "pci", "drivers") and rel[4:] == ("bind",):
            self._bind(text, rel[3])
        else:
            super().write(path, value)

    def _override(self, bus_id: str) -> str | None:
        text = (self.device_dir(bus_id) / "driver_override").read_text().strip()
        return None if text in ("", _NULL) else text

    def _probe(self, bus_id: str) -> None:
        if not self.exists(bus_id):
            raise SysfsError(errno.ENODEV, f"no PCI device {bus_id}")
        if self.driver(bus_id) is not None:
            return  # the kernel probes only unbound devices
        driver = self._override(bus_id) or \
            (self.device_dir(bus_id) / "default_driver").read_text().strip()
        if driver:
            self._attach(bus_id, driver)

    def _bind(self, bus_id: str, driver: str) -> None:
        if self.driver(bus_id) is not None:
            raise SysfsError(errno.EBUSY, f"PCI device {bus_id} has a driver already")
        override = self._override(bus_id)
        if override is not None and override != driver:
            raise SysfsError(errno.ENODEV, f"PCI device {bus_id}: driver_override is {override}")
        self._attach(bus_id, driver)

    def _attach(self, bus_id: str, driver: str) -> None:
        if not self.driver_dir(driver).is_dir():
            raise SysfsError(errno.ENODEV, f"driver {driver} is not loaded")
        slot = self._gpu_slot(bus_id)
        if slot is not None:
            with self._store.update() as state:
                state.gpus[slot].pci_driver = driver
        _link(self.device_dir(bus_id) / "driver", f"../../drivers/{driver}")
        if driver == VFIO_DRIVER:
            group = self.iommu_group(bus_id)
            (self._dev / "vfio").mkdir(parents=True, exist_ok=True)
            (self._dev / "vfio" / str(group)).touch()
            if self._iommufd:
                name = f"vfio{self._cdev_number(bus_id)}"
                (self.device_dir(bus_id) / "vfio-dev" / name).mkdir(parents=True, exist_ok=True)
                (self._dev / "vfio/devices").mkdir(parents=True, exist_ok=True)
                (self._dev / "vfio/devices" / name).touch()

    def _unbind(self, bus_id: str, driver: str) -> None:
        if self.driver(bus_id) != driver:
            raise SysfsError(errno.ENODEV, f"PCI device {bus_id} is not bound to {driver}")
        slot = self._gpu_slot(bus_id)
        if slot is not None:
            with self._store.update() as state:
                gpu = state.gpus[slot]
                if driver == NVIDIA_DRIVER and gpu.processes:
                    # The real driver waits for its clients; a test must not hang on it.
                    raise SysfsError(errno.EBUSY, f"PCI device {bus_id}: GPU in use by "
                                                  f"{len(gpu.processes)} process(es)")
                gpu.pci_driver = None
        (self.device_dir(bus_id) / "driver").unlink()
        if driver == VFIO_DRIVER:
            group = self.iommu_group(bus_id)
            if not any(self.driver(m) == VFIO_DRIVER for m in self.group_devices(group or 0)):
                (self._dev / "vfio" / str(group)).unlink(missing_ok=True)
            cdevs = self.device_dir(bus_id) / "vfio-dev"
            if cdevs.is_dir():
                for cdev in cdevs.iterdir():
                    (self._dev / "vfio/devices" / cdev.name).unlink(missing_ok=True)
                    cdev.rmdir()
                cdevs.rmdir()

    def _gpu_slot(self, bus_id: str) -> int | None:
        return next((s.index for s in self._profile.gpus
                     if s.pci.bus_id_legacy.lower() == bus_id), None)

    def _cdev_number(self, bus_id: str) -> int:
        devices = sorted(p.name for p in (self.root / "bus/pci/devices").iterdir())
        return devices.index(bus_id)
