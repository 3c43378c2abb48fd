"""What an NVIDIA driver installation offers containers: device nodes, libraries, binaries,
firmware and the hooks that finish the libraries' setup.

Two roots, as NVIDIA's driver has them. The *driver root* holds libraries and binaries: ``/``,
a driver container's tree (``/run/nvidia/driver``) or GKE's ``/home/kubernetes/bin/nvidia``
(``lib64/``, ``bin/``, no ``dev/``). The *device root* holds ``dev/`` and ``proc/``, where the
kernel module shows itself: ``/`` on every common layout. :data:`LIBRARY_DIRS` is the one list
of places searched for libraries: loading NVML, host commands and the CDI mounts all use it.

Discoveries are cached and checked against the directories' identity (a few ``stat`` calls)
on every use, so a driver upgraded or reloaded under a running daemon is found again.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gpudra.driver import cdi_edits
from gpudra.driver.cdi import CdiError, ContainerEdits, DeviceNode
from gpudra.driver.cdi_discovery import (
    DriverFiles,
    GpuDrm,
    discover_driver_files,
    gpu_bus_ids,
    gpu_drm,
)
from gpudra.driver.cdi_hooks import (
    HOOK_DIRS,
    HookBinary,
    find_hook_binary,
    given_hook_binary,
    missing_hook_message,
)
from gpudra.driver.devices import Device
from gpudra.driver.host_tree import HostTree, identity


def _log() -> Any:
    """The logger, imported on first use: `gpudra explain` loads this module (through NVML)
    but never logs here, and importing structlog would slow its start."""
    import structlog

    return structlog.get_logger(__name__)


CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
REQUIRED_CONTROL_NODES = ("nvidiactl", "nvidia-uvm")
# 64-bit directories (multiarch, then lib64) before usr/lib and lib, which hold 32-bit
# libraries on RPM distributions; WSL's driver directory last.
LIBRARY_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib",
    "lib",
    "usr/lib/wsl/lib",
)
REQUIRED_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
BINARY_DIRS = ("usr/bin", "usr/local/bin", "usr/sbin", "bin", "sbin")
C_LIBRARY = "libc.so.6"
_VERSIONED_BY = ("libcuda.so.1", "libnvidia-ml.so.1")


def mig_capability_minors(gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """``(gi access, ci access)`` minors of ``/dev/nvidia-caps`` by NVIDIA's documented layout."""
    gi_access = 3 + 135 * gpu_minor + 9 * gi
    return gi_access, gi_access + 1 + ci


def uses_video(devices: Iterable[Device]) -> bool:
    """Whether a claim's containers get the media libraries: a full GPU, or a MIG device
    that publishes decoders or encoders (NVIDIA leaves them out otherwise)."""
    return any(d.type == "gpu" or d.capacity.get("decoders", 0) or d.capacity.get("encoders", 0)
               for d in devices)


class DriverRoot:
    """What containers need from an NVIDIA driver installation, found once and cached.

    ``root`` is the driver root as the host sees it; ``container_root`` is where this process
    sees the same tree when it differs. ``dev_root``/``dev_container_root`` are the same pair
    for the device root; without them device nodes are looked for under the driver root.
    ``hook_path`` is the host path of ``nvidia-cdi-hook`` when it is not under the driver root.
    ``sysfs`` is where PCI devices' DRM nodes are listed (default: the device root's ``sys/``
    when it has one, else ``/sys``); ``machine`` the architecture whose multiarch directory
    takes the libraries of a root that is no OS tree (default: this one's).
    Container paths are the root-relative paths, except those libraries'.
    """

    def __init__(self, root: Path, *, container_root: Path | None = None,
                 dev_root: Path | None = None, dev_container_root: Path | None = None,
                 hook_path: str | None = None, sysfs: Path | None = None,
                 machine: str | None = None) -> None:
        self.hook_path = hook_path
        self._multiarch = cdi_edits.machine_multiarch(machine)
        self.driver = HostTree.of(root, container_root)
        self.dev = (HostTree.of(dev_root, dev_container_root) if dev_root is not None
                    else HostTree.of(root, container_root))
        # The kernel's view of PCI devices: the device root's sys/ when it has one (the
        # simulator's), else this process's /sys, which in a container is the host's.
        self._sysfs = sysfs
        self._files: DriverFiles | None = None
        self._common: dict[bool, ContainerEdits] = {}
        self._gpu_edits: dict[int, ContainerEdits] = {}
        self._gpu_nodes: dict[int, DeviceNode] = {}
        self._bus_ids: dict[int, str] | None = None
        self._caps_major: int | None = None
        self._said_no_hooks = False
        self._watched = self._watch()
        self._identity = identity(self._watched)
        self._looked = threading.local()  # inside one_look(): this thread has looked

    @property
    def root(self) -> Path:
        return self.driver.host

    @property
    def scan_root(self) -> Path:
        return self.driver.local

    def refresh(self) -> None:
        """Forget cached discoveries (after a driver upgrade or reload)."""
        self._files = None
        self._common.clear()
        self._gpu_edits.clear()
        self._gpu_nodes.clear()
        self._bus_ids = None
        self._caps_major = None
        self._said_no_hooks = False
        self.driver.forget()
        self.dev.forget()
        self._watched = self._watch()  # a directory that appeared is now watched itself
        self._identity = identity(self._watched)

    def _watch(self) -> tuple[str, ...]:
        return (self.driver.watch((*LIBRARY_DIRS, *BINARY_DIRS, *HOOK_DIRS))
                + self.dev.watch(("dev",)))

    @contextlib.contextmanager
    def one_look(self) -> Iterator[None]:
        """Within: the driver's directories are looked at once, on entry, not again for each
        claim of a kubelet call (a look is dozens of stats; a call may hold 64 claims)."""
        self.refresh_if_changed()
        self._looked.inside = True
        try:
            yield
        finally:
            self._looked.inside = False

    def refresh_if_changed(self) -> bool:
        """Refresh when a library, binary or device directory changed since the last look."""
        if getattr(self._looked, "inside", False):
            return False
        if identity(self._watched) == self._identity:
            return False
        before = self.driver_version()
        self.refresh()
        _log().info("driver files changed; discovering them again",
                    driver_root=str(self.root), version_before=before,
                    version_now=self.driver_version())
        return True

    # --- what the installation is --------------------------------------------------------

    def library_dirs(self) -> list[Path]:
        """The :data:`LIBRARY_DIRS` present in this process's view, in search order."""
        return [self.driver.local_path(d) for d in LIBRARY_DIRS
                if self.driver.local_path(d).is_dir()]

    def find_library(self, name: str) -> Path | None:
        """The file this process can load for library ``name``, from the first directory
        that has it (symlinks followed inside the root)."""
        found = self.driver.find(LIBRARY_DIRS, name)
        return self.driver.local_path(found[0][1]) if found else None

    def find_binary(self, name: str) -> str | None:
        """Root-relative path of binary ``name`` (its link, not the link's target)."""
        found = self.driver.find(BINARY_DIRS, name)
        return found[0][0] if found else None

    def driver_version(self) -> str | None:
        """The version in the real file name of ``libcuda.so.1`` (``libcuda.so.580.65.06``)."""
        for name in _VERSIONED_BY:
            found = self.driver.find(LIBRARY_DIRS, name)
            if found:
                _, _, version = Path(found[0][1]).name.partition(".so.")
                if version and version[0].isdigit() and version != name.rpartition(".")[2]:
                    return version
        return None

    def kernel_module_version(self) -> str | None:
        """The loaded kernel module's version, from the device root's ``proc``."""
        try:
            text = self.dev.local_path("proc/driver/nvidia/version").read_text()
        except OSError:
            return None
        for word in text.split():
            if word[:1].isdigit() and word.count(".") >= 1:
                return word
        return None

    def has_c_library(self) -> bool:
        """Whether the root carries its own C library (a whole OS tree, not GKE's)."""
        return bool(self.driver.find(LIBRARY_DIRS, C_LIBRARY))

    # --- container edits ------------------------------------------------------------------

    def driver_files(self) -> DriverFiles:
        """Everything of the driver root that specs name, found once per discovery (start-up
        and after the driver changed), never per claim."""
        self.refresh_if_changed()
        if self._files is None:
            self._files = discover_driver_files(
                self.driver, LIBRARY_DIRS, BINARY_DIRS, self.driver_version(),
                self.has_c_library())
        return self._files

    def warm(self) -> DriverFiles:
        """Find the driver's files now (the node daemon's start-up), so the first prepare
        does not pay for the walk; says what was found."""
        files = self.driver_files()
        _log().info("driver files for CDI specs", driver_root=str(self.root),
                    version=files.version, libraries=len(files.libraries),
                    library_dirs=list(files.library_dirs), configs=len(files.configs),
                    binaries=len(files.binaries), firmware=len(files.firmware),
                    sockets=[m.container_path for m in files.sockets])
        return files

    def common_edits(self, *, video: bool = False) -> ContainerEdits:
        """Control nodes, every library of the driver (with the media ones when ``video``),
        configs, binaries, firmware, sockets and the hooks."""
        self.refresh_if_changed()
        cached = self._common.get(video)
        if cached is None:
            nodes = []
            for name in CONTROL_NODES:
                node = self.device_node(f"/dev/{name}")
                if node is not None:
                    nodes.append(node)
                elif name in REQUIRED_CONTROL_NODES:
                    raise CdiError(self._missing_node(f"/dev/{name}", "nvidia-modprobe -u -c=0"))
            files = self.driver_files()
            self._check_libraries(files)
            cached = self._common[video] = cdi_edits.common_edits(
                files, nodes, self._hook_binary(), video=video, multiarch=self._multiarch)
        return cached

    def gpu_edits(self, minor: int) -> ContainerEdits:
        """A full GPU: its node, and its DRM nodes (found through its PCI bus id)."""
        self.refresh_if_changed()
        cached = self._gpu_edits.get(minor)
        if cached is None:
            node = self._gpu_node(minor)
            drm = self.gpu_drm(minor)
            drm_nodes = [] if drm is None else [n for n in map(self.device_node, drm.nodes)
                                                if n is not None]
            cached = self._gpu_edits[minor] = cdi_edits.gpu_edits(
                node, drm, drm_nodes, self._hook_binary())
        return cached

    def gpu_drm(self, minor: int) -> GpuDrm | None:
        """The DRM nodes of GPU ``minor``; ``None`` when the driver does not show its bus id."""
        if self._bus_ids is None:
            self._bus_ids = gpu_bus_ids(self.dev)
        bus_id = self._bus_ids.get(minor)
        if bus_id is None:
            return None
        sysfs = self._sysfs
        if sysfs is None:
            local_sys = self.dev.local_path("sys")
            sysfs = local_sys if local_sys.is_dir() else Path("/sys")
        return gpu_drm(self.dev, sysfs, bus_id)

    def _gpu_node(self, minor: int) -> DeviceNode:
        # Only successes are cached: NVIDIA's #1380 cached a spec without the device node.
        node = self._gpu_nodes.get(minor)
        if node is None:
            node = self.device_node(f"/dev/nvidia{minor}")
            if node is None:
                fix = f"nvidia-modprobe -c={minor}"
                raise CdiError(self._missing_node(f"/dev/nvidia{minor}", fix))
            self._gpu_nodes[minor] = node
        return node

    def mig_edits(self, parent_minor: int, gi: int, ci: int) -> ContainerEdits:
        """The parent GPU's node plus the GPU- and compute-instance access capabilities."""
        gi_minor, ci_minor = self.capability_minors(parent_minor, gi, ci)
        # No DRM nodes: NVIDIA gives them only to MIG devices of graphics (+gfx) profiles.
        self.refresh_if_changed()
        return ContainerEdits(device_nodes=(self._gpu_node(parent_minor),
                                            self._cap_node(gi_minor), self._cap_node(ci_minor)))

    def capability_minors(self, gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
        """From the driver's ``/proc`` access files when present, else the documented layout."""
        base = f"proc/driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"
        gi_default, ci_default = mig_capability_minors(gpu_minor, gi, ci)
        return (
            self._access_file_minor(f"{base}/access", gi_default),
            self._access_file_minor(f"{base}/ci{ci}/access", ci_default),
        )

    def device_node(self, path: str) -> DeviceNode | None:
        """The node at ``path`` under the device root: type and numbers for a char device."""
        try:
            st = self.dev.local_path(path).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        host = self.dev.host_path(path)
        host_path = None if host == path else host
        if stat.S_ISCHR(st.st_mode):
            return DeviceNode(
                path=path,
                host_path=host_path,
                type="c",
                major=os.major(st.st_rdev),
                minor=os.minor(st.st_rdev),
            )
        # A regular file stands in for the node (simulated device root).
        return DeviceNode(path=path, host_path=host_path)

    def _missing_node(self, path: str, fix: str) -> str:
        return (
            f"device node {path} not found under device root {self.dev.host}: the NVIDIA"
            f" driver has not created it yet (run `{fix}` on the host); a container without"
            " it could not use the GPU"
        )

    def _access_file_minor(self, rel: str, default: int) -> int:
        try:
            text = self.dev.local_path(rel).read_text()
        except OSError:
            return default
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
                return int(value)
        return default

    def _cap_node(self, cap_minor: int) -> DeviceNode:
        path = f"/dev/nvidia-caps/nvidia-cap{cap_minor}"
        node = self.device_node(path)
        if node is not None:
            return node
        # Not created on the host yet: the runtime can make it from the numbers, as
        # NVIDIA's driver does (its nvcdi MIG specs were incomplete, #787).
        major = self._nvidia_caps_major()
        if major is None:
            raise CdiError(
                f"MIG capability device {path} not found under device root {self.dev.host} and"
                f" no 'nvidia-caps' entry in {self.dev.local_path('proc/devices')}"
            )
        return DeviceNode(path=path, type="c", major=major, minor=cap_minor)

    def _nvidia_caps_major(self) -> int | None:
        if self._caps_major is None:
            try:
                lines = self.dev.local_path("proc/devices").read_text().splitlines()
            except OSError:
                return None
            for line in lines:
                parts = line.split()
                if len(parts) == 2 and parts[1] == "nvidia-caps" and parts[0].isdigit():
                    self._caps_major = int(parts[0])
        return self._caps_major

    def _check_libraries(self, files: DriverFiles) -> None:
        names = {lib.soname for lib in files.libraries}
        for name in REQUIRED_LIBRARIES:
            if name not in names:
                raise CdiError(
                    f"driver library {name} not found under driver root {self.root}"
                    f" (searched {', '.join(LIBRARY_DIRS)})"
                )

    def _hook_binary(self) -> HookBinary | None:
        if self.hook_path is not None:
            return given_hook_binary(self.hook_path)
        binary = find_hook_binary(self.driver)
        if binary is None and not self._said_no_hooks:
            # Once per discovery, not per variant of the edits.
            _log().warning("CDI hooks unavailable", reason=missing_hook_message(self.driver))
            self._said_no_hooks = True
        return binary
