"""What goes into a claim's CDI spec, computed from what discovery found: no file system here.

Libraries are mounted at their soname (``libcuda.so.1``) when the installer made one, so a
container's loader finds them without any hook; the hooks then add what NVIDIA's CDI adds
(the ``.so`` links, ``update-ldcache``, ``enable-cuda-compat``,
``disable-device-node-modification``). A driver root that is no OS tree (GKE's
``/home/kubernetes/bin/nvidia/lib64``) has no distribution's library path to keep: its
libraries go to the multiarch directory Debian and Ubuntu images search by default, which
``update-ldcache`` also adds for images of other distributions.
"""

from __future__ import annotations

import platform
import posixpath
from collections.abc import Sequence

from gpudra.driver.cdi import ContainerEdits, DeviceNode, Hook, Mount
from gpudra.driver.cdi_discovery import DriverFiles, FileMount, GpuDrm, LibraryFile
from gpudra.driver.cdi_hooks import HookBinary

READ_ONLY_BIND = ("ro", "nosuid", "nodev", "rbind", "rprivate")
# Sockets are written to: no "ro"; and never executed (NVIDIA's options for IPC mounts).
SOCKET_BIND = ("nosuid", "nodev", "rbind", "rprivate", "noexec")
# Decode, encode and optical flow: for devices with media engines (see uses_video).
VIDEO_LIBRARIES = ("libnvcuvid.so", "libnvidia-encode.so", "libnvidia-opticalflow.so")
# The multiarch triplet of a machine: the library directory Debian and Ubuntu search.
MULTIARCH = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu",
             "arm64": "aarch64-linux-gnu"}
# Library directories of a driver root that is no OS tree (GKE's installer directory).
GKE_STYLE_DIRS = ("/lib64", "/lib")
# Development links NVIDIA's CDI creates even when the host has none (dlopen("libcuda.so")).
ALWAYS_DEV_LINKS = {"libcuda.so": "libcuda.so", "libnvidia-opticalflow.so":
                    "libnvidia-opticalflow.so"}


def machine_multiarch(machine: str | None = None) -> str:
    m = machine or platform.machine()
    return MULTIARCH.get(m, f"{m}-linux-gnu")


def container_library_dir(rel_dir: str, files: DriverFiles, multiarch: str) -> str:
    """Where a library directory of the driver root appears in containers: as it is, unless
    the root is no OS tree and keeps its libraries in a top-level ``lib64``/``lib`` (GKE's
    installer directory), which no image's loader searches: then at the standard multiarch
    path, its subdirectories (``vdpau/``) following it."""
    home = files.library_dirs[0] if files.library_dirs else rel_dir
    if files.c_library or home not in GKE_STYLE_DIRS:
        return rel_dir
    return f"/usr/lib/{multiarch}{rel_dir[len(home):]}"


def _stem(name: str) -> str:
    """``libcuda.so.580.65.06`` → ``libcuda.so``."""
    return name.partition(".so")[0] + ".so"


def library_mounts(files: DriverFiles, *, video: bool, multiarch: str) -> list[Mount]:
    return [Mount(lib.host_path, _library_container_path(lib, files, multiarch), READ_ONLY_BIND)
            for lib in files.libraries if video or _stem(lib.name) not in VIDEO_LIBRARIES]


def _library_container_path(lib: LibraryFile, files: DriverFiles, multiarch: str) -> str:
    directory = container_library_dir(posixpath.dirname(lib.rel), files, multiarch)
    return f"{directory}/{lib.soname or lib.name}"


def library_links(files: DriverFiles, *, video: bool, multiarch: str) -> list[str]:
    """``target::link`` for create-symlinks: every library's ``.so`` link the host has (and
    those NVIDIA always makes), GLVND's indirect GLX and GBM's backend."""
    links: list[str] = []
    for lib in files.libraries:
        stem = _stem(lib.name)
        if not video and stem in VIDEO_LIBRARIES:
            continue
        path = _library_container_path(lib, files, multiarch)
        directory, mounted = posixpath.split(path)
        dev = lib.dev_link or ALWAYS_DEV_LINKS.get(stem)
        if dev is not None and dev != mounted:
            links.append(f"{mounted}::{directory}/{dev}")
        if stem == "libGLX_nvidia.so":
            links.append(f"{mounted}::{directory}/libGLX_indirect.so.0")
        if stem == "libnvidia-allocator.so":
            links.append(f"../{mounted}::{directory}/gbm/nvidia-drm_gbm.so")
    return links


def library_folders(files: DriverFiles, *, video: bool, multiarch: str) -> list[str]:
    return sorted({posixpath.dirname(m.container_path)
                   for m in library_mounts(files, video=video, multiarch=multiarch)})


def _mounts(found: Sequence[FileMount], options: tuple[str, ...]) -> list[Mount]:
    return [Mount(f.host_path, f.container_path, options) for f in found]


def driver_hooks(binary: HookBinary, files: DriverFiles, *, video: bool,
                 multiarch: str) -> list[Hook]:
    """NVIDIA's order: links, CUDA forward compatibility (it writes an ld.so.conf.d entry
    that the ldcache update then reads), the ldcache, then device node protection."""
    hooks = []
    links = library_links(files, video=video, multiarch=multiarch)
    if links:
        hooks.append(binary.hook("create-symlinks", *(w for x in links for w in ("--link", x))))
    if files.version is not None:
        hooks.append(binary.hook("enable-cuda-compat", f"--host-driver-version={files.version}"))
    folders = library_folders(files, video=video, multiarch=multiarch)
    if folders:
        hooks.append(binary.hook("update-ldcache", *(w for f in folders for w in ("--folder", f))))
    hooks.append(binary.hook("disable-device-node-modification"))
    return hooks


def common_edits(files: DriverFiles, control_nodes: Sequence[DeviceNode],
                 binary: HookBinary | None, *, video: bool, multiarch: str) -> ContainerEdits:
    """The edits every device of a claim shares: control nodes, the driver's files, hooks."""
    return ContainerEdits(
        # A legacy-mode nvidia-container-runtime must not inject devices on its own.
        env=("NVIDIA_VISIBLE_DEVICES=void",),
        device_nodes=control_nodes,
        mounts=[*library_mounts(files, video=video, multiarch=multiarch),
                *_mounts(files.binaries, READ_ONLY_BIND),
                *_mounts(files.configs, READ_ONLY_BIND),
                *_mounts(files.firmware, READ_ONLY_BIND),
                *_mounts(files.sockets, SOCKET_BIND)],
        hooks=([] if binary is None
               else driver_hooks(binary, files, video=video, multiarch=multiarch)),
    )


def gpu_edits(gpu_node: DeviceNode, drm: GpuDrm | None, drm_nodes: Sequence[DeviceNode],
              binary: HookBinary | None) -> ContainerEdits:
    """A full GPU: its node, its DRM nodes, and (with a hook binary) udev's by-path links to
    them and a ``chmod 755`` of ``/dev/dri``, which rootless runtimes create 0700."""
    hooks: list[Hook] = []
    if binary is not None and drm is not None and drm_nodes:
        if drm.by_path:
            hooks.append(binary.hook("create-symlinks", *(
                w for target, link in drm.by_path for w in ("--link", f"{target}::{link}"))))
        hooks.append(binary.hook("chmod", "--mode", "755", "--path", "/dev/dri"))
    return ContainerEdits(device_nodes=(gpu_node, *drm_nodes), hooks=hooks)
