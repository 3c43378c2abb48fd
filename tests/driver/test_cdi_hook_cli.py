"""``nvidia-cdi-hook`` (driver/cdi_hook_cli.py), run as the container runtime runs it: a copy
of the file on its own (as the chart puts it on the host), the OCI state on standard input,
the hooks of a spec our discovery wrote, against a container root filesystem made from the
spec's mounts."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudra.driver import cdi_hook_cli
from gpudra.driver.cdi import CdiDevice, build_claim_spec
from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.sim.driver_root import DRIVER_VERSION, populate_driver_root

UID = "fb5d2f1e-7c4a-4e2b-9f61-3a8d5c0e7b12"
LIB = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def hook(tmp_path: Path) -> Path:
    """The hook as the chart's init container leaves it on the host: one file, mode 0755."""
    copy = tmp_path / "bin/nvidia-cdi-hook"
    copy.parent.mkdir()
    shutil.copyfile(cdi_hook_cli.__file__, copy)
    copy.chmod(0o755)
    return copy


def bundle(tmp_path: Path) -> tuple[Path, Path]:
    """An OCI bundle whose root filesystem looks like an Ubuntu CUDA image."""
    b = tmp_path / "bundle"
    rootfs = b / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/debian_version").write_text("12.0\n")
    (rootfs / "dev/dri").mkdir(parents=True)
    (rootfs / "dev/dri").chmod(0o700)
    compat = rootfs / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.590.10.01").write_text("newer than the host's 580\n")
    (b / "config.json").write_text(json.dumps({"ociVersion": "1.2.0", "root": {"path": "rootfs"}}))
    return b, rootfs


def run_hook(hook: Path, args: list[str], bundle_dir: Path) -> subprocess.CompletedProcess[str]:
    state = {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 1,
             "bundle": str(bundle_dir)}
    # -I -S: no site-packages, no gpudra: the file must stand alone, as it does on a host.
    return subprocess.run([sys.executable, "-I", "-S", str(hook), *args], input=json.dumps(state),
                          capture_output=True, text=True, timeout=60, check=False)


def full_gpu_spec(tmp_path: Path, hook: Path) -> tuple[dict[str, Any], Path, Path]:
    driver_dir, dev_dir = tmp_path / "driver-root", tmp_path / "dev-root"
    populate_driver_root(driver_dir, [0], layout="operator", dev_root=dev_dir)
    roots = DriverRoot(driver_dir, dev_root=dev_dir, hook_path=str(hook))
    spec = build_claim_spec(driver="gpu.nvidia.com", claim_uid=UID,
                            devices=[CdiDevice("gpu-0", roots.gpu_edits(0))],
                            common=roots.common_edits(video=True))
    return spec, driver_dir, dev_dir


def apply_mounts(spec: dict[str, Any], rootfs: Path) -> None:
    """What the runtime's bind mounts would show: each host file at its container path."""
    for mount in spec["containerEdits"]["mounts"]:
        target = rootfs / mount["containerPath"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mount["hostPath"], target)
    for node in [*spec["containerEdits"]["deviceNodes"],
                 *spec["devices"][0]["containerEdits"]["deviceNodes"]]:
        target = rootfs / node["path"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()


def test_the_spec_hooks_finish_a_container(tmp_path, hook):
    spec, _, _ = full_gpu_spec(tmp_path, hook)
    bundle_dir, rootfs = bundle(tmp_path)
    apply_mounts(spec, rootfs)
    hooks = [*spec["containerEdits"]["hooks"], *spec["devices"][0]["containerEdits"]["hooks"]]
    assert {h["path"] for h in hooks} == {str(hook)}
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    real_ldconfig = os.geteuid() == 0 and Path(ldconfig).exists()
    recorded = tmp_path / "ldconfig-args"
    fake = tmp_path / "fake-ldconfig"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {recorded}\n")
    fake.chmod(0o755)
    for h in hooks:
        args = h["args"][1:]  # args[0] is the program's name
        if args[0] == "update-ldcache":
            # ldconfig -r chroots: only root may; otherwise record what it was asked.
            args = [*args, "--ldconfig-path", ldconfig if real_ldconfig else str(fake)]
        done = run_hook(hook, args, bundle_dir)
        assert done.returncode == 0, (args[0], done.stderr)
    lib = rootfs / LIB.lstrip("/")
    assert str((lib / "libcuda.so").readlink()) == "libcuda.so.1"
    assert (lib / "libcuda.so").read_text() == f"simulated libcuda.so.{DRIVER_VERSION}\n"
    assert str((lib / "libGLX_indirect.so.0").readlink()) == "libGLX_nvidia.so.0"
    assert (lib / "gbm/nvidia-drm_gbm.so").resolve() == (lib / "libnvidia-allocator.so.1")
    assert str((rootfs / "dev/dri/by-path/pci-0000:18:00.0-card").readlink()) == "../card1"
    assert stat.S_IMODE((rootfs / "dev/dri").stat().st_mode) == 0o755
    confd = rootfs / "etc/ld.so.conf.d"
    (compat,) = confd.glob("00-compat-*.conf")
    assert compat.read_text() == "/usr/local/cuda/compat\n"  # 590 > the host's 580
    (nvcr,) = confd.glob("00-nvcr-*.conf")
    assert nvcr.read_text() == f"{LIB}\n{LIB}/vdpau\n"
    (system,) = confd.glob("zz-nvcr-*.conf")
    assert LIB in system.read_text()  # Debian's own directories stay in the cache
    assert (rootfs / "etc/ld.so.conf").read_text() == "include /etc/ld.so.conf.d/*.conf\n"
    if real_ldconfig:
        assert (rootfs / "etc/ld.so.cache").exists()
    else:
        assert recorded.read_text().split() == [
            "-r", str(rootfs), "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache"]
    # Run twice (a restarted container): the same links, no error.
    again = run_hook(hook, hooks[0]["args"][1:], bundle_dir)
    assert again.returncode == 0, again.stderr


def test_compat_libraries_older_than_the_host_driver_are_left_alone(tmp_path, hook):
    bundle_dir, rootfs = bundle(tmp_path)
    old = rootfs / "usr/local/cuda/compat/libcuda.so.590.10.01"
    old.rename(old.with_name("libcuda.so.535.104.05"))
    done = run_hook(hook, ["enable-cuda-compat", f"--host-driver-version={DRIVER_VERSION}"],
                    bundle_dir)
    assert done.returncode == 0, done.stderr
    assert not (rootfs / "etc/ld.so.conf.d").exists()


def test_container_symlinks_never_reach_the_host(tmp_path, hook):
    bundle_dir, rootfs = bundle(tmp_path)
    outside = tmp_path / "host-dir"
    outside.mkdir()
    # An image whose /evil points at a host path: the hook resolves it inside the root.
    (rootfs / "evil").symlink_to(str(outside))
    done = run_hook(hook, ["create-symlinks", "--link", "x::/evil/link"], bundle_dir)
    assert done.returncode == 0, done.stderr
    assert list(outside.iterdir()) == []
    assert str((rootfs / str(outside).lstrip("/") / "link").readlink()) == "x"


def test_cli_shape_errors_and_unknown_hooks(tmp_path, hook):
    bundle_dir, _ = bundle(tmp_path)
    bad = run_hook(hook, ["create-symlinks", "--link", "no-separator"], bundle_dir)
    assert bad.returncode == 1 and "invalid symlink specification" in bad.stderr
    future = run_hook(hook, ["update-application-profile", "--x"], bundle_dir)
    assert future.returncode == 0 and "unsupported CDI hook: update-application-profile" \
        in future.stderr
    assert run_hook(hook, ["--debug", "noop"], bundle_dir).returncode == 0
    no_mode = run_hook(hook, ["chmod", "--path", "/dev/dri"], bundle_dir)
    assert no_mode.returncode == 2 and "--mode" in no_mode.stderr
    no_state = subprocess.run([sys.executable, str(hook), "chmod", "--mode", "755", "--path",
                               "/x"], input="{}", capture_output=True, text=True, check=False)
    assert no_state.returncode == 1 and "no absolute bundle path" in no_state.stderr


def test_device_node_modification_is_switched_off_in_the_params_copy():
    params = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n"
    assert cdi_hook_cli.params_without_device_file_changes(params) == \
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\nDeviceFileUID: 0\n"
    assert cdi_hook_cli.params_without_device_file_changes(
        params.replace(": 1", ": 0")) is None


def test_without_a_params_file_the_hook_changes_nothing(tmp_path):
    _, rootfs = bundle(tmp_path)
    assert not cdi_hook_cli.disable_device_node_modification(
        rootfs, host_params=str(tmp_path / "no-params"))
