"""A fake NVIDIA driver root, so the CDI code runs its real discovery path in simulation.

Regular files stand in for device nodes; libraries are versioned files behind soname
symlinks, as a driver install lays them out; ``proc/devices`` names the ``nvidia-caps``
major so MIG capability nodes that were never created can still be described.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
)
BINARIES = ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
            "nvidia-persistenced")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def populate_driver_root(
    root: Path,
    gpu_minors: Sequence[int],
    mig: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    *,
    driver_version: str = DRIVER_VERSION,
    lib_dir: str = LIB_DIR,
) -> Path:
    """Create (or top up) a driver root with GPUs ``gpu_minors`` and MIG ``(gi, ci)`` pairs.

    ``lib_dir`` is where the libraries go (a distribution's layout, e.g. ``lib64``).
    """
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    for name in (*CONTROL_NODES, *(f"nvidia{m}" for m in gpu_minors)):
        (dev / name).touch()
    for cap in (1, 2):  # MIG config and monitor capabilities
        (dev / "nvidia-caps" / f"nvidia-cap{cap}").touch()
    proc = root / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "devices").write_text(
        f"Character devices:\n{NVIDIA_MAJOR} nvidia-frontend\n{NVIDIA_UVM_MAJOR} nvidia-uvm\n"
        f"{NVIDIA_CAPS_MAJOR} nvidia-caps\n"
    )
    for minor, instances in (mig or {}).items():
        for gi, ci in instances:
            add_mig_instance(root, minor, gi, ci)

    libs = root / lib_dir
    libs.mkdir(parents=True, exist_ok=True)
    for name, soname in LIBRARIES:
        real = libs / f"{name}.{driver_version}"
        real.write_text(f"simulated {real.name}\n")
        if soname is not None:
            link = libs / f"{name}.{soname}"
            link.unlink(missing_ok=True)
            link.symlink_to(real.name)
    bins = root / "usr" / "bin"
    bins.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        path = bins / name
        path.write_text(f"#!/bin/sh\necho 'simulated {name} {driver_version}'\n")
        path.chmod(0o755)
    return root


def add_mig_instance(root: Path, gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """What the driver shows once a GPU + compute instance exists; returns the cap minors."""
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


def _access_file(minor: int) -> str:
    # The layout of /proc/driver/nvidia/capabilities/.../access (mode 0444 = 292).
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
