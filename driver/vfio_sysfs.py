"""The kernel's PCI driver binding, through sysfs: who drives a device, its IOMMU group, and
moving it from one driver to another.

Only the kernel's documented control files are used: ``driver`` (a symlink to the bound
driver), ``driver_override``, ``iommu_group``, ``/sys/bus/pci/drivers/<name>/unbind``,
``/sys/bus/pci/drivers_probe`` and ``/sys/kernel/iommu_groups/<n>/devices/``. Every write
goes through :meth:`PciSysfs.write`, the one place the simulator (``gpudra.driver.sim.pci``)
plays the kernel's part, so the simulated node runs this module's real sequence.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Final

VFIO_DRIVER: Final = "vfio-pci"
NVIDIA_DRIVER: Final = "nvidia"
_BUS_ID: Final = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_NVML_BUS_ID: Final = re.compile(
    r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")
_DRIVER_NAME: Final = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class SysfsError(OSError):
    """A sysfs read or write failed; the message names the device and the file."""


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` as sysfs names it, ``0000:18:00.0``; ValueError if it is
    not a PCI address (the value reaches paths: it is checked, never trusted)."""
    match = _NVML_BUS_ID.match(nvml_bus_id.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id: {nvml_bus_id!r}")
    domain, bus, device, function = match.groups()
    if int(domain, 16) > 0xFFFF:
        raise ValueError(f"PCI domain out of range in {nvml_bus_id!r}")
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def check_bus_id(bus_id: str) -> str:
    if not _BUS_ID.match(bus_id):
        raise ValueError(f"not a sysfs PCI bus id: {bus_id!r}")
    return bus_id


class PciSysfs:
    """PCI devices and drivers under a sysfs root (``/sys`` on a node)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # --- paths ---------------------------------------------------------------------------

    def device_dir(self, bus_id: str) -> Path:
        return self.root / "bus/pci/devices" / check_bus_id(bus_id)

    def driver_dir(self, driver: str) -> Path:
        if not _DRIVER_NAME.match(driver):
            raise ValueError(f"not a driver name: {driver!r}")
        return self.root / "bus/pci/drivers" / driver

    # --- reads ---------------------------------------------------------------------------

    def available(self) -> bool:
        """IOMMU groups exist: the kernel runs with an IOMMU (VFIO needs one)."""
        groups = self.root / "kernel/iommu_groups"
        try:
            return any(groups.iterdir())
        except OSError:
            return False

    def functions(self, vendor: str) -> list[str]:
        """Bus ids of every PCI function of ``vendor`` (``0x10de``), whatever drives it."""
        try:
            names = sorted(p.name for p in (self.root / "bus/pci/devices").iterdir())
        except OSError:
            return []
        return [n for n in names if _BUS_ID.match(n) and self.vendor(n) == vendor]

    def exists(self, bus_id: str) -> bool:
        return self.device_dir(bus_id).is_dir()

    def driver(self, bus_id: str) -> str | None:
        """The bound driver's name; ``None`` when no driver is bound."""
        try:
            return (self.device_dir(bus_id) / "driver").readlink().name
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SysfsError(exc.errno, f"PCI device {bus_id}: cannot read its driver: "
                                        f"{exc.strerror}") from exc

    def iommu_group(self, bus_id: str) -> int | None:
        """The device's IOMMU group; ``None`` without an IOMMU."""
        try:
            name = (self.device_dir(bus_id) / "iommu_group").readlink().name
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SysfsError(exc.errno, f"PCI device {bus_id}: cannot read its IOMMU group: "
                                        f"{exc.strerror}") from exc
        return int(name) if name.isdigit() else None

    def group_devices(self, group: int) -> list[str]:
        """Every PCI function in an IOMMU group, sorted (VFIO hands out groups whole)."""
        path = self.root / "kernel/iommu_groups" / str(int(group)) / "devices"
        try:
            names = sorted(p.name for p in path.iterdir())
        except OSError as exc:
            raise SysfsError(exc.errno or errno.EIO,
                             f"IOMMU group {group}: cannot list {path}: {exc.strerror}") from exc
        return [n for n in names if _BUS_ID.match(n)]

    def vendor(self, bus_id: str) -> str | None:
        return self._read_id(bus_id, "vendor")

    def device_id(self, bus_id: str) -> str | None:
        return self._read_id(bus_id, "device")

    def vfio_cdev(self, bus_id: str) -> str | None:
        """The device's VFIO character device (``vfio3``, under ``/dev/vfio/devices/``)
        once bound to ``vfio-pci`` on a kernel with iommufd cdevs; else ``None``."""
        try:
            names = sorted(p.name for p in (self.device_dir(bus_id) / "vfio-dev").iterdir())
        except OSError:
            return None
        return next((n for n in names if re.fullmatch(r"vfio[0-9]+", n)), None)

    def _read_id(self, bus_id: str, name: str) -> str | None:
        try:
            text = (self.device_dir(bus_id) / name).read_text().strip().lower()
        except OSError:
            return None
        return text if re.fullmatch(r"0x[0-9a-f]{4}", text) else None

    # --- writes --------------------------------------------------------------------------

    def unbind(self, bus_id: str) -> None:
        """Release the device from its driver; nothing to do when none is bound."""
        driver = self.driver(bus_id)
        if driver is not None:
            self.write(self.driver_dir(driver) / "unbind", bus_id)

    def bind(self, bus_id: str, driver: str) -> None:
        """Bind an unbound device to ``driver``: ``driver_override`` names it, then the
        kernel probes the device (``drivers_probe``) and only that driver may take it.
        The override stays while bound to ``vfio-pci``, so nothing else grabs it; for any
        other driver it is cleared again once bound."""
        self.write(self.device_dir(bus_id) / "driver_override", driver)
        self.write(self.root / "bus/pci/drivers_probe", bus_id)
        bound = self.driver(bus_id)
        if driver != VFIO_DRIVER:
            self.write(self.device_dir(bus_id) / "driver_override", "\n")
        if bound != driver:
            raise SysfsError(errno.ENODEV, f"PCI device {bus_id}: driver {driver} did not "
                                           f"take it (bound now: {bound or 'none'})")

    def write(self, path: Path, value: str) -> None:
        """One write to a kernel control file, as the kernel wants it: one ``write()``."""
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as exc:
            raise SysfsError(exc.errno, f"cannot open {path}: {exc.strerror}") from exc
        try:
            os.write(fd, value.encode())
        except OSError as exc:
            raise SysfsError(exc.errno, f"writing {value.strip()!r} to {path} failed: "
                                        f"{exc.strerror}") from exc
        finally:
            os.close(fd)
