"""The driver roots real clusters have each give a complete CDI spec: device nodes from the
device root, libraries, binaries, firmware and the library hooks from the driver root."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpudra.driver.cdi import CdiDevice, build_claim_spec, write_spec
from gpudra.driver.cdi_edits import machine_multiarch
from gpudra.driver.devices import Device
from gpudra.driver.driver_root import DriverRoot, uses_video
from gpudra.driver.sim.driver_root import DRIVER_VERSION, LAYOUTS, populate_driver_root

DRIVER = "gpu.nvidia.com"
UID = "fb5d2f1e-7c4a-4e2b-9f61-3a8d5c0e7b12"  # starts with a letter: no 0.5.0 for the name
# layout → (where the host has the driver root, library dir in containers)
HOST_ROOTS = {
    "host": ("/", "/usr/lib/x86_64-linux-gnu"),
    "operator": ("/run/nvidia/driver", "/usr/lib/x86_64-linux-gnu"),
    # lib64 of GKE's root is no directory an image searches: the standard one instead.
    "gke": ("/home/kubernetes/bin/nvidia", f"/usr/lib/{machine_multiarch()}"),
}
RO = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


def node_roots(tmp_path: Path, layout: str, **kwargs: object) -> DriverRoot:
    """A driver root of ``layout`` and a separate device root, both seen under ``tmp_path``
    as a containerised daemon sees host mounts; the host's device root is ``/``."""
    driver_dir, dev_dir = tmp_path / "driver-root", tmp_path / "dev-root"
    populate_driver_root(driver_dir, [0, 1], layout=layout, dev_root=dev_dir)
    host = Path(HOST_ROOTS[layout][0])
    return DriverRoot(host, container_root=driver_dir, dev_root=Path("/"),
                      dev_container_root=dev_dir, **kwargs)  # type: ignore[arg-type]


def host_path(host_root: str, path: str) -> str:
    return str(Path(host_root) / path.lstrip("/"))


@pytest.mark.parametrize("layout", sorted(HOST_ROOTS))
def test_each_layout_yields_a_complete_spec(tmp_path, layout):
    root_host, lib = HOST_ROOTS[layout]
    hook = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    # The GPU Operator's toolkit lives on the host, outside the driver container's tree.
    roots = node_roots(tmp_path, layout, hook_path=hook if layout == "operator" else None)
    assert not (tmp_path / "driver-root/dev").exists()  # devices live elsewhere (GKE)
    spec = build_claim_spec(driver=DRIVER, claim_uid=UID,
                            devices=[CdiDevice("gpu-1", roots.gpu_edits(1))],
                            common=roots.common_edits(video=True))
    # Device nodes name host /dev: no hostPath, so nothing above 0.3.0 is needed.
    assert spec["cdiVersion"] == "0.3.0"
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1"}, {"path": "/dev/dri/card2"}, {"path": "/dev/dri/renderD129"}]
    edits = spec["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1",
                   "libnvidia-nvvm.so.4", "libnvcuvid.so.1", "libnvidia-encode.so.1",
                   "libnvidia-opticalflow.so.1"):
        real = soname.rpartition(".so.")[0] + f".so.{DRIVER_VERSION}"
        on_host = "/lib64" if layout == "gke" else lib
        assert mounts[f"{lib}/{soname}"] == {
            "hostPath": host_path(root_host, f"{on_host}/{real}"),
            "containerPath": f"{lib}/{soname}", "options": RO}
    bin_dir = "/bin" if layout == "gke" else "/usr/bin"
    for binary in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
                   "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        assert mounts[f"{bin_dir}/{binary}"]["hostPath"] == host_path(
            root_host, f"{bin_dir}/{binary}")
    firmware = {p for p in mounts if p.startswith("/lib/firmware/")}
    if LAYOUTS[layout].firmware_dir is None:
        assert firmware == set()
    else:
        assert firmware == {f"/lib/firmware/nvidia/{DRIVER_VERSION}/gsp_ga10x.bin",
                            f"/lib/firmware/nvidia/{DRIVER_VERSION}/gsp_tu10x.bin"}
    hook_path = {"host": "/usr/bin/nvidia-cdi-hook", "operator": hook}.get(layout)
    if hook_path is None:
        assert "hooks" not in edits
    else:
        names = [h["args"][1] for h in edits["hooks"]]
        assert names == ["create-symlinks", "enable-cuda-compat", "update-ldcache",
                         "disable-device-node-modification"]
        assert all(h["path"] == hook_path and h["hookName"] == "createContainer"
                   for h in edits["hooks"])
        links = edits["hooks"][0]["args"][2:]
        assert f"libcuda.so.1::{lib}/libcuda.so" in links
        assert f"libnvidia-opticalflow.so.1::{lib}/libnvidia-opticalflow.so" in links
        assert edits["hooks"][2]["args"][2:] == ["--folder", lib, "--folder", f"{lib}/vdpau"]
    write_spec(tmp_path / "cdi", spec)  # the version check accepts it


def test_gke_root_without_dev_fails_only_when_the_device_root_is_not_separate(tmp_path):
    """Before the device root existed, /dev was looked for under the driver root."""
    gke = populate_driver_root(tmp_path / "nvidia", [0], layout="gke", dev_root=tmp_path / "d")
    with pytest.raises(Exception, match="/dev/nvidiactl not found"):
        DriverRoot(gke).common_edits()
    assert DriverRoot(gke, dev_root=tmp_path / "d").common_edits().device_nodes


def test_media_libraries_only_for_devices_with_media_engines(tmp_path):
    roots = node_roots(tmp_path, "host")
    plain = {m.container_path for m in roots.common_edits().mounts}
    video = {m.container_path for m in roots.common_edits(video=True).mounts}
    lib = "/usr/lib/x86_64-linux-gnu"
    assert video - plain == {f"{lib}/libnvcuvid.so.1", f"{lib}/libnvidia-encode.so.1",
                             f"{lib}/libnvidia-opticalflow.so.1"}
    gpu = Device("gpu-0", "gpu-0", {"type": "gpu"}, {})
    mig_1g = Device("gpu-0-mig-1g", "gpu-0", {"type": "mig"}, {"decoders": 0, "encoders": 0})
    mig_me = Device("gpu-0-mig-1gme", "gpu-0", {"type": "mig"}, {"decoders": 1, "encoders": 0})
    assert uses_video([gpu]) and uses_video([mig_1g, mig_me])
    assert not uses_video([mig_1g]) and not uses_video([])


def test_nvidia_ctk_serves_when_nvidia_cdi_hook_is_absent(tmp_path):
    root = populate_driver_root(tmp_path, [0])
    ctk = root / "usr/bin/nvidia-ctk"
    ctk.write_text("#!/bin/sh\n")
    hooks = DriverRoot(root).common_edits().hooks
    assert hooks[0].path == str(ctk)
    assert hooks[0].args[:5] == ("nvidia-ctk", "hook", "create-symlinks",
                                 "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so")
    assert hooks[2].args == ("nvidia-ctk", "hook", "update-ldcache",
                             "--folder", "/usr/lib/x86_64-linux-gnu",
                             "--folder", "/usr/lib/x86_64-linux-gnu/vdpau")


def test_a_missing_hook_binary_is_said_once_per_discovery(tmp_path):
    root = populate_driver_root(tmp_path, [0])
    driver_root = DriverRoot(root)
    with capture_logs() as logs:
        assert driver_root.common_edits().hooks == ()
        driver_root.common_edits()
        driver_root.common_edits(video=True)
    warnings = [e for e in logs if e["event"] == "CDI hooks unavailable"]
    assert len(warnings) == 1
    assert f"no nvidia-cdi-hook or nvidia-ctk under {root}" in warnings[0]["reason"]
    assert "usr/local/nvidia/toolkit" in warnings[0]["reason"]


def test_driver_and_kernel_module_versions(tmp_path):
    roots = node_roots(tmp_path, "gke")
    assert roots.driver_version() == DRIVER_VERSION
    assert roots.kernel_module_version() == DRIVER_VERSION
    assert not roots.has_c_library()
    assert node_roots(tmp_path / "h", "host").has_c_library()


LIB = "/usr/lib/x86_64-linux-gnu"


def libcuda(roots: DriverRoot) -> str:
    """The host path ``libcuda.so.1`` is mounted from, as a spec written now would say."""
    mounts = {m.container_path: m.host_path for m in roots.common_edits().mounts}
    return mounts[f"{LIB}/libcuda.so.1"]


def test_an_upgrade_under_a_running_daemon_is_found_without_refresh(tmp_path):
    roots = node_roots(tmp_path, "operator")
    assert libcuda(roots).endswith(f"libcuda.so.{DRIVER_VERSION}")
    with capture_logs() as logs:
        populate_driver_root(tmp_path / "driver-root", [0, 1], layout="operator",
                             dev_root=tmp_path / "dev-root", driver_version="590.10.01")
        assert libcuda(roots) == f"/run/nvidia/driver{LIB}/libcuda.so.590.10.01"
    changed = [e for e in logs if e["event"] == "driver files changed; discovering them again"]
    assert changed and changed[0]["version_now"] == "590.10.01"
    firmware = [m.container_path for m in roots.common_edits().mounts if "firmware" in
                m.container_path]
    assert all("/590.10.01/" in p for p in firmware) and firmware


def test_one_look_per_call_then_the_next_call_sees_an_upgrade(tmp_path):
    roots = node_roots(tmp_path, "operator")
    with roots.one_look():  # one kubelet call: its claims share what was found on entry
        before = libcuda(roots)
        populate_driver_root(tmp_path / "driver-root", [0, 1], layout="operator",
                             dev_root=tmp_path / "dev-root", driver_version="590.10.01")
        assert libcuda(roots) == before
    assert libcuda(roots) == f"/run/nvidia/driver{LIB}/libcuda.so.590.10.01"  # the next call


def test_a_directory_missing_at_the_last_look_is_seen_when_it_appears(tmp_path):
    # Missing directories are watched through an ancestor (no stat of their own per call):
    # the toolkit installed after start-up, two levels below anything that existed.
    roots = node_roots(tmp_path, "operator")
    toolkit = tmp_path / "driver-root/usr/local/nvidia/toolkit"
    assert not (tmp_path / "driver-root/usr/local/nvidia").exists()
    with roots.one_look():
        assert roots.common_edits().hooks == ()
    toolkit.mkdir(parents=True)
    (toolkit / "nvidia-cdi-hook").write_text("")
    with roots.one_look():  # the next call
        hooks = roots.common_edits().hooks
    assert hooks and hooks[0].path == "/run/nvidia/driver/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    # and once there, a change inside it is seen as well
    (toolkit / "nvidia-cdi-hook").unlink()
    with roots.one_look():
        assert roots.common_edits().hooks == ()
