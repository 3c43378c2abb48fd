"""The kubelet emulator's health-stream client keeps the kubelet's rules (so a test through it
tests the plugin against the kubelet's contract): the service it picks, the complete list,
long messages truncated, a device not refreshed within its timeout Unknown."""

from __future__ import annotations

from gpudra.api.proto import HEALTH_V1_ADVERTISED, HEALTH_V1ALPHA1_ADVERTISED
from gpudra.driver.health import DeviceHealth
from gpudra.kubeletplugin.serving.health_service import HealthService
from gpudra.testing.kubelet_health import HealthWatch, pick_service

from .conftest import health_server

NOW = 1_800_000_000.0


def test_the_kubelet_picks_its_preferred_health_service():
    both = ["v1.DRAPlugin", "v1beta1.DRAPlugin", HEALTH_V1_ADVERTISED, HEALTH_V1ALPHA1_ADVERTISED]
    assert pick_service(both) == HEALTH_V1_ADVERTISED  # 1.37
    assert pick_service(both, (HEALTH_V1ALPHA1_ADVERTISED,)) == HEALTH_V1ALPHA1_ADVERTISED
    assert pick_service(["v1.DRAPlugin"]) is None


async def test_long_messages_are_truncated_and_stale_devices_unknown(dirs, preparer):
    clock = [NOW]
    reports = [DeviceHealth("gpu-0", "Unhealthy", "x" * 2000, NOW),
               DeviceHealth("gpu-1", "Healthy", "", NOW - 61)]
    service = HealthService("node-a", lambda: reports, health_check_timeout=60)
    async with health_server(dirs, preparer, service) as (_, channel):
        for version in (HEALTH_V1_ADVERTISED, HEALTH_V1ALPHA1_ADVERTISED):
            watch = HealthWatch(channel, version, clock=lambda: clock[0])
            statuses = await watch.next()
            assert statuses["gpu-0"].health == "Unhealthy"
            assert len(statuses["gpu-0"].message) == 1024
            assert statuses["gpu-0"].message.endswith("...")
            assert statuses["gpu-1"].health == "Unknown"  # 61 s old, 60 s timeout
            clock[0] = NOW + 61
            assert watch.statuses()["gpu-0"].health == "Unknown"
            clock[0] = NOW
            assert watch.resource_health({"gpu-0": ["k8s.gpu.nvidia.com/claim=u-gpu-0"],
                                          "gpu-9": ["k8s.gpu.nvidia.com/claim=u-gpu-9"]}) == {
                "k8s.gpu.nvidia.com/claim=u-gpu-0": "Unhealthy",
                "k8s.gpu.nvidia.com/claim=u-gpu-9": "Unknown"}
            watch.close()
