"""Two shares of one GPU through the real daemon over gRPC: one MPS control daemon with both
clients' limits; it stays while a share is left and goes with the last. Each share has one
``status.devices`` entry of its own, keyed by its shareID, written after prepare and gone
after unprepare (the test API server applies and validates them like the real one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.api.claims import ClaimRef
from gpudra.driver import mps_process
from gpudra.driver.shares import daemon_key
from gpudra.driver.sim.mps_daemon import read_limits
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import DRIVER, Daemon, claim_object
from tests.integration.test_claim_status_daemon import entries, eventually

SHARES = {"share-a": ("5a5a5a5a-0000-4000-8000-00000000000a", "20Gi", "33"),
          "share-b": ("5b5b5b5b-0000-4000-8000-00000000000b", "40Gi", "66")}


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    d = Daemon(fake_api.url, extra_args=("--shareable-gpus", "all"))
    yield d
    if d.process is not None and d.process.poll() is None:
        d.stop()
    for pid in sim_daemons(d.plugins):  # a failed test must not leave daemons running
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d.base, ignore_errors=True)


def share_claim(api: FakeApiServer, name: str) -> ClaimRef:
    share_id, memory, multiprocessors = SHARES[name]
    obj = claim_object(name, devices=["gpu-0-shared"])
    result = obj["status"]["allocation"]["devices"]["results"][0]
    result.update(shareID=share_id, consumedCapacity={
        "memory": memory, "multiprocessors": multiprocessors, "shares": "1"})
    stored = api.put(obj)
    meta = stored["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def gpu_daemon_dir(daemon: Daemon, gpu_uuid: str) -> Path:
    return daemon.plugins / DRIVER / "mps" / daemon_key(gpu_uuid)


def share_env(daemon: Daemon, ref: ClaimRef) -> list[str]:
    spec = json.loads((daemon.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json").read_text())
    [device] = spec["devices"]
    return list(device["containerEdits"]["env"])


async def test_two_shares_of_one_gpu_over_grpc(daemon, fake_api):
    a, b = share_claim(fake_api, "share-a"), share_claim(fake_api, "share-b")
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        answer = await kubelet.prepare([a, b])
        for ref, name in ((a, "share-a"), (b, "share-b")):
            assert answer[ref.uid]["error"] == "", answer
            [device] = answer[ref.uid]["devices"]
            share_id = SHARES[name][0]
            assert device["share_id"] == share_id  # v1 carries it
            assert device["cdi_device_ids"] == [
                f"k8s.{DRIVER}/claim={ref.uid}-gpu-0-shared-{share_id}"]
        gpus = [d for d in daemon.plugins.joinpath(DRIVER, "mps").iterdir()]
        assert len(gpus) == 1 and gpus[0].name.startswith("shared-GPU-")
        directory = gpus[0]
        gpu = directory.name.removeprefix("shared-")
        pid = mps_process.read_pid(directory / "control.pid")
        assert pid is not None and sim_daemons(directory) == [pid]
        # each client's limits, and the daemon's ceiling (the larger share)
        assert {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"} <= set(share_env(daemon, a))
        assert {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50"} <= set(share_env(daemon, b))
        limits = read_limits(directory / "log")
        assert limits["defaultDevicePinnedMemLimit"] == {gpu: "40960M"}
        assert limits["defaultActiveThreadPercentage"] == 50

        assert (await kubelet.unprepare([b]))[b.uid]["error"] == ""
        assert sim_daemons(directory) == [pid]  # the other share still uses it
        assert read_limits(directory / "log")["defaultActiveThreadPercentage"] == 25

        assert (await kubelet.unprepare([a]))[a.uid]["error"] == ""
        assert not mps_process.alive(pid)
        assert not gpu_daemon_dir(daemon, gpu).exists()
    assert daemon.stop() == 0


async def test_each_share_has_one_status_entry_with_its_share_id(daemon, fake_api):
    refs = {name: share_claim(fake_api, name) for name in SHARES}
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        answer = await kubelet.prepare(list(refs.values()))
        assert all(a["error"] == "" for a in answer.values()), answer

        gpus = set()
        for name, ref in refs.items():
            share_id = SHARES[name][0]
            (entry,) = await eventually(lambda ref=ref: entries(fake_api, ref),
                                        f"status.devices of {name}")
            assert (entry["driver"], entry["pool"], entry["device"], entry["shareID"]) == (
                DRIVER, "node-a", "gpu-0-shared", share_id)
            assert entry["data"]["cdiDeviceIDs"] == [
                f"k8s.{DRIVER}/claim={ref.uid}-gpu-0-shared-{share_id}"]
            assert entry["data"]["uuid"].startswith("GPU-")
            gpus.add(entry["data"]["uuid"])
            ready = next(c for c in entry["conditions"] if c["type"] == "Ready")
            assert ready["status"] == "True"
        assert len(gpus) == 1  # both shares name the one GPU they share

        a, b = refs["share-a"], refs["share-b"]
        assert (await kubelet.unprepare([b]))[b.uid]["error"] == ""
        await eventually(lambda: not entries(fake_api, b), "share-b's entry removed")
        (entry,) = entries(fake_api, a)  # the other share's entry stays
        assert entry["shareID"] == SHARES["share-a"][0]

        assert (await kubelet.unprepare([a]))[a.uid]["error"] == ""
        await eventually(lambda: not entries(fake_api, a), "share-a's entry removed")
    assert daemon.stop() == 0
