"""Hardware that changed between two daemon runs, or a GPU that is lost, never takes the
node down: the daemon starts, serves the kubelet and publishes what is healthy.

Each test runs the real ``gpudra node`` process on simulated NVML and changes the
simulated hardware between runs (another node profile on the same state directory, a
GPU pulled out, a GPU fallen off the bus), as on a real node between two pod restarts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpudra.cli.main import main
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.sim import SimControl
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import DRIVER, ROOT, Daemon, create_claim

GV = "resource.nvidia.com/v1beta1"


@pytest.fixture
def daemons(fake_api: FakeApiServer) -> Iterator[Callable[..., Daemon]]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    made: list[Daemon] = []

    def make(profile: str, **kwargs: Any) -> Daemon:
        daemon = Daemon(fake_api.url, profile=profile, **kwargs)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
    for base in {d.base for d in made}:
        shutil.rmtree(base, ignore_errors=True)


def checkpoint(daemon: Daemon) -> dict[str, Any]:
    """The checkpoint's data as on disk (snapshot and journal), in its JSON form."""
    cp = CheckpointStore(daemon.plugins / DRIVER).load()
    data: dict[str, Any] = json.loads(cp.model_dump_json())
    return data


def log_lines(daemon: Daemon, since: int = 0) -> list[dict[str, Any]]:
    """The JSON log lines from character ``since`` on (a restart appends to the log)."""
    lines = []
    for line in daemon.output()[since:].splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return lines


def warnings_about(daemon: Daemon, uuid: str, since: int) -> list[dict[str, Any]]:
    return [line for line in log_lines(daemon, since)
            if line.get("level") == "warning" and uuid in json.dumps(line)]


def published(api: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in api.list("ResourceSlice")
            for d in s["spec"].get("devices", [])}


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def full_gpus(api: FakeApiServer) -> set[str]:
    return {name for name, d in published(api).items()
            if d["attributes"]["type"]["string"] == "gpu"}


def sim(daemon: Daemon, *args: str) -> None:
    assert main(["sim", *args, "--sim-state", str(daemon.sim_state)]) == 0


# --- Reproduction A: the GPUs were replaced while the node was down ----------------------------


@pytest.mark.parametrize("state_dir", ["same", "new"])
async def test_a_checkpoint_naming_gpus_that_are_gone_does_not_stop_start_up(
        state_dir, daemons, fake_api):
    first = daemons("dgx-h100").start()
    old_gpu = SimControl(first.sim_state).node.gpus[0].uuid
    ref = create_claim(fake_api, "mig", devices=["gpu-0-mig-1g10gb-19-6"])
    async with await KubeletEmulator.discover(first.registrar) as kubelet:
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert first.stop() == 0
    assert old_gpu in checkpoint(first)["migModeBaseline"]

    # Same plugins dir (checkpoint), other hardware: another profile on the same simulated
    # node ("same": its GPUs swapped) or a node simulated from scratch ("new").
    extra = [] if state_dir == "same" else ["--sim-state", str(first.base / "sim-new")]
    mark = len(first.output())
    second = daemons("h100-nvl-x2", base=first.base, extra_args=extra).start()
    new_gpus = {g.uuid for g in SimControl(
        first.sim_state if state_dir == "same" else first.base / "sim-new").node.gpus}
    assert old_gpu not in new_gpus
    # A round deletes, then updates: wait for its end, not a state in the middle of it.
    wait_for(lambda: any(line.get("event") == "published slices"
                         for line in log_lines(second, mark)))
    wait_for(lambda: full_gpus(fake_api) == {"gpu-0", "gpu-1"})
    uuids = {str(d["attributes"].get("uuid", d["attributes"].get("parentUUID", {}))
                 .get("string")) for d in published(fake_api).values()}
    assert uuids == new_gpus
    assert "Traceback" not in second.output()
    assert len(warnings_about(second, old_gpu, mark)) == 1, second.output()[mark:]
    # kept: the GPU may come back, and its MIG mode is then put back
    assert old_gpu in checkpoint(second)["migModeBaseline"]
    # and the node works
    gpu = create_claim(fake_api, "new-gpu", devices=["gpu-1"])
    async with await KubeletEmulator.discover(second.registrar) as kubelet:
        assert (await kubelet.prepare([gpu]))[gpu.uid]["error"] == ""


# --- a prepared claim whose GPU is gone -----------------------------------------------------


@pytest.mark.parametrize("fault", [("remove-gpu",), ("gpu-lost",)], ids=["removed", "lost"])
async def test_unprepare_of_a_claim_whose_gpu_is_gone_succeeds(fault, daemons, fake_api):
    daemon = daemons("dgx-h100").start()
    gone = SimControl(daemon.sim_state).node.gpus[3].uuid
    ref = create_claim(fake_api, "on-gpu-3", devices=["gpu-3-mig-1g10gb-19-6", "gpu-2"],
                       configs=[{"source": "FromClaim", "requests": [], "opaque": {
                           "driver": DRIVER, "parameters": {
                               "apiVersion": GV, "kind": "GpuConfig",
                               "sharing": {"strategy": "TimeSlicing"}}}}])
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
    assert daemon.stop() == 0
    sim(daemon, *fault, "--gpu", "3")

    daemon.start()
    wait_for(lambda: full_gpus(fake_api) == {f"gpu-{i}" for i in range(8)} - {"gpu-3"})
    assert "Traceback" not in daemon.output()
    assert ref.uid in checkpoint(daemon)["claims"]  # kept until the kubelet unprepares
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert list(daemon.cdi_root.glob("*.json")) == []
    cp = checkpoint(daemon)
    assert ref.uid not in cp["claims"]
    assert gone in cp["migModeBaseline"]  # the GPU may come back
    said = [line for line in log_lines(daemon)
            if ref.uid in json.dumps(line) and gone in json.dumps(line)
            and line.get("level") == "warning"]
    assert said and "gone" in said[-1]["event"], daemon.output()
    # the GPU that is there was put back
    control = SimControl(daemon.sim_state)
    assert control.snapshot()["gpus"][2]["compute_mode"] == 0
    assert control.snapshot()["gpus"][3]["gpu_instances"] != []  # left while it was gone

    # It comes back (after a restart if it was pulled out; a lost GPU is seen answering):
    # what the claim left on it is cleaned up, and it is published as it was before.
    if fault == ("remove-gpu",):
        assert daemon.stop() == 0
        sim(daemon, "insert-gpu", "--gpu", "3")
        daemon.start()
    else:
        sim(daemon, "gpu-lost", "--gpu", "3", "--recover")
    wait_for(lambda: "gpu-3-mig-1g10gb-19-6" in published(fake_api), timeout=15)
    gpu = control.snapshot()["gpus"][3]
    assert (gpu["gpu_instances"], gpu["mig_mode"]["current"]) == ([], 0)
    assert "uuid" not in published(fake_api)["gpu-3-mig-1g10gb-19-6"]["attributes"]  # dynamic


def test_a_gpu_pulled_out_and_put_back_is_found_again_after_a_restart(daemons, fake_api):
    daemon = daemons("l4-x4").start()
    wait_for(lambda: full_gpus(fake_api) == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"})
    assert daemon.stop() == 0
    sim(daemon, "remove-gpu", "--gpu", "2")
    daemon.start()
    wait_for(lambda: full_gpus(fake_api) == {"gpu-0", "gpu-1", "gpu-3"})
    assert daemon.stop() == 0
    sim(daemon, "insert-gpu", "--gpu", "2")
    daemon.start()
    wait_for(lambda: full_gpus(fake_api) == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"})


# --- Reproduction B: a GPU fallen off the bus -----------------------------------------------


def test_inventory_lists_the_gpus_that_answer_and_warns_about_a_lost_one(tmp_path):
    state = tmp_path / "sim"
    command = [sys.executable, "-m", "gpudra.cli.main", "inventory", "--simulate", "l4-x4",
               "--sim-state", str(state)]
    assert subprocess.run(command, capture_output=True, cwd=ROOT, check=False).returncode == 0
    assert main(["sim", "gpu-lost", "--gpu", "1", "--sim-state", str(state)]) == 0
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    names = [line.split()[0] for line in done.stdout.splitlines()[1:] if line.strip()]
    assert names[:3] == ["gpu-0", "gpu-2", "gpu-3"]
    assert "Traceback" not in done.stderr
    warning = [line for line in done.stderr.splitlines() if "GPU 1" in line or "lost" in line]
    assert len(warning) == 1, done.stderr


async def test_a_gpu_lost_before_start_up_is_left_out_and_picked_up_when_it_answers(
        daemons, fake_api):
    daemon = daemons("l4-x4").start()
    lost = SimControl(daemon.sim_state).node.gpus[1].uuid
    assert daemon.stop() == 0
    sim(daemon, "gpu-lost", "--gpu", "1")

    mark = len(daemon.output())
    daemon.start()
    wait_for(lambda: full_gpus(fake_api) == {"gpu-0", "gpu-2", "gpu-3"})
    assert "Traceback" not in daemon.output()
    assert len(warnings_about(daemon, lost, mark)) == 1, daemon.output()[mark:]
    ref = create_claim(fake_api, "works", devices=["gpu-2"])
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""

    sim(daemon, "gpu-lost", "--gpu", "1", "--recover")
    # the watcher probes every 5 s; no restart
    wait_for(lambda: "gpu-1" in full_gpus(fake_api), timeout=15)
    device = published(fake_api)["gpu-1"]
    assert device.get("taints", []) == []
    assert device["attributes"]["uuid"]["string"] == lost
    assert daemon.process is not None and daemon.process.poll() is None
