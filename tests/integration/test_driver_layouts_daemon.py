"""``gpudra node`` on a GKE-style driver root (``lib64/``, ``bin/``, no ``dev/``) with the
device nodes in a separate device root: claims prepare with complete CDI specs. Before
``--dev-root`` the daemon looked for ``/dev/nvidiactl`` under the driver root and every
prepare failed with ``device node /dev/nvidiactl not found``."""

from __future__ import annotations

import json
import shutil

from gpudra.api.claims import ClaimRef
from gpudra.driver.cdi_edits import machine_multiarch
from gpudra.driver.sim.driver_root import DRIVER_VERSION, populate_driver_root
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import DRIVER, Daemon, claim_object


async def test_gke_driver_root_with_a_separate_device_root(fake_api: FakeApiServer):
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    daemon = Daemon(fake_api.url, profile="l4-x4")
    gke, dev = daemon.base / "home/kubernetes/bin/nvidia", daemon.base / "host"
    populate_driver_root(gke, [0, 1, 2, 3], layout="gke", dev_root=dev)
    assert not (gke / "dev").exists()
    daemon.extra_args = ["--driver-root", str(gke), "--dev-root", str(dev),
                         "--host-dev-root", "/"]
    daemon.start()
    try:
        stored = fake_api.put(claim_object("gke", devices=["gpu-2"]))
        meta = stored["metadata"]
        ref = ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
        async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
            assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
            spec = json.loads(
                (daemon.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json").read_text())
            # The GPU's DRM nodes too, found through its bus id (card0 is the BMC's).
            assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
                {"path": "/dev/nvidia2"}, {"path": "/dev/dri/card3"},
                {"path": "/dev/dri/renderD130"}]
            edits = spec["containerEdits"]
            assert [n["path"] for n in edits["deviceNodes"]][:2] == [
                "/dev/nvidiactl", "/dev/nvidia-uvm"]
            mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
            # GKE's lib64 is no directory an image's loader searches: the standard one.
            lib = f"/usr/lib/{machine_multiarch()}"
            assert mounts[f"{lib}/libcuda.so.1"] == f"{gke}/lib64/libcuda.so.{DRIVER_VERSION}"
            assert mounts[f"{lib}/libnvcuvid.so.1"]  # a full GPU gets the media libraries
            assert mounts["/bin/nvidia-smi"] == f"{gke}/bin/nvidia-smi"
            # No toolkit under GKE's root: no hooks, and the log says why.
            assert "hooks" not in edits
            assert "CDI hooks unavailable" in daemon.output()
            assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    finally:
        assert daemon.stop() == 0
        shutil.rmtree(daemon.base, ignore_errors=True)
