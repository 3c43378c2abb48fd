"""Device health reaches the kubelet over its DRA health stream (KEP-4680), on the kubelet's
wire contract: a real ``gpudra node`` process, the kubelet emulator's stream client over
real gRPC on the plugin's unix socket, an XID injected in the simulator.

An XID the driver wants a GPU reset for makes that device Unhealthy (with a message naming
the recovery), stays Unhealthy after the XID's quiet period, and turns Healthy once the GPU
is reset; the other devices stay Healthy throughout. A 1.37 kubelet uses
``v1.DRAResourceHealth``, a 1.36 one ``v1alpha1.DRAResourceHealth``: both see the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpudra.api.proto import HEALTH_V1_ADVERTISED, HEALTH_V1ALPHA1_ADVERTISED
from gpudra.cli.main import main
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from gpudra.testing.kubelet_health import DeviceStatus
from tests.integration.daemon import Daemon, create_claim, node_daemon

GPUS = [f"gpu-{i}" for i in range(4)]
RECOVERY = "gpu.nvidia.com/recovery"
XID = "gpu.nvidia.com/xid"


def sim(daemon: Daemon, *args: str) -> None:
    assert main(["sim", *args, "--sim-state", str(daemon.sim_state)]) == 0


def taint_keys(api: FakeApiServer, device: str) -> set[str]:
    return {t["key"] for s in api.list("ResourceSlice") for d in s["spec"].get("devices", [])
            if d["name"] == device for t in d.get("taints", [])}


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the daemon never got there"
        time.sleep(0.02)


def events(api: FakeApiServer, reason: str) -> list[dict]:
    return [e for e in api.list("events.events.k8s.io", "default") if e.get("reason") == reason]


def healthy(statuses: dict[str, DeviceStatus], *devices: str) -> bool:
    return all(d in statuses and statuses[d].health == "Healthy" for d in devices)


async def test_an_xid_needing_a_reset_is_unhealthy_until_the_gpu_is_reset(fake_api):
    with node_daemon(fake_api, profile="l4-x4",
                     extra_args=["--xid-quiet-period", "1"]) as daemon:
        daemon.start()
        kubelet = await KubeletEmulator.discover(daemon.registrar)
        try:
            ref = create_claim(fake_api, "on-gpu-1", devices=["gpu-1"])
            prepared = (await kubelet.prepare([ref]))[ref.uid]
            assert prepared["error"] == ""
            cdi_ids = {d["device_name"]: d["cdi_device_ids"] for d in prepared["devices"]}

            watch = kubelet.watch_health()
            assert watch.service == HEALTH_V1_ADVERTISED  # a 1.37 kubelet's pick
            first = await watch.wait_for(lambda s: healthy(s, *GPUS))
            assert set(first) == set(GPUS)  # the complete list, every device named
            assert {s.pool for s in first.values()} == {"node-a"}

            sim(daemon, "xid", "--gpu", "1", "--xid", "48", "--recovery-action", "gpu-reset")
            # (the driver's recovery action may arrive a response before the XID itself)
            hit = await watch.wait_for(lambda s: "XID 48" in s["gpu-1"].message)
            assert hit["gpu-1"].health == "Unhealthy"
            assert healthy(hit, "gpu-0", "gpu-2", "gpu-3")
            assert "needs gpu-reset" in hit["gpu-1"].message
            # the pod's allocatedResourcesStatus, keyed by the device's first CDI ID
            assert watch.resource_health(cdi_ids) == {cdi_ids["gpu-1"][0]: "Unhealthy"}

            # The XID's own taint goes with the quiet period; the GPU still needs its reset.
            wait_until(lambda: taint_keys(fake_api, "gpu-1") == {RECOVERY})
            wait_until(lambda: bool(events(fake_api, "GPURecoveryRequired")))
            (event,) = events(fake_api, "GPURecoveryRequired")  # one, not one per response
            assert event["type"] == "Warning" and event["regarding"]["name"] == "node-a"
            assert "needs gpu-reset" in event["note"]
            later = await watch.wait_for(lambda s: "critical XID" not in s["gpu-1"].message)
            assert later["gpu-1"].health == "Unhealthy"

            sim(daemon, "reset-gpu", "--gpu", "1")  # the driver reports no recovery pending
            done = await watch.wait_for(lambda s: healthy(s, *GPUS))
            assert done["gpu-1"].message == ""
            assert watch.resource_health(cdi_ids) == {cdi_ids["gpu-1"][0]: "Healthy"}
            wait_until(lambda: taint_keys(fake_api, "gpu-1") == set())
            wait_until(lambda: bool(events(fake_api, "GPURecovered")))
            assert len(events(fake_api, "GPURecoveryRequired")) == 1
            watch.close()
        finally:
            await kubelet.close()


async def test_a_1_36_kubelet_reads_the_same_over_v1alpha1(fake_api):
    with node_daemon(fake_api, profile="l4-x4") as daemon:
        daemon.start()
        kubelet = await KubeletEmulator.discover(daemon.registrar)
        try:
            watch = kubelet.watch_health(services=(HEALTH_V1ALPHA1_ADVERTISED,))
            assert watch.service == HEALTH_V1ALPHA1_ADVERTISED
            await watch.wait_for(lambda s: healthy(s, *GPUS))
            sim(daemon, "xid", "--gpu", "3", "--xid", "79", "--recovery-action", "node-reboot")
            hit = await watch.wait_for(lambda s: s["gpu-3"].health == "Unhealthy")
            assert "needs node-reboot" in hit["gpu-3"].message
            wait_until(lambda: {XID, RECOVERY} <= taint_keys(fake_api, "gpu-3"))
            watch.close()
        finally:
            await kubelet.close()


async def test_a_gpu_waiting_for_recovery_is_still_unhealthy_after_a_daemon_restart(fake_api):
    with node_daemon(fake_api, profile="l4-x4") as daemon:
        daemon.start()
        sim(daemon, "recovery-action", "--gpu", "2", "--action", "unsupported")  # old driver
        kubelet = await KubeletEmulator.discover(daemon.registrar)
        try:
            watch = kubelet.watch_health()
            await watch.wait_for(lambda s: healthy(s, *GPUS))
            sim(daemon, "xid", "--gpu", "2", "--xid", "95")  # the catalog: needs a reset
            await watch.wait_for(lambda s: s["gpu-2"].health == "Unhealthy")
            watch.close()
        finally:
            await kubelet.close()
        daemon.stop()  # an upgrade: nothing reset the GPU meanwhile
        daemon.start()
        kubelet = await KubeletEmulator.discover(daemon.registrar)
        try:
            watch = kubelet.watch_health()
            first = await watch.next()  # the first list after the restart already says so
            assert first["gpu-2"].health == "Unhealthy"
            assert "needs gpu-reset" in first["gpu-2"].message
            assert healthy(first, "gpu-0", "gpu-1", "gpu-3")
            watch.close()
        finally:
            await kubelet.close()
