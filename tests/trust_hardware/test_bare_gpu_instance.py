"""A kill between creating a GPU instance and its compute instance leaves a bare GPU
instance, which NVML's MIG-device listing does not show. The real ``gpudra node`` process
is killed at exactly that step (crash point), restarted, asked to unprepare; the hardware
must be back at its baseline and a later claim for that placement must prepare."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from gpudra.driver.faults import CRASH_EXIT_CODE
from gpudra.driver.sim import SimControl
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon, create_claim, node_daemon

POINT = "prepare:after-mig-gpu-instance"
DEVICE = "gpu-0-mig-1g10gb-19-6"


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    with node_daemon(fake_api, env={"GPUDRA_CRASH_AT": POINT}) as made:
        yield made


def gpu0(daemon: Daemon) -> dict[str, Any]:
    gpu: dict[str, Any] = SimControl(daemon.sim_state).snapshot()["gpus"][0]
    return gpu


async def test_a_bare_gpu_instance_left_by_a_kill_is_destroyed_at_restart(daemon, fake_api):
    daemon.start()
    assert gpu0(daemon)["mig_mode"]["current"] == 0  # the baseline: MIG off
    ref = create_claim(fake_api, "mig", devices=[DEVICE], request="mig")
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.prepare([ref])
    assert daemon.process is not None and daemon.process.wait(20) == CRASH_EXIT_CODE
    daemon.stop_kubelet()
    # the kill really left a GPU instance without a compute instance, MIG mode on
    [bare] = gpu0(daemon)["gpu_instances"]
    assert bare["compute_instances"] == [] and bare["placement"]["start"] == 6
    assert gpu0(daemon)["mig_mode"]["current"] == 1

    daemon.env = {}
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
        assert gpu0(daemon)["gpu_instances"] == []
        assert gpu0(daemon)["mig_mode"]["current"] == 0  # back at the baseline
        # and the placement is free: a later claim for it prepares, and unprepares
        again = create_claim(fake_api, "mig-again", devices=[DEVICE], request="mig")
        assert (await kubelet.prepare([again]))[again.uid]["error"] == ""
        assert [len(gi["compute_instances"]) for gi in gpu0(daemon)["gpu_instances"]] == [1]
        assert (await kubelet.unprepare([again]))[again.uid]["error"] == ""
    assert gpu0(daemon)["gpu_instances"] == []
    assert gpu0(daemon)["mig_mode"]["current"] == 0
    assert "Traceback" not in daemon.output()
    assert daemon.stop() == 0


def make_bare_gpu_instance(daemon: Daemon, gpu: int, profile_id: int, start: int) -> None:
    """What a kill of an older build left: a GPU instance without compute instance."""
    import ctypes

    import pynvml

    from gpudra.driver import sim

    sim.install(daemon.profile, daemon.sim_state)
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        placement = pynvml.c_nvmlGpuInstancePlacement_t(start, 1)
        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id,
                                                        ctypes.byref(placement))
        pynvml.nvmlShutdown()
    finally:
        sim.uninstall()


async def test_start_up_destroys_an_unowned_bare_gpu_instance_but_keeps_a_claims(
        daemon, fake_api):
    # No half-prepared claim names it (nothing to roll back): the start-up clean-up of a
    # GPU gpudra partitioned finds it by enumerating GPU instances. A prepared claim's own
    # MIG device on the same GPU is kept.
    daemon.env = {}
    daemon.start()
    kept = create_claim(fake_api, "kept", devices=["gpu-0-mig-1g10gb-19-0"], request="mig")
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([kept]))[kept.uid]["error"] == ""
    assert daemon.stop() == 0
    make_bare_gpu_instance(daemon, 0, 19, 6)
    assert sorted(len(gi["compute_instances"]) for gi in gpu0(daemon)["gpu_instances"]) \
        == [0, 1]

    daemon.start()
    [left] = gpu0(daemon)["gpu_instances"]  # the bare one is gone, the claim's is not
    assert left["placement"]["start"] == 0 and len(left["compute_instances"]) == 1
    again = create_claim(fake_api, "placement-6", devices=[DEVICE], request="mig")
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([again]))[again.uid]["error"] == ""
        for ref in (again, kept):
            assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert gpu0(daemon)["gpu_instances"] == []
    assert gpu0(daemon)["mig_mode"]["current"] == 0
    assert daemon.stop() == 0
