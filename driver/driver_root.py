"""What an NVIDIA driver installation offers under its root: device nodes, libraries, binaries.

The driver root is ``/`` or where a driver container installed the driver (e.g.
``/run/nvidia/driver``). :data:`LIBRARY_DIRS` is the one list of places searched for its
libraries: loading NVML, the ``LD_LIBRARY_PATH`` of host commands and the CDI mounts all
use it, so a root one of them understands, all of them do.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from gpudra.driver.cdi import CdiError, ContainerEdits, DeviceNode, Mount

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
LIBRARIES = (
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
    "libcudadebugger.so.1",
    "libnvidia-opencl.so.1",
    "libnvidia-cfg.so.1",
    "libnvidia-allocator.so.1",
    "libnvidia-gpucomp.so.*",
)
REQUIRED_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
BINARY_DIRS = ("usr/bin", "usr/local/bin", "usr/sbin", "bin", "sbin")
BINARIES = ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
            "nvidia-persistenced")
READ_ONLY_BIND = ("ro", "nosuid", "nodev", "rbind", "rprivate")
_SYMLINK_HOPS = 40


def mig_capability_minors(gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """``(gi access, ci access)`` minors of ``/dev/nvidia-caps`` by NVIDIA's documented layout."""
    gi_access = 3 + 135 * gpu_minor + 9 * gi
    return gi_access, gi_access + 1 + ci


class DriverRoot:
    """What containers need from an NVIDIA driver installation, found once and cached.

    ``root`` is the driver root as the host (and so the container runtime) sees it:
    ``/`` or e.g. ``/run/nvidia/driver``; ``container_root`` is where this process sees the
    same tree when it differs. Container paths are the root-relative paths.
    """

    def __init__(self, root: Path, *, container_root: Path | None = None) -> None:
        self.root = root
        self.scan_root = container_root if container_root is not None else root
        self._common: ContainerEdits | None = None
        self._gpu_nodes: dict[int, DeviceNode] = {}
        self._caps_major: int | None = None

    def refresh(self) -> None:
        """Forget cached discoveries (after a driver upgrade)."""
        self._common = None
        self._gpu_nodes.clear()
        self._caps_major = None

    # --- libraries for this process -------------------------------------------------------

    def library_dirs(self) -> list[Path]:
        """The :data:`LIBRARY_DIRS` present in this process's view, in search order."""
        return [self.scan_root / d for d in LIBRARY_DIRS if (self.scan_root / d).is_dir()]

    def find_library(self, name: str) -> Path | None:
        """The file this process can load for library ``name``, from the first directory
        that has it (symlinks followed inside the root)."""
        found = self._find(LIBRARY_DIRS, name, {})
        return self.scan_root / found[0][1].lstrip("/") if found else None

    # --- container edits ------------------------------------------------------------------

    def common_edits(self) -> ContainerEdits:
        if self._common is None:
            nodes = []
            for name in CONTROL_NODES:
                node = self.device_node(f"/dev/{name}")
                if node is not None:
                    nodes.append(node)
                elif name in REQUIRED_CONTROL_NODES:
                    raise CdiError(self._missing_node(f"/dev/{name}", "nvidia-modprobe -u -c=0"))
            self._common = ContainerEdits(
                # A legacy-mode nvidia-container-runtime must not inject devices on its own.
                env=("NVIDIA_VISIBLE_DEVICES=void",),
                device_nodes=nodes,
                mounts=[*self._libraries(), *self._binaries()],
            )
        return self._common

    def gpu_edits(self, minor: int) -> ContainerEdits:
        # Only successes are cached: NVIDIA's #1380 cached a spec without the device node.
        node = self._gpu_nodes.get(minor)
        if node is None:
            node = self.device_node(f"/dev/nvidia{minor}")
            if node is None:
                fix = f"nvidia-modprobe -c={minor}"
                raise CdiError(self._missing_node(f"/dev/nvidia{minor}", fix))
            self._gpu_nodes[minor] = node
        return ContainerEdits(device_nodes=(node,))

    def mig_edits(self, parent_minor: int, gi: int, ci: int) -> ContainerEdits:
        """The parent GPU's node plus the GPU- and compute-instance access capabilities."""
        gi_minor, ci_minor = self.capability_minors(parent_minor, gi, ci)
        caps = ContainerEdits(device_nodes=(self._cap_node(gi_minor), self._cap_node(ci_minor)))
        return self.gpu_edits(parent_minor).merge(caps)

    def capability_minors(self, gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
        """From the driver's ``/proc`` access files when present, else the documented layout."""
        base = f"proc/driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"
        gi_default, ci_default = mig_capability_minors(gpu_minor, gi, ci)
        return (
            self._access_file_minor(f"{base}/access", gi_default),
            self._access_file_minor(f"{base}/ci{ci}/access", ci_default),
        )

    def device_node(self, path: str) -> DeviceNode | None:
        """The node at root-relative ``path``: type and numbers for a real char device."""
        try:
            st = (self.scan_root / path.lstrip("/")).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        host = self._host_path(path)
        if stat.S_ISCHR(st.st_mode):
            return DeviceNode(
                path=path,
                host_path=None if host == path else host,
                type="c",
                major=os.major(st.st_rdev),
                minor=os.minor(st.st_rdev),
            )
        # A regular file stands in for the node (simulated driver root).
        return DeviceNode(path=path, host_path=host)

    def _host_path(self, path: str) -> str:
        return str(self.root / path.lstrip("/"))

    def _missing_node(self, path: str, fix: str) -> str:
        return (
            f"device node {path} not found under driver root {self.root}: the NVIDIA driver"
            f" has not created it yet (run `{fix}` on the host); a container without it"
            " could not use the GPU"
        )

    def _access_file_minor(self, rel: str, default: int) -> int:
        try:
            text = (self.scan_root / rel).read_text()
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
                f"MIG capability device {path} not found under driver root {self.root} and"
                f" no 'nvidia-caps' entry in {self.scan_root / 'proc/devices'}"
            )
        return DeviceNode(path=path, type="c", major=major, minor=cap_minor)

    def _nvidia_caps_major(self) -> int | None:
        if self._caps_major is None:
            try:
                lines = (self.scan_root / "proc/devices").read_text().splitlines()
            except OSError:
                return None
            for line in lines:
                parts = line.split()
                if len(parts) == 2 and parts[1] == "nvidia-caps" and parts[0].isdigit():
                    self._caps_major = int(parts[0])
        return self._caps_major

    def _libraries(self) -> list[Mount]:
        listings: dict[str, list[str]] = {}
        mounts: list[Mount] = []
        for pattern in LIBRARIES:
            found = self._find(LIBRARY_DIRS, pattern, listings)
            if not found and pattern in REQUIRED_LIBRARIES:
                raise CdiError(
                    f"driver library {pattern} not found under driver root {self.root}"
                    f" (searched {', '.join(LIBRARY_DIRS)})"
                )
            mounts.extend(self._mount(rel, real) for rel, real in found)
        return mounts

    def _binaries(self) -> list[Mount]:
        listings: dict[str, list[str]] = {}
        return [self._mount(rel, real)
                for name in BINARIES for rel, real in self._find(BINARY_DIRS, name, listings)]

    def _mount(self, rel: str, real: str) -> Mount:
        return Mount(self._host_path(real), rel, READ_ONLY_BIND)

    def _find(
        self, dirs: Sequence[str], pattern: str, listings: dict[str, list[str]]
    ) -> list[tuple[str, str]]:
        """``(path, real path)`` in the root for ``pattern``, from the first directory with it."""
        for d in dirs:
            if d not in listings:
                # Listed, not globbed: glob drops symlinks that dangle from this process's
                # point of view, which absolute links inside a driver container's tree do.
                try:
                    listings[d] = sorted(p.name for p in (self.scan_root / d).iterdir())
                except OSError:
                    listings[d] = []
            found = []
            for name in fnmatch.filter(listings[d], pattern):
                rel = f"/{d}/{name}"
                real = self._resolve(rel)
                if real is not None:
                    found.append((rel, real))
            if found:
                return found
        return []

    def _resolve(self, path: str) -> str | None:
        """Follow symlinks inside the driver root: absolute targets are relative to the root.

        The runtime resolves a host path on the host, where an absolute link in a driver
        container's tree would point outside it; so mounts name the real file.
        """
        pending = [p for p in path.split("/") if p]
        resolved: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part in (".", ".."):
                if part == ".." and resolved:
                    resolved.pop()
                continue
            candidate = self.scan_root.joinpath(*resolved, part)
            if candidate.is_symlink():
                hops += 1
                if hops > _SYMLINK_HOPS:
                    return None
                target = str(candidate.readlink())
                if target.startswith("/"):
                    resolved = []
                pending = [p for p in target.split("/") if p] + pending
            elif candidate.exists():
                resolved.append(part)
            else:
                return None
        return "/" + "/".join(resolved)
