"""A fake NVIDIA driver install, so the CDI code runs its real discovery path in simulation.

What is installed is data: ``data/driver580.yaml`` lists what a 580-series driver puts on a
node (libraries with their soname and ``.so`` links, configs, binaries, firmware, sockets),
each entry with its source. Regular files stand in for device nodes and sockets; libraries
are versioned files behind the links the installer makes; ``proc/devices`` names the
``nvidia-caps`` major so MIG capability nodes that were never created can still be described;
``proc/driver/nvidia/gpus/<bus id>/information`` and ``sys/bus/pci/devices/<bus id>/drm/``
tie each GPU to its DRM nodes as the kernel shows them.

:data:`LAYOUTS` are the driver roots real clusters have: a driver installed on the host
(Debian multiarch), the GPU Operator's driver container tree, and GKE's installer directory
(``lib64/``, ``bin/``, device nodes on the host). The device root (``dev/``, ``proc/``,
``sys/``) goes under ``dev_root``, by default the driver root itself.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpudra.driver.driver_root import mig_capability_minors

NVIDIA_MAJOR = 195
NVIDIA_CAPS_MAJOR = 237
NVIDIA_UVM_MAJOR = 510
DRM_MAJOR = 226
LIB_DIR = "usr/lib/x86_64-linux-gnu"
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
DATA_FILE = "driver580.yaml"


@dataclass(frozen=True)
class Library:
    file: str
    """Relative to the library directory; ``{version}`` replaced (``vdpau/…`` for VDPAU)."""
    soname: str | None
    dev: str | None
    media: bool
    needed_by: tuple[str, ...]


@dataclass(frozen=True)
class Config:
    path: str
    container: str
    needed_by: tuple[str, ...]


@dataclass(frozen=True)
class Install:
    """What ``data/driver580.yaml`` says a driver installs."""

    version: str
    libraries: tuple[Library, ...]
    configs: tuple[Config, ...]
    binaries: tuple[str, ...]
    firmware: tuple[str, ...]
    sockets: tuple[str, ...]
    sources: Mapping[str, str]

    def with_version(self, version: str) -> Install:
        """The same install for another driver version (RM-versioned names follow it)."""
        libraries = tuple(
            Library(lib.file.replace(self.version, version), lib.soname, lib.dev, lib.media,
                    lib.needed_by) for lib in self.libraries)
        return Install(version, libraries, self.configs, self.binaries, self.firmware,
                       self.sockets, self.sources)


@cache
def driver_install() -> Install:
    raw = pkgutil.get_data(f"{__package__}.data", DATA_FILE)
    if raw is None:
        raise ValueError(f"{DATA_FILE}: no such simulator data file in this installation")
    data: dict[str, Any] = yaml.safe_load(raw.decode("utf-8"))
    if not isinstance(data, dict) or data.get("schema_version") != 1:
        raise ValueError(f"{DATA_FILE}: expected a mapping with schema_version: 1")
    version = str(data["version"])
    sources = data["sources"]
    rows = [*data["libraries"], *data["configs"], *data["binaries"], *data["firmware"],
            *data["sockets"]]
    unknown = {row["source"] for row in rows} - set(sources)
    if unknown:
        raise ValueError(f"{DATA_FILE}: sources {sorted(unknown)} are not in `sources:`")
    return Install(
        version=version,
        libraries=tuple(Library(row["file"].replace("{version}", version), row.get("soname"),
                                row.get("dev"), bool(row.get("media", False)),
                                tuple(row["needed_by"])) for row in data["libraries"]),
        configs=tuple(Config(row["path"], row["container"], tuple(row["needed_by"]))
                      for row in data["configs"]),
        binaries=tuple(row["name"] for row in data["binaries"]),
        firmware=tuple(row["name"] for row in data["firmware"]),
        sockets=tuple(row["path"] for row in data["sockets"]),
        sources=dict(sources),
    )


DRIVER_VERSION = driver_install().version
BINARIES = driver_install().binaries
FIRMWARE = driver_install().firmware


@dataclass(frozen=True)
class Layout:
    """Where one kind of driver install keeps its files."""

    lib_dir: str
    bin_dir: str
    firmware_dir: str | None
    """Holds ``<version>/gsp*.bin``."""
    c_library: bool
    """A whole OS tree with its own ``libc.so.6`` and loader (host commands run chrooted)."""
    hook_dir: str | None
    """Where the NVIDIA Container Toolkit's ``nvidia-cdi-hook`` is, if installed."""
    configs: Mapping[str, str] | None = None
    """Config directory prefixes as the install moves them (``usr/share/vulkan`` →
    ``vulkan`` on GKE); ``None``: configs not installed; a prefix not named: not installed."""
    sockets: bool = False
    """Persistenced (and on NVSwitch systems fabricmanager) run and have their sockets."""
    drm: bool = False
    """nvidia-drm is loaded: each GPU has DRM nodes in ``dev/dri``."""


_ALL_CONFIGS = {"usr/share": "usr/share", "etc": "etc"}
LAYOUTS: Mapping[str, Layout] = {
    # A driver installed on a Debian/Ubuntu host, with the Container Toolkit.
    "host": Layout(LIB_DIR, "usr/bin", "lib/firmware/nvidia", True, "usr/bin",
                   configs=_ALL_CONFIGS, sockets=True, drm=True),
    # The GPU Operator's driver container (Ubuntu), whose toolkit lives on the host.
    "operator": Layout(LIB_DIR, "usr/bin", "lib/firmware/nvidia", True, None,
                       configs=_ALL_CONFIGS, sockets=True, drm=True),
    # GKE's driver installer directory, /home/kubernetes/bin/nvidia: NVIDIA files only; the
    # Vulkan ICD files at its top (source `gke` in the data file), firmware beside the
    # libraries (an assumption: FIRMWARE_DIRS searches firmware/nvidia for it).
    "gke": Layout("lib64", "bin", "firmware/nvidia", False, None,
                  configs={"usr/share/vulkan": "vulkan"}, drm=True),
    # Only the driver's own libraries and binaries (what tests of one piece need).
    "minimal": Layout(LIB_DIR, "usr/bin", None, False, None),
}


def default_bus_id(minor: int) -> str:
    """A PCI bus id per GPU minor when the caller names none (sysfs's lower-case form)."""
    return f"0000:{0x18 + 0x10 * minor:02x}:00.0"


def populate_driver_root(
    root: Path,
    gpu_minors: Sequence[int],
    mig: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    *,
    driver_version: str = DRIVER_VERSION,
    lib_dir: str | None = None,
    layout: str = "minimal",
    dev_root: Path | None = None,
    devices: bool = True,
    bus_ids: Mapping[int, str] | None = None,
    fabricmanager: bool = False,
) -> Path:
    """Create (or top up) a driver root with GPUs ``gpu_minors`` and MIG ``(gi, ci)`` pairs.

    ``layout`` is one of :data:`LAYOUTS`; ``lib_dir`` overrides its library directory (a
    distribution's layout, e.g. ``usr/lib64``). ``devices=False`` leaves the device root be.
    ``fabricmanager``: an NVSwitch system, whose Fabric Manager socket is there too.
    """
    shape = LAYOUTS[layout]
    install = driver_install().with_version(driver_version)
    if devices:
        populate_device_root(dev_root or root, gpu_minors, mig, driver_version=driver_version,
                             bus_ids=bus_ids, drm=shape.drm)
    libs = root / (lib_dir or shape.lib_dir)
    for lib in install.libraries:
        real = libs / lib.file
        real.parent.mkdir(parents=True, exist_ok=True)
        real.write_text(f"simulated {real.name}\n")
        if lib.soname is not None:
            _link(real.parent / lib.soname, real.name)
        if lib.dev is not None:
            _link(real.parent / lib.dev, lib.soname or real.name)
    if shape.c_library:
        (libs / "libc.so.6").write_text("simulated C library\n")
    bins = root / shape.bin_dir
    bins.mkdir(parents=True, exist_ok=True)
    for name in install.binaries:
        _script(bins / name, f"#!/bin/sh\necho 'simulated {name} {driver_version}'\n")
    if shape.hook_dir is not None:
        _script(root / shape.hook_dir / "nvidia-cdi-hook", "#!/bin/sh\nexit 0\n")
    if shape.firmware_dir is not None:
        firmware = root / shape.firmware_dir / driver_version
        firmware.mkdir(parents=True, exist_ok=True)
        for name in install.firmware:
            (firmware / name).write_text(f"simulated {name}\n")
    for config in install.configs:
        moved = None if shape.configs is None else _moved(config.path, shape.configs)
        if moved is not None:
            (root / moved).parent.mkdir(parents=True, exist_ok=True)
            (root / moved).write_text(f"simulated {config.path}\n")
    if shape.sockets:
        for path in install.sockets:
            if path.startswith("nvidia-fabricmanager/") and not fabricmanager:
                continue
            (root / "run" / path).parent.mkdir(parents=True, exist_ok=True)
            (root / "run" / path).touch()
    return root


def _moved(path: str, prefixes: Mapping[str, str]) -> str | None:
    for prefix, to in prefixes.items():
        if path == prefix or path.startswith(prefix + "/"):
            return to + path[len(prefix):]
    return None


def populate_device_root(
    root: Path,
    gpu_minors: Sequence[int],
    mig: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    *,
    driver_version: str = DRIVER_VERSION,
    bus_ids: Mapping[int, str] | None = None,
    drm: bool = True,
) -> Path:
    """``dev/``, ``proc/`` and ``sys/`` as a loaded kernel module of ``driver_version`` shows
    them; ``drm``: nvidia-drm is loaded too, so each GPU has DRM nodes."""
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    for name in (*CONTROL_NODES, *(f"nvidia{m}" for m in gpu_minors)):
        (dev / name).touch()
    for cap in (1, 2):  # MIG config and monitor capabilities
        (dev / "nvidia-caps" / f"nvidia-cap{cap}").touch()
    proc = root / "proc"
    (proc / "driver/nvidia").mkdir(parents=True, exist_ok=True)
    (proc / "devices").write_text(
        f"Character devices:\n{NVIDIA_MAJOR} nvidia-frontend\n{NVIDIA_UVM_MAJOR} nvidia-uvm\n"
        f"{NVIDIA_CAPS_MAJOR} nvidia-caps\n{DRM_MAJOR} drm\n"
    )
    (proc / "driver/nvidia/version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version}  (simulated)\n")
    for minor in gpu_minors:
        bus_id = (bus_ids or {}).get(minor) or default_bus_id(minor)
        info = proc / "driver/nvidia/gpus" / bus_id
        info.mkdir(parents=True, exist_ok=True)
        (info / "information").write_text(_information_file(minor, bus_id))
        if drm:
            # card0 is the BMC's VGA (see below), so a GPU's card number is not its minor.
            _drm_device(root, bus_id, [f"card{minor + 1}", f"renderD{128 + minor}"])
    if drm:
        _drm_device(root, "0000:02:00.0", ["card0"])  # the server's BMC (ast), not NVIDIA
    for minor, instances in (mig or {}).items():
        for gi, ci in instances:
            add_mig_instance(root, minor, gi, ci)
    return root


def _drm_device(root: Path, bus_id: str, nodes: Sequence[str]) -> None:
    """A PCI device's DRM nodes: sysfs's ``drm/`` entries, the nodes and udev's by-path links."""
    sysfs = root / "sys/bus/pci/devices" / bus_id / "drm"
    dri = root / "dev/dri"
    (dri / "by-path").mkdir(parents=True, exist_ok=True)
    for node in nodes:
        (sysfs / node).mkdir(parents=True, exist_ok=True)
        (dri / node).touch()
        kind = "card" if node.startswith("card") else "render"
        _link(dri / "by-path" / f"pci-{bus_id}-{kind}", f"../{node}")


def _information_file(minor: int, bus_id: str) -> str:
    # The layout of /proc/driver/nvidia/gpus/<bus id>/information (fields NVIDIA's tools read).
    return (f"Model: \t\t Simulated GPU\nIRQ:   \t\t {100 + minor}\n"
            f"GPU UUID: \t GPU-00000000-0000-0000-0000-{minor:012x}\n"
            f"Bus Type: \t PCIe\nBus Location: \t {bus_id}\nDevice Minor: \t {minor}\n"
            "GPU Excluded:\t No\n")


def add_mig_instance(root: Path, gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """What the driver shows under device root ``root`` once a GPU + compute instance
    exists; returns the cap minors."""
    gi_minor, ci_minor = mig_capability_minors(gpu_minor, gi, ci)
    base = root / f"proc/driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"
    (base / f"ci{ci}").mkdir(parents=True, exist_ok=True)
    (base / "access").write_text(_access_file(gi_minor))
    (base / f"ci{ci}" / "access").write_text(_access_file(ci_minor))
    caps = root / "dev" / "nvidia-caps"
    caps.mkdir(parents=True, exist_ok=True)
    for minor in (gi_minor, ci_minor):
        (caps / f"nvidia-cap{minor}").touch()
    return gi_minor, ci_minor


def _link(link: Path, target: str) -> None:
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _access_file(minor: int) -> str:
    # The layout of /proc/driver/nvidia/capabilities/.../access (mode 0444 = 292).
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
