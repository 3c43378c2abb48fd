"""MPS across a node-daemon restart: ``gpudra node`` killed with SIGKILL while an MPS claim
is prepared; the control daemon keeps running, the next instance adopts it (or starts it
again when it died), and unprepare still cleans everything up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.api.claims import ClaimRef
from gpudra.driver import mps_process
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import DRIVER, Daemon, claim_object

GV = "resource.nvidia.com/v1beta1"
MPS = {"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
    "apiVersion": GV, "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 35}}}}}


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    d = Daemon(fake_api.url)
    yield d
    if d.process is not None and d.process.poll() is None:
        d.stop()
    for pid in sim_daemons(d.plugins):  # a failed test must not leave daemons running
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d.base, ignore_errors=True)


@pytest.fixture
def stranger() -> Iterator[int]:
    """An unrelated live process: what a reused pid points at."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc.pid
    proc.kill()
    proc.wait()


def mps_claim(api: FakeApiServer) -> ClaimRef:
    stored = api.put(claim_object("shared", devices=["gpu-2"], configs=[MPS]))
    meta = stored["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def claim_dir(daemon: Daemon, ref: ClaimRef) -> Path:
    return daemon.plugins / DRIVER / "mps" / ref.uid


def cdi_path(daemon: Daemon, ref: ClaimRef) -> Path:
    return daemon.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json"


def restart(daemon: Daemon, timeout: float = 20.0) -> None:
    """Start the daemon again and wait for this instance to run (the log of the killed one,
    and its socket file, are still there)."""
    before = daemon.output().count("node daemon running")
    daemon.start(wait=False)
    deadline = time.monotonic() + timeout
    while daemon.output().count("node daemon running") == before:
        assert daemon.process is not None and daemon.process.poll() is None, daemon.output()
        assert time.monotonic() < deadline, daemon.output()
        time.sleep(0.02)


async def prepare(daemon: Daemon, ref: ClaimRef) -> dict:
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        entry = (await kubelet.prepare([ref]))[ref.uid]
    assert entry["error"] == "", entry
    return entry


async def unprepare_and_check_clean(daemon: Daemon, ref: ClaimRef, pids: list[int]) -> None:
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert not any(mps_process.alive(pid) for pid in pids)
    assert sim_daemons(claim_dir(daemon, ref)) == []
    assert not claim_dir(daemon, ref).exists()
    assert not cdi_path(daemon, ref).exists()


async def test_mps_daemon_survives_a_killed_node_daemon_and_is_adopted(daemon, fake_api):
    ref = mps_claim(fake_api)
    daemon.start()
    first = await prepare(daemon, ref)
    directory = claim_dir(daemon, ref)
    pid = mps_process.read_pid(directory / "control.pid")
    assert pid is not None and sim_daemons(directory) == [pid]
    # pipe, log and a private /dev/shm reach the container through CDI
    edits = json.loads(cdi_path(daemon, ref).read_text())["devices"][0]["containerEdits"]
    assert {"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps"} <= set(edits["env"])
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts["/tmp/nvidia-mps"] == str(directory / "pipe")
    assert mounts["/var/log/nvidia-mps"] == str(directory / "log")
    assert mounts["/dev/shm"] == str(directory / "shm")

    daemon.stop(signal.SIGKILL)  # a crash, an OOM kill: no clean-up runs
    assert mps_process.alive(pid)

    restart(daemon)
    assert sim_daemons(directory) == [pid]  # adopted, no second daemon started
    adopted = [json.loads(line) for line in daemon.output().splitlines()
               if "re-adopted MPS control daemon" in line]
    assert [(a["pid"], a["claim"]) for a in adopted] == [(pid, f"default/shared:{ref.uid}")]
    log = (directory / "log" / "control.log").read_text()
    assert log.count("MPS control daemon started") == 1
    assert (await prepare(daemon, ref))["devices"] == first["devices"]  # still answered

    await unprepare_and_check_clean(daemon, ref, [pid])
    assert daemon.stop() == 0


async def test_a_reused_pid_is_not_adopted_and_a_dead_daemon_is_restarted(
        daemon, fake_api, stranger):
    ref = mps_claim(fake_api)
    daemon.start()
    await prepare(daemon, ref)
    directory = claim_dir(daemon, ref)
    pid = mps_process.read_pid(directory / "control.pid")
    assert pid is not None
    daemon.stop(signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)  # the MPS daemon dies too
    assert mps_process.wait_exit(pid, 5)
    # ... and its pid now belongs to an unrelated process
    for path in (directory / "control.pid", directory / "pipe/nvidia-cuda-mps-control.pid"):
        mps_process.write_pid(path, stranger)
    restart(daemon)
    assert mps_process.alive(stranger)  # not killed
    restarted = mps_process.read_pid(directory / "control.pid")
    assert restarted not in (None, stranger, pid)
    assert sim_daemons(directory) == [restarted]
    assert "re-adopted MPS control daemon" not in daemon.output()
    assert "MPS control daemon of a prepared claim was dead; restarted it" in daemon.output()
    # restarted with the claim's config
    log = (directory / "log" / "control.log").read_text()
    assert log.count("set_default_active_thread_percentage 35") == 2
    await unprepare_and_check_clean(daemon, ref, [restarted])
    assert mps_process.alive(stranger)
