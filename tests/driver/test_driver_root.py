"""Driver-root discovery: device nodes, MIG capabilities, libraries and binaries, and the one
list of library directories that NVML loading, CDI specs and host commands share."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gpudra.driver.cdi import (
    CdiDevice,
    CdiError,
    ContainerEdits,
    DeviceNode,
    Mount,
    build_claim_spec,
    qualified_name,
)
from gpudra.driver.cdi_edits import machine_multiarch
from gpudra.driver.commands import HostCommandRunner
from gpudra.driver.driver_root import LIBRARY_DIRS, DriverRoot, mig_capability_minors
from gpudra.driver.nvml import NvmlUnavailable, open_nvml
from gpudra.driver.sim.driver_root import NVIDIA_CAPS_MAJOR, populate_driver_root

DRIVER = "gpu.nvidia.com"
UID = "0b5d2f1e-7c4a-4e2b-9f61-3a8d5c0e7b12"  # starts with a digit, as claim UIDs can
RO = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


@pytest.fixture
def root(tmp_path):
    return populate_driver_root(tmp_path / "driver", [0, 1], {1: [(2, 0)]})


@pytest.fixture
def driver_root(root):
    return DriverRoot(root)


def node(root, path):
    return {"path": path, "hostPath": f"{root}{path}"}


def test_gpu_claim_spec(root, driver_root):
    spec = build_claim_spec(driver=DRIVER, claim_uid=UID,
                            devices=[CdiDevice("gpu-0", driver_root.gpu_edits(0))],
                            common=ContainerEdits())
    assert spec == {
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [{"name": f"{UID}-gpu-0",
                     "containerEdits": {"deviceNodes": [node(root, "/dev/nvidia0")]}}],
    }
    assert qualified_name(DRIVER, UID, "gpu-0") == f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"


def test_mig_device_has_parent_node_and_both_access_capabilities(root, driver_root):
    gi_minor, ci_minor = mig_capability_minors(1, 2, 0)
    assert (gi_minor, ci_minor) == (3 + 135 + 18, 3 + 135 + 18 + 1)
    edits = driver_root.mig_edits(1, 2, 0)
    assert [n.to_json() for n in edits.device_nodes] == [
        node(root, "/dev/nvidia1"),
        node(root, f"/dev/nvidia-caps/nvidia-cap{gi_minor}"),
        node(root, f"/dev/nvidia-caps/nvidia-cap{ci_minor}"),
    ]


def test_mig_capability_minors_come_from_proc_when_the_driver_says_so(root, driver_root):
    access = root / "proc/driver/nvidia/capabilities/gpu1/mig/gi2"
    (access / "access").write_text("DeviceFileMinor: 400\nDeviceFileMode: 292\n")
    (access / "ci0" / "access").write_text("DeviceFileMinor: 401\n")
    (root / "dev/nvidia-caps/nvidia-cap400").touch()
    assert driver_root.capability_minors(1, 2, 0) == (400, 401)
    nodes = driver_root.mig_edits(1, 2, 0).device_nodes
    assert nodes[1] == DeviceNode("/dev/nvidia-caps/nvidia-cap400",
                                  host_path=f"{root}/dev/nvidia-caps/nvidia-cap400")
    # No node on the host for 401: described by numbers, for the runtime to create.
    assert nodes[2] == DeviceNode("/dev/nvidia-caps/nvidia-cap401", type="c",
                                  major=NVIDIA_CAPS_MAJOR, minor=401)


def test_mig_capability_without_node_or_major_is_an_error(root, driver_root):
    (root / "proc/devices").write_text("Character devices:\n195 nvidia-frontend\n")
    with pytest.raises(CdiError, match=r"MIG capability device /dev/nvidia-caps/nvidia-cap\d+"
                                       " not found under device root"):
        driver_root.mig_edits(0, 1, 0)


def test_common_edits(root, driver_root):
    common = driver_root.common_edits()
    assert common.env == ("NVIDIA_VISIBLE_DEVICES=void",)
    assert [n.path for n in common.device_nodes] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
    lib = "/usr/lib/x86_64-linux-gnu"
    mounts = {m.container_path: m for m in common.mounts}
    # Sonames are symlinks; the mount names the real file.
    assert mounts[f"{lib}/libcuda.so.1"] == Mount(
        f"{root}{lib}/libcuda.so.580.65.06", f"{lib}/libcuda.so.1", RO)
    assert {f"{lib}/libnvidia-ml.so.1", f"{lib}/libnvidia-ptxjitcompiler.so.1",
            f"{lib}/libnvidia-nvvm.so.4", f"{lib}/libnvidia-gpucomp.so.580.65.06",
            "/usr/bin/nvidia-smi", "/usr/bin/nvidia-cuda-mps-control",
            "/usr/bin/nvidia-cuda-mps-server", "/usr/bin/nvidia-persistenced"} <= set(mounts)
    assert all(m.options == tuple(RO) and m.type is None for m in common.mounts)

    spec = build_claim_spec(driver=DRIVER, claim_uid=UID,
                            devices=[CdiDevice("gpu-1", driver_root.gpu_edits(1))],
                            common=common)
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert spec["containerEdits"]["mounts"][0] == {
        "hostPath": f"{root}{lib}/libcuda.so.580.65.06",
        "containerPath": f"{lib}/libcuda.so.1", "options": RO}


def test_optional_pieces_may_be_missing_required_ones_may_not(root):
    (root / "dev/nvidia-modeset").unlink()
    (root / "usr/bin/nvidia-persistenced").unlink()
    common = DriverRoot(root).common_edits()
    assert "/dev/nvidia-modeset" not in [n.path for n in common.device_nodes]
    assert "/usr/bin/nvidia-persistenced" not in [m.container_path for m in common.mounts]

    (root / "dev/nvidia-uvm").unlink()
    with pytest.raises(CdiError, match=r"device node /dev/nvidia-uvm not found.*nvidia-modprobe"):
        DriverRoot(root).common_edits()
    (root / "dev/nvidia-uvm").touch()
    (root / "usr/lib/x86_64-linux-gnu/libcuda.so.1").unlink()
    with pytest.raises(CdiError, match=r"driver library libcuda\.so\.1 not found under driver"):
        DriverRoot(root).common_edits()


def test_missing_gpu_device_node_is_an_error_not_an_empty_spec(root, driver_root):
    message = f"device node /dev/nvidia5 not found under device root {root}"
    with pytest.raises(CdiError, match=message):
        driver_root.gpu_edits(5)
    # A miss is not cached: once the driver creates the node, prepare works.
    (root / "dev/nvidia5").touch()
    assert driver_root.gpu_edits(5).device_nodes[0].path == "/dev/nvidia5"


def test_discovery_is_cached_until_the_driver_files_change(root, driver_root):
    first = driver_root.common_edits()
    assert driver_root.common_edits() is first
    assert driver_root.gpu_edits(0) == driver_root.gpu_edits(0)
    # A driver upgrade replaces the libraries: the next use finds out, no restart needed.
    (root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").unlink()
    with pytest.raises(CdiError, match=r"libnvidia-ml\.so\.1"):
        driver_root.common_edits()
    populate_driver_root(root, [0, 1], driver_version="590.10.01")
    driver_root.refresh()  # explicit, too
    mounts = {m.container_path: m.host_path for m in driver_root.common_edits().mounts}
    lib = "/usr/lib/x86_64-linux-gnu"
    assert mounts[f"{lib}/libnvidia-ml.so.1"] == f"{root}{lib}/libnvidia-ml.so.590.10.01"
    assert driver_root.driver_version() == "590.10.01"


def test_real_character_devices_carry_type_and_numbers(tmp_path):
    st = Path("/dev/null").stat()
    # A driver root at / : host path and container path coincide, so no hostPath.
    assert DriverRoot(Path("/")).device_node("/dev/null") == DeviceNode(
        "/dev/null", type="c", major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))
    # /dev/null standing in for a GPU under another root.
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidia3").symlink_to("/dev/null")
    assert DriverRoot(tmp_path).gpu_edits(3).device_nodes == (DeviceNode(
        "/dev/nvidia3", host_path=f"{tmp_path}/dev/nvidia3", type="c",
        major=os.major(st.st_rdev), minor=os.minor(st.st_rdev)),)


def test_container_root_is_scanned_and_host_root_is_written(root):
    seen_from_host = Path("/run/nvidia/driver")
    driver_root = DriverRoot(seen_from_host, container_root=root)
    assert driver_root.gpu_edits(0).device_nodes[0].host_path == "/run/nvidia/driver/dev/nvidia0"
    libcuda = driver_root.common_edits().mounts[0]
    assert libcuda.host_path == "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"


def test_absolute_library_symlinks_resolve_inside_the_driver_root(tmp_path):
    populate_driver_root(tmp_path, [0], lib_dir="usr/lib64")
    lib64 = tmp_path / "usr/lib64"
    (tmp_path / "usr/lib").mkdir()
    # Absolute links in a driver container's tree mean "inside that tree".
    (lib64 / "libcuda.so.1").unlink()
    (lib64 / "libcuda.so.1").symlink_to("/usr/lib/../lib64/libcuda.so.580.65.06")
    mounts = {m.container_path: m for m in DriverRoot(tmp_path).common_edits().mounts}
    assert mounts["/usr/lib64/libcuda.so.1"].host_path == \
        f"{tmp_path}/usr/lib64/libcuda.so.580.65.06"


# --- the one list of library directories ------------------------------------------------


def print_library_path(root):
    """Make the root's nvidia-smi print the LD_LIBRARY_PATH it runs with."""
    (root / "usr/bin/nvidia-smi").write_text('#!/bin/sh\necho "$LD_LIBRARY_PATH"\n')


def nvml_load_error(root):
    """What open_nvml says loading the root's libnvidia-ml: the simulated file is no ELF."""
    with pytest.raises(NvmlUnavailable, match="cannot load") as failed:
        open_nvml(driver_root=root)
    return str(failed.value)


@pytest.mark.parametrize("lib_dir", LIBRARY_DIRS)
def test_nvml_cdi_and_host_commands_search_the_same_library_dirs(tmp_path, lib_dir):
    root = populate_driver_root(tmp_path, [0], lib_dir=lib_dir)
    mounts = {m.container_path for m in DriverRoot(root).common_edits().mounts}
    # A top-level lib64/ or lib/ of a root that is no OS tree (GKE's) is no directory an
    # image's loader searches: containers get those libraries at the standard path.
    in_container = f"usr/lib/{machine_multiarch()}" if lib_dir in ("lib64", "lib") else lib_dir
    assert f"/{in_container}/libnvidia-ml.so.1" in mounts
    assert nvml_load_error(root).startswith(
        f"cannot load {root}/{lib_dir}/libnvidia-ml.so.580.65.06:")
    print_library_path(root)
    library_path = HostCommandRunner(root).run(["nvidia-smi"]).strip().split(":")
    assert f"{root}/{lib_dir}" in library_path


def test_64_bit_directories_win_over_usr_lib_everywhere(tmp_path):
    # usr/lib holds the 32-bit libraries on RPM distributions.
    root = populate_driver_root(tmp_path, [0], lib_dir="usr/lib")
    populate_driver_root(root, [0], lib_dir="usr/lib64")
    mounts = {m.container_path for m in DriverRoot(root).common_edits().mounts}
    assert "/usr/lib64/libnvidia-ml.so.1" in mounts
    assert "/usr/lib/libnvidia-ml.so.1" not in mounts
    assert f"{root}/usr/lib64/libnvidia-ml.so" in nvml_load_error(root)
    print_library_path(root)
    library_path = HostCommandRunner(root).run(["nvidia-smi"]).strip().split(":")
    assert library_path.index(f"{root}/usr/lib64") < library_path.index(f"{root}/usr/lib")


def test_nvml_follows_absolute_links_inside_the_driver_root(tmp_path):
    root = populate_driver_root(tmp_path, [0], lib_dir="lib64")
    link = root / "lib64/libnvidia-ml.so.1"
    link.unlink()
    # In a driver container's tree, "/lib64/..." means that tree's lib64, not this process's.
    link.symlink_to("/lib64/libnvidia-ml.so.580.65.06")
    message = nvml_load_error(root)
    assert re.match(f"cannot load {re.escape(str(root))}/lib64/libnvidia-ml.so.580.65.06:",
                    message)
