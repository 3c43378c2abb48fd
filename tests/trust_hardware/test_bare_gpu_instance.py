"""A kill between creating a GPU instance and its compute instance leaves a bare GPU
instance, which NVML's MIG-device listing does not show. The real ``gpudra node`` process
is killed at exactly that step (crash point), restarted, asked to unprepare; the hardware
must be back at its baseline and a later claim for that placement must prepare."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from gpudra.api.claims import ClaimRef
from gpudra.driver.faults import CRASH_EXIT_CODE
from gpudra.driver.sim import SimControl
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon, claim_object

POINT = "prepare:after-mig-gpu-instance"
DEVICE = "gpu-0-mig-1g10gb-19-6"


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    made = Daemon(fake_api.url, env={"GPUDRA_CRASH_AT": POINT})
    try:
        yield made
    finally:
        if made.process is not None and made.process.poll() is None:
            made.stop()
        made.stop_kubelet()
        shutil.rmtree(made.base, ignore_errors=True)


def create_claim(api: FakeApiServer, name: str, **kwargs: Any) -> ClaimRef:
    meta = api.put(claim_object(name, **kwargs))["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


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
