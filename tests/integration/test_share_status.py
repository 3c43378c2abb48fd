"""Shares in ``status.devices`` through the real daemon: two claims sharing one GPU each get
one entry of their own, keyed by their shareID, written after prepare and gone after
unprepare (the test API server applies and validates them like the real one)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpudra.api.claims import ClaimRef
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import DRIVER, Daemon, claim_object, node_daemon

SHARES = {"share-a": ("5a5a5a5a-0000-4000-8000-00000000000a", "20Gi", "33"),
          "share-b": ("5b5b5b5b-0000-4000-8000-00000000000b", "40Gi", "66")}


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    with node_daemon(fake_api, extra_args=("--shareable-gpus", "all")) as d:
        try:
            yield d
        finally:
            if d.process is not None and d.process.poll() is None:
                d.stop()
            for pid in sim_daemons(d.plugins):  # a failed test must not leave daemons running
                os.kill(pid, signal.SIGKILL)


def share_claim(api: FakeApiServer, name: str) -> ClaimRef:
    share_id, memory, multiprocessors = SHARES[name]
    obj = claim_object(name, devices=["gpu-0-shared"])
    result = obj["status"]["allocation"]["devices"]["results"][0]
    result.update(shareID=share_id, consumedCapacity={
        "memory": memory, "multiprocessors": multiprocessors, "shares": "1"})
    meta = api.put(obj)["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def entries(api: FakeApiServer, ref: ClaimRef) -> list[dict[str, Any]]:
    claim = api.get("ResourceClaim", ref.name, ref.namespace) or {}
    return list((claim.get("status") or {}).get("devices") or [])


async def eventually(check: Callable[[], Any], what: str, seconds: float = 15.0) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {seconds}s"
        await asyncio.sleep(0.05)
    return found


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
