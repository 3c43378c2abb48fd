"""A fake NVIDIA driver install, so the CDI code runs its real discovery path in simulation.

Regular files stand in for device nodes; libraries are versioned files behind soname
symlinks, as a driver install lays them out; ``proc/devices`` names the ``nvidia-caps``
major so MIG capability nodes that were never created can still be described.

:data:`LAYOUTS` are the driver roots real clusters have: a driver installed on the host
(Debian multiarch), the GPU Operator's driver container tree, and GKE's installer directory
(``lib64/``, ``bin/``, device nodes on the host). The device root (``dev/``, ``proc/``) goes
under ``dev_root``, by default the driver root itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudra.driver.driver_root import mig_capability_minors

DRIVER_VERSION = "580.65.06"
NVIDIA_MAJOR = 195
NVIDIA_CAPS_MAJOR = 237
NVIDIA_UVM_MAJOR = 510
LIB_DIR = "usr/lib/x86_64-linux-gnu"
# (library, soname suffix); libnvidia-gpucomp ships without a soname link.
LIBRARIES = (
    ("libcuda.so", "1"),
    ("libnvidia-ml.so", "1"),
    ("libnvidia-ptxjitcompiler.so", "1"),
    ("libnvidia-nvvm.so", "4"),
    ("libcudadebugger.so", "1"),
    ("libnvidia-gpucomp.so", None),
    ("libnvcuvid.so", "1"),
    ("libnvidia-encode.so", "1"),
    ("libnvidia-opticalflow.so", "1"),
)
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server", "nvidia-persistenced")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


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


LAYOUTS: Mapping[str, Layout] = {
    # A driver installed on a Debian/Ubuntu host, with the Container Toolkit.
    "host": Layout(LIB_DIR, "usr/bin", "lib/firmware/nvidia", True, "usr/bin"),
    # The GPU Operator's driver container (Ubuntu), whose toolkit lives on the host.
    "operator": Layout(LIB_DIR, "usr/bin", "lib/firmware/nvidia", True, None),
    # GKE's driver installer directory, /home/kubernetes/bin/nvidia: NVIDIA files only.
    "gke": Layout("lib64", "bin", None, False, None),
    # Only the driver's own files (what tests of one piece need).
    "minimal": Layout(LIB_DIR, "usr/bin", None, False, None),
}


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
) -> Path:
    """Create (or top up) a driver root with GPUs ``gpu_minors`` and MIG ``(gi, ci)`` pairs.

    ``layout`` is one of :data:`LAYOUTS`; ``lib_dir`` overrides its library directory (a
    distribution's layout, e.g. ``usr/lib64``). ``devices=False`` leaves the device root be.
    """
    shape = LAYOUTS[layout]
    if devices:
        populate_device_root(dev_root or root, gpu_minors, mig, driver_version=driver_version)
    libs = root / (lib_dir or shape.lib_dir)
    libs.mkdir(parents=True, exist_ok=True)
    for name, soname in LIBRARIES:
        real = libs / f"{name}.{driver_version}"
        real.write_text(f"simulated {real.name}\n")
        if soname is not None:
            _link(libs / f"{name}.{soname}", real.name)
    if shape.c_library:
        (libs / "libc.so.6").write_text("simulated C library\n")
    bins = root / shape.bin_dir
    bins.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        _script(bins / name, f"#!/bin/sh\necho 'simulated {name} {driver_version}'\n")
    if shape.hook_dir is not None:
        _script(root / shape.hook_dir / "nvidia-cdi-hook", "#!/bin/sh\nexit 0\n")
    if shape.firmware_dir is not None:
        firmware = root / shape.firmware_dir / driver_version
        firmware.mkdir(parents=True, exist_ok=True)
        for name in FIRMWARE:
            (firmware / name).write_text(f"simulated {name}\n")
    return root


def populate_device_root(
    root: Path,
    gpu_minors: Sequence[int],
    mig: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    *,
    driver_version: str = DRIVER_VERSION,
) -> Path:
    """``dev/`` and ``proc/`` as a loaded kernel module of ``driver_version`` shows them."""
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
        f"{NVIDIA_CAPS_MAJOR} nvidia-caps\n"
    )
    (proc / "driver/nvidia/version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version}  (simulated)\n")
    for minor, instances in (mig or {}).items():
        for gi, ci in instances:
            add_mig_instance(root, minor, gi, ci)
    return root


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
