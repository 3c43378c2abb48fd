"""Finding what an NVIDIA driver installation offers containers: the one part of the CDI code
that reads the file system.

It returns plain data (:class:`DriverFiles`, :class:`GpuDrm`); :mod:`gpudra.driver.cdi_edits`
turns that into container edits without touching anything. What is looked for follows
nvidia-container-toolkit's discovery (``pkg/nvcdi``, ``internal/discover``): every
``lib*.so.<driver version>`` in the driver's library directory (and its ``vdpau/``), the EGL
platform libraries (versioned on their own), the configs graphics and OpenCL loaders read,
the binaries, GSP firmware, the daemons' sockets, and each GPU's DRM nodes through its PCI
bus id in sysfs.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudra.driver.host_tree import HostTree

# Not versioned with the driver (NVIDIA's list: the EGL external platforms, legacy NVVM).
UNVERSIONED_LIBRARIES = (
    "libnvidia-egl-gbm.so.*.*",
    "libnvidia-egl-wayland.so.*.*",
    "libnvidia-egl-wayland2.so.*.*",
    "libnvidia-egl-xcb.so.*.*",
    "libnvidia-egl-xlib.so.*.*",
    "libnvidia-nvvm70.so.*",
)
LIBRARY_SUBDIRS = ("vdpau",)
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
            "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl")
# Where the driver's configs are searched (XDG data dirs and /etc, inside the driver root),
# and the container directory each group is mounted under, whatever the host path was: the
# loaders in the container look only there.
CONFIG_DIRS = ("etc", "usr/local/share", "usr/share")
SHARE_CONFIGS = (
    "glvnd/egl_vendor.d/10_nvidia.json",
    "egl/egl_external_platform.d/15_nvidia_gbm.json",
    "egl/egl_external_platform.d/10_nvidia_wayland.json",
    "egl/egl_external_platform.d/09_nvidia_wayland2.json",
    "egl/egl_external_platform.d/20_nvidia_xcb.json",
    "egl/egl_external_platform.d/20_nvidia_xlib.json",
    "nvidia/nvoptix.bin",
)
ETC_CONFIGS = ("OpenCL/vendors/nvidia.icd",)
# Also searched at the top of the driver root: GKE's installer keeps them in <root>/vulkan.
VULKAN_CONFIGS = (
    "vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json",
    "vulkan/icd.d/nvidia_icd.x86_64.json",
    "vulkan/icd.d/nvidia_icd.aarch64.json",
)
SOCKET_DIRS = ("run", "var/run")
SOCKETS = ("nvidia-persistenced/socket", "nvidia-fabricmanager/socket")
FIRMWARE_DIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia", "firmware/nvidia")
GPU_INFO_DIR = "proc/driver/nvidia/gpus"


@dataclass(frozen=True)
class LibraryFile:
    """A driver library as installed: the real file and the links the installer made."""

    host_path: str
    rel: str
    """Root-relative path of the real file (``/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06``)."""
    soname: str | None
    """The soname link next to it (``libcuda.so.1``), when there is one."""
    dev_link: str | None
    """The ``.so`` link next to it (``libcuda.so``), when there is one."""

    @property
    def name(self) -> str:
        return posixpath.basename(self.rel)


@dataclass(frozen=True)
class FileMount:
    host_path: str
    container_path: str


@dataclass(frozen=True)
class DriverFiles:
    """Everything of the driver root that CDI specs name, as found."""

    version: str | None
    libraries: tuple[LibraryFile, ...]
    library_dirs: tuple[str, ...]
    """Root-relative directories the libraries were found in."""
    c_library: bool
    """The root is a whole OS tree (its own libc), so its library paths are a distribution's."""
    binaries: tuple[FileMount, ...]
    configs: tuple[FileMount, ...]
    firmware: tuple[FileMount, ...]
    sockets: tuple[FileMount, ...]


@dataclass(frozen=True)
class GpuDrm:
    """A GPU's DRM nodes (``/dev/dri/card1``) and udev's by-path links to them."""

    bus_id: str
    nodes: tuple[str, ...]
    by_path: tuple[tuple[str, str], ...]
    """``(link target as written, link path)``: ``("../card1", "/dev/dri/by-path/pci-…-card")``."""


def discover_driver_files(tree: HostTree, library_dirs: Sequence[str],
                          binary_dirs: Sequence[str], version: str | None,
                          c_library: bool) -> DriverFiles:
    """Walk the driver root once (start-up, and again after the driver changed)."""
    libraries, lib_dirs = _libraries(tree, library_dirs, version)
    binaries = tuple(FileMount(tree.host_path(real), rel)
                     for name in BINARIES for rel, real in tree.find(binary_dirs, name))
    return DriverFiles(
        version=version,
        libraries=libraries,
        library_dirs=lib_dirs,
        c_library=c_library,
        binaries=binaries,
        configs=_configs(tree),
        firmware=_firmware(tree, version),
        sockets=_sockets(tree),
    )


def _libraries(tree: HostTree, library_dirs: Sequence[str], version: str | None,
               ) -> tuple[tuple[LibraryFile, ...], tuple[str, ...]]:
    if version is None:
        return (), ()
    versioned = f"lib*.so.{version}"
    # The first directory holding the driver's libraries: later ones (usr/lib, lib) hold the
    # 32-bit copies on RPM distributions, which a 64-bit container must not be given.
    home = next((d for d in library_dirs if tree.find([d], versioned)), None)
    if home is None:
        return (), ()
    dirs = (home, *(f"{home}/{sub}" for sub in LIBRARY_SUBDIRS))
    found: list[LibraryFile] = []
    used: list[str] = []
    for d in dirs:
        real_files = [(rel, real)
                      for pattern in (versioned, *UNVERSIONED_LIBRARIES)
                      for rel, real in tree.find([d], pattern)
                      if not tree.local_path(rel).is_symlink()]
        if not real_files:
            continue
        used.append(f"/{d}")
        for rel, real in real_files:
            stem = posixpath.basename(rel).partition(".so")[0] + ".so"
            # The installer's links to it: a link's real path is its target resolved inside
            # the root, so absolute links in a driver container's tree count too. Only this
            # library's names are resolved, not the whole (on a host, large) directory.
            links = [posixpath.basename(r) for r, target in tree.find([d], f"{stem}*")
                     if target == real and r != rel]
            soname = next((n for n in links if not n.endswith(".so")), None)
            dev = next((n for n in links if n.endswith(".so")), None)
            found.append(LibraryFile(tree.host_path(real), rel, soname, dev))
    # CUDA and NVML first: what every workload loads, and what a reader of a spec looks for.
    found.sort(key=lambda lib: (not lib.name.startswith(("libcuda.so.", "libnvidia-ml.so.")),
                                lib.rel))
    return tuple(found), tuple(used)


def _configs(tree: HostTree) -> tuple[FileMount, ...]:
    mounts: list[FileMount] = []
    seen: set[str] = set()
    for names, container_root, roots in (
        (SHARE_CONFIGS, "/usr/share", CONFIG_DIRS),
        (ETC_CONFIGS, "/etc", CONFIG_DIRS),
        (VULKAN_CONFIGS, "/etc", (*CONFIG_DIRS, "")),
    ):
        for name in names:
            d, base = posixpath.split(name)
            found = tree.find([posixpath.join(r, d) if r else d for r in roots], base)
            if found and found[0][1] not in seen:
                seen.add(found[0][1])
                mounts.append(FileMount(tree.host_path(found[0][1]), f"{container_root}/{name}"))
    return tuple(mounts)


def _sockets(tree: HostTree) -> tuple[FileMount, ...]:
    found = []
    for name in SOCKETS:
        d, base = posixpath.split(name)
        found.extend(tree.find([f"{r}/{d}" for r in SOCKET_DIRS], base)[:1])
    return tuple(FileMount(tree.host_path(real), rel) for rel, real in found)


def _firmware(tree: HostTree, version: str | None) -> tuple[FileMount, ...]:
    if version is None:
        return ()
    found = tree.find([f"{d}/{version}" for d in FIRMWARE_DIRS], "gsp*.bin")
    return tuple(FileMount(tree.host_path(real),
                           f"/lib/firmware/nvidia/{version}/{posixpath.basename(rel)}")
                 for rel, real in found)


# --- a GPU's DRM nodes -------------------------------------------------------------------


def gpu_bus_ids(dev: HostTree) -> dict[int, str]:
    """GPU minor → PCI bus id, from the driver's ``/proc/driver/nvidia/gpus/*/information``."""
    out: dict[int, str] = {}
    try:
        entries = sorted(p.name for p in dev.local_path(GPU_INFO_DIR).iterdir())
    except OSError:
        return out
    for entry in entries:
        try:
            text = dev.local_path(f"{GPU_INFO_DIR}/{entry}/information").read_text()
        except OSError:
            continue
        fields = dict((k.strip(), v.strip()) for k, _, v in
                      (line.partition(":") for line in text.splitlines()))
        minor = fields.get("Device Minor", "")
        if minor.isdigit():
            out[int(minor)] = fields.get("Bus Location") or entry
    return out


def gpu_drm(dev: HostTree, sysfs: Path, bus_id: str) -> GpuDrm:
    """The DRM nodes the kernel lists for PCI device ``bus_id`` (``sysfs/bus/pci/devices/
    <bus id>/drm/``) that exist under the device root, with their by-path links."""
    try:
        drm_dir = sysfs / "bus/pci/devices" / bus_id.lower() / "drm"
        entries = sorted(p.name for p in drm_dir.iterdir())
    except OSError:
        entries = []
    nodes = tuple(f"/dev/dri/{e}" for e in entries
                  if (e.startswith(("card", "renderD")) and e[-1:].isdigit()
                      and os.path.lexists(dev.local_path(f"/dev/dri/{e}"))))
    by_path = []
    for kind in ("card", "render"):
        link = f"/dev/dri/by-path/pci-{bus_id.lower()}-{kind}"
        try:
            target = str(dev.local_path(link).readlink())
        except OSError:
            continue
        if f"/dev/dri/{posixpath.basename(target)}" in nodes:
            by_path.append((target, link))
    return GpuDrm(bus_id, nodes, tuple(by_path))
