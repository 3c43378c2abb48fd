"""Our CDI spec against what a CUDA, NVENC/NVDEC, OpenCL, Vulkan/EGL/OpenGL/OptiX or
nvidia-smi workload needs (issue 30 item 1, after nvidia-container-toolkit's ``pkg/nvcdi``),
entry by entry, for a full GPU and a MIG device on every driver root layout the simulator has.

The required list comes from ``driver/sim/data/driver580.yaml`` (what a 580 driver installs,
with sources) and the layouts; the spec comes from the real discovery over the simulated
root. ``python -m tests.driver.test_cdi_complete`` prints the comparison as a markdown table.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpudra.driver.cdi import CdiDevice, build_claim_spec, write_spec
from gpudra.driver.cdi_edits import machine_multiarch
from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.sim.driver_root import (
    LAYOUTS,
    default_bus_id,
    driver_install,
    populate_driver_root,
)

DRIVER = "gpu.nvidia.com"
UID = "fb5d2f1e-7c4a-4e2b-9f61-3a8d5c0e7b12"
HOOK = "/var/lib/kubelet/plugins/gpu.nvidia.com/bin/nvidia-cdi-hook"  # the chart's copy
# layout → where the host has the driver root
HOST_ROOTS = {
    "host": "/",
    "operator": "/run/nvidia/driver",
    "gke": "/home/kubernetes/bin/nvidia",
    "minimal": "/opt/nvidia",
}
GPU, MIG_PARENT, GI, CI = 0, 1, 2, 0


@dataclass(frozen=True)
class Entry:
    group: str
    label: str
    kind: str
    """``mount``, ``control-node``, ``device-node``, ``hook`` or ``absent-node``."""
    key: tuple[str, ...]
    full: bool
    """Required for the full GPU claim."""
    mig: bool
    """Required for the MIG device claim."""
    installed: bool
    """The layout has what the entry needs (else the entry is not applicable there)."""


def host(layout: str, rel: str) -> str:
    return str(Path(HOST_ROOTS[layout]) / rel.lstrip("/"))


def required(layout: str) -> list[Entry]:
    """What the issue's list asks of a spec, for ``layout``."""
    shape = LAYOUTS[layout]
    install = driver_install()
    version = install.version
    lib_dir = f"/usr/lib/{machine_multiarch()}" if shape.lib_dir == "lib64" else \
        f"/{shape.lib_dir}"
    out: list[Entry] = []
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        out.append(Entry("control nodes", f"/dev/{name}", "control-node", (f"/dev/{name}",),
                         True, True, True))
    out.append(Entry("device nodes", "/dev/nvidia<minor>", "device-node",
                     (f"/dev/nvidia{GPU}", f"/dev/nvidia{MIG_PARENT}"), True, True, True))
    out.append(Entry("device nodes", "MIG gi/ci access caps /dev/nvidia-caps/nvidia-cap*",
                     "device-node", ("mig-caps",), False, True, True))
    bus = default_bus_id(GPU)
    for node in (f"card{GPU + 1}", f"renderD{128 + GPU}"):
        out.append(Entry("DRM (via sysfs bus id)", f"/dev/dri/{node}", "device-node",
                         (f"/dev/dri/{node}", ""), True, False, shape.drm))
    out.append(Entry("DRM (via sysfs bus id)", "not the BMC's /dev/dri/card0", "absent-node",
                     ("/dev/dri/card0",), True, True, True))
    for kind, node in (("card", f"card{GPU + 1}"), ("render", f"renderD{128 + GPU}")):
        out.append(Entry("DRM (via sysfs bus id)", f"by-path pci-{bus}-{kind} link", "hook",
                         ("create-symlinks", "--link",
                          f"../{node}::/dev/dri/by-path/pci-{bus}-{kind}"),
                         True, False, shape.drm))
    out.append(Entry("DRM (via sysfs bus id)", "chmod 755 /dev/dri", "hook",
                     ("chmod", "--path", "/dev/dri"), True, False, shape.drm))
    for lib in install.libraries:
        directory, _, base = f"{lib_dir}/{lib.file}".rpartition("/")
        inside = f"{directory}/{lib.soname or base}"
        on_host = host(layout, f"{shape.lib_dir}/{lib.file}")
        group = f"libraries ({', '.join(lib.needed_by)})"
        out.append(Entry(group, base, "mount", (inside, on_host), True, not lib.media, True))
        stem = base.partition(".so")[0] + ".so"
        dev = lib.dev or (stem if stem in ("libcuda.so", "libnvidia-opticalflow.so") else None)
        if dev is not None:
            out.append(Entry(group, f"link {dev}", "hook", (
                "create-symlinks", "--link", f"{lib.soname or base}::{directory}/{dev}"),
                True, not lib.media, True))
        if stem == "libGLX_nvidia.so":
            out.append(Entry(group, "link libGLX_indirect.so.0", "hook", (
                "create-symlinks", "--link",
                f"{lib.soname}::{directory}/libGLX_indirect.so.0"), True, True, True))
        if stem == "libnvidia-allocator.so":
            out.append(Entry(group, "link gbm/nvidia-drm_gbm.so", "hook", (
                "create-symlinks", "--link",
                f"../{lib.soname}::{directory}/gbm/nvidia-drm_gbm.so"), True, True, True))
    for config in install.configs:
        moved = None
        for prefix, to in (shape.configs or {}).items():
            if config.path.startswith(prefix + "/"):
                moved = to + config.path[len(prefix):]
        out.append(Entry(f"configs ({', '.join(config.needed_by)})", config.container, "mount",
                         (config.container, host(layout, moved or config.path)),
                         True, True, moved is not None))
    for binary in install.binaries:
        out.append(Entry("binaries", binary, "mount",
                         (f"/{shape.bin_dir}/{binary}", host(layout, f"{shape.bin_dir}/{binary}")),
                         True, True, True))
    for name in install.firmware:
        inside = f"/lib/firmware/nvidia/{version}/{name}"
        out.append(Entry("GSP firmware", inside, "mount", (
            inside, host(layout, f"{shape.firmware_dir}/{version}/{name}")), True, True,
            shape.firmware_dir is not None))
    for socket in install.sockets:
        out.append(Entry("sockets", f"/run/{socket}", "mount",
                         (f"/run/{socket}", host(layout, f"run/{socket}")), True, True,
                         shape.sockets))
    out.append(Entry("hooks", "enable-cuda-compat", "hook",
                     ("enable-cuda-compat", f"--host-driver-version={version}"), True, True, True))
    for folder in (lib_dir, f"{lib_dir}/vdpau"):
        out.append(Entry("hooks", f"update-ldcache {folder}", "hook",
                         ("update-ldcache", "--folder", folder), True, True, True))
    out.append(Entry("hooks", "disable-device-node-modification", "hook",
                     ("disable-device-node-modification",), True, True, True))
    return out


def node_roots(base: Path, layout: str) -> DriverRoot:
    driver_dir, dev_dir = base / "driver-root", base / "dev-root"
    populate_driver_root(driver_dir, [GPU, MIG_PARENT], {MIG_PARENT: [(GI, CI)]}, layout=layout,
                         dev_root=dev_dir, fabricmanager=True)
    return DriverRoot(Path(HOST_ROOTS[layout]), container_root=driver_dir, dev_root=Path("/"),
                      dev_container_root=dev_dir, hook_path=None if layout == "host" else HOOK)


def specs(roots: DriverRoot) -> dict[str, dict[str, Any]]:
    return {
        "full": build_claim_spec(driver=DRIVER, claim_uid=UID,
                                 devices=[CdiDevice(f"gpu-{GPU}", roots.gpu_edits(GPU))],
                                 common=roots.common_edits(video=True)),
        "mig": build_claim_spec(driver=DRIVER, claim_uid=UID,
                                devices=[CdiDevice(f"gpu-{MIG_PARENT}-mig-1g-{GI}",
                                                   roots.mig_edits(MIG_PARENT, GI, CI))],
                                common=roots.common_edits(video=False)),
    }


def _edits(spec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return spec.get("containerEdits") or {}, spec["devices"][0]["containerEdits"]


def _hook_has(hook: Mapping[str, Any], key: Sequence[str]) -> bool:
    args = list(hook.get("args") or [])
    if len(args) < 2 or args[1] != key[0]:
        return False
    rest = list(key[1:])
    if not rest:
        return True
    return any(args[i:i + len(rest)] == rest for i in range(len(args)))


def present(spec: Mapping[str, Any], entry: Entry) -> bool:
    common, device = _edits(spec)
    nodes = [n["path"] for n in device.get("deviceNodes") or []]
    if entry.kind == "mount":
        return {"containerPath": entry.key[0], "hostPath": entry.key[1]} in [
            {"containerPath": m["containerPath"], "hostPath": m["hostPath"]}
            for m in common.get("mounts") or []]
    if entry.kind == "control-node":
        return entry.key[0] in [n["path"] for n in common.get("deviceNodes") or []]
    if entry.kind == "device-node":
        if entry.key == ("mig-caps",):
            return sum(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in nodes) == 2
        return any(p in nodes for p in entry.key if p)
    if entry.kind == "absent-node":
        return entry.key[0] not in nodes
    hooks = [*(common.get("hooks") or []), *(device.get("hooks") or [])]
    return any(_hook_has(h, entry.key) for h in hooks)


def compare(base: Path, layout: str) -> list[tuple[Entry, str, str]]:
    """Per required entry: ``(entry, full GPU cell, MIG cell)``: ``ok``, ``MISSING``,
    ``not required`` or ``not installed``; and the spec must hold nothing unaccounted for."""
    roots = node_roots(base, layout)
    made = specs(roots)
    rows = []
    for entry in required(layout):
        cells = []
        for which, needed in (("full", entry.full), ("mig", entry.mig)):
            found = present(made[which], entry)
            if not entry.installed:
                cells.append("not installed" if not found or entry.kind == "absent-node"
                             else "UNEXPECTED")
            elif needed:
                cells.append("ok" if found else "MISSING")
            else:
                cells.append("not required" if not found or entry.kind == "absent-node"
                             else "given")
        rows.append((entry, cells[0], cells[1]))
    return rows


def unaccounted(base: Path, layout: str) -> list[str]:
    """Mounts and device nodes of the full-GPU spec that no required entry names."""
    entries = required(layout)
    mounts = {e.key[0] for e in entries if e.kind == "mount"}
    nodes = {k for e in entries if e.kind in ("device-node", "control-node") for k in e.key}
    common, device = _edits(specs(node_roots(base, layout))["full"])
    extra = [m["containerPath"] for m in common.get("mounts") or []
             if m["containerPath"] not in mounts]
    extra += [n["path"] for n in [*(common.get("deviceNodes") or []),
                                  *(device.get("deviceNodes") or [])] if n["path"] not in nodes]
    return extra


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_spec_has_every_required_entry(tmp_path, layout):
    rows = compare(tmp_path, layout)
    bad = [(e.group, e.label, full, mig) for e, full, mig in rows
           if {full, mig} & {"MISSING", "UNEXPECTED", "given"}]
    assert bad == []
    # The layouts that install the whole driver have every entry for a full GPU.
    if layout in ("host", "operator"):
        assert all(full == "ok" for e, full, _ in rows if e.full), layout
    assert unaccounted(tmp_path, layout) == []
    for spec in specs(node_roots(tmp_path / "again", layout)).values():
        write_spec(tmp_path / "cdi", spec)  # valid for the CDI version it declares


def test_every_versioned_library_not_a_fixed_list(tmp_path):
    """A library the driver adds in a later release is given too; a 32-bit copy is not."""
    roots = node_roots(tmp_path, "host")
    lib = tmp_path / "driver-root/usr/lib/x86_64-linux-gnu"
    version = driver_install().version
    (lib / f"libnvidia-future.so.{version}").write_text("x")
    (lib / "libnvidia-future.so.1").symlink_to(f"libnvidia-future.so.{version}")
    i386 = tmp_path / "driver-root/usr/lib/i386-linux-gnu"
    i386.mkdir()
    (i386 / f"libcuda.so.{version}").write_text("x")
    roots.refresh()
    mounts = {m.container_path: m.host_path for m in roots.common_edits().mounts}
    assert mounts["/usr/lib/x86_64-linux-gnu/libnvidia-future.so.1"] == \
        f"/usr/lib/x86_64-linux-gnu/libnvidia-future.so.{version}"
    assert not any("i386" in p for p in mounts.values())


def test_a_gpu_without_drm_nodes_gets_none_and_no_drm_hooks(tmp_path):
    roots = node_roots(tmp_path, "minimal")  # nvidia-drm not loaded
    edits = roots.gpu_edits(GPU)
    assert [n.path for n in edits.device_nodes] == [f"/dev/nvidia{GPU}"]
    assert edits.hooks == ()


def test_drm_nodes_follow_the_bus_id_not_the_minor(tmp_path):
    """The kernel numbers DRM cards in probe order: GPU 1 may be card1 when GPU 0 has none."""
    driver_dir, dev_dir = tmp_path / "driver-root", tmp_path / "dev-root"
    populate_driver_root(driver_dir, [0, 1], layout="host", dev_root=dev_dir,
                         bus_ids={0: "0000:3b:00.0", 1: "0000:86:00.0"})
    roots = DriverRoot(Path("/"), container_root=driver_dir, dev_root=Path("/"),
                       dev_container_root=dev_dir)
    assert roots.gpu_drm(1) is not None and roots.gpu_drm(1).bus_id == "0000:86:00.0"  # type: ignore[union-attr]
    drm = dev_dir / "sys/bus/pci/devices/0000:86:00.0/drm"
    (drm / "card2").rename(drm / "card7")
    (dev_dir / "dev/dri/card7").touch()
    roots.refresh()
    assert [n.path for n in roots.gpu_edits(1).device_nodes] == [
        "/dev/nvidia1", "/dev/dri/card7", "/dev/dri/renderD129"]


def markdown(base: Path) -> str:
    layouts = sorted(LAYOUTS)
    tables = {layout: compare(base / layout, layout) for layout in layouts}
    head = ("| group | entry | " + " | ".join(f"{x} ({HOST_ROOTS[x]})" for x in layouts)
            + " |\n|---|---|" + "---|" * len(layouts) + "\n")
    lines = []
    for i, (entry, _, _) in enumerate(tables[layouts[0]]):
        cells = []
        for layout in layouts:
            row_entry, full, mig = tables[layout][i]
            assert row_entry.label.split(" ")[0] == entry.label.split(" ")[0]
            cells.append(f"GPU {full}, MIG {mig}")
        lines.append(f"| {entry.group} | `{entry.label}` | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        sys.stdout.write(markdown(Path(d)))


def test_the_shared_driver_edits_are_written_as_one_json_dump_would(tmp_path):
    """Every claim's spec holds the driver's files, validated and serialised once: the file is
    still exactly the spec's JSON, whichever claim, and a second claim gets its own names."""
    roots = node_roots(tmp_path, "host")
    common = roots.common_edits(video=True)
    written = []
    for uid in (UID, "0c6e3f2a-8d5b-4f3c-a072-4b9e6d1f8c23"):
        spec = build_claim_spec(driver=DRIVER, claim_uid=uid,
                                devices=[CdiDevice(f"gpu-{GPU}", roots.gpu_edits(GPU))],
                                common=common)
        assert spec["containerEdits"] is common.shared_json("containerEdits")
        path = write_spec(tmp_path / "cdi", spec)
        assert path.read_text() == json.dumps(spec) + "\n"
        written.append(json.loads(path.read_text()))
    assert written[0]["containerEdits"] == written[1]["containerEdits"]
    assert [d["name"] for s in written for d in s["devices"]] == [
        f"{UID}-gpu-{GPU}", f"0c6e3f2a-8d5b-4f3c-a072-4b9e6d1f8c23-gpu-{GPU}"]


def test_warm_finds_the_files_once_and_prepares_reuse_them(tmp_path):
    """The daemon's start-up walks the driver root; claims after it do not walk it again
    until the driver changes."""
    roots = node_roots(tmp_path, "host")
    files = roots.warm()
    assert files.version == driver_install().version
    assert len(files.libraries) == len(driver_install().libraries)
    with roots.one_look():
        roots.common_edits(video=True)
        assert roots.driver_files() is files
    populate_driver_root(tmp_path / "driver-root", [GPU, MIG_PARENT], layout="host",
                         dev_root=tmp_path / "dev-root", driver_version="590.10.01")
    with roots.one_look():  # the next kubelet call sees the upgrade
        assert roots.driver_files() is not files
        assert roots.driver_files().version == "590.10.01"
