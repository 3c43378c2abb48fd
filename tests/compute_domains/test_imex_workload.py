"""``gpudra compute-domain-daemon``'s status writes and peers, against the API stand-in over
HTTP: a rack's 18 daemons joining at once all land their entry, each writes only its own,
the nodes config holds only its own clique, and a daemon that stops takes its entry out."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gpudra.driver.compute_domain_imex import NODES_CONFIG
from gpudra.kube.raw_api import RawApi
from gpudra.kube.session import ApiSession
from gpudra.kubeletplugin.node.imex_workload import ImexWorkload, WorkloadConfig
from gpudra.testing.fakeapi import FakeApiServer

CLIQUE = "9c6f5af3-53bf-49b5-a436-b66766c413c3.4026"
OTHER_CLIQUE = "2f1d7c4e-8a3b-4e6f-9b1a-5c7d3e9f0a12.4027"


def _domain(api: FakeApiServer) -> str:
    return str(api.put({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "rack", "namespace": "default"},
        "spec": {"numNodes": 18, "channel": {"resourceClaimTemplate": {"name": "ch"}}}},
    )["metadata"]["uid"])


def _workload(api: RawApi, uid: str, i: int, root: Path, *, clique: str = CLIQUE,
              answer: str | None = "NOT_READY: starting") -> ImexWorkload:
    # The IMEX daemon here is a process that sleeps: its state comes from ``query``.
    return ImexWorkload(WorkloadConfig(
        domain_uid=uid, domain_namespace="default", domain_name="rack", node=f"tray-{i:02d}",
        address=f"10.0.0.{i + 1}", imex_dir=root / f"tray-{i:02d}" / uid, clique=clique,
        imex_command=[sys.executable, "-c", "import time; time.sleep(60)"],
        query=lambda: answer, interval=0.05), api)


def _entries(api: FakeApiServer) -> dict[str, dict[str, object]]:
    cd = api.get("ComputeDomain", "rack", "default") or {}
    return {n["name"]: n for n in (cd.get("status") or {}).get("nodes") or []}


@pytest.mark.asyncio
async def test_a_rack_joining_at_once_loses_no_entry(fake_api: FakeApiServer,
                                                     tmp_path: Path) -> None:
    uid = _domain(fake_api)
    async with ApiSession.for_url(fake_api.url) as session:
        api = RawApi(session)
        workloads = [_workload(api, uid, i, tmp_path) for i in range(18)]
        await asyncio.gather(*(w.upsert("NotReady") for w in workloads))
        entries = _entries(fake_api)
        assert sorted(entries) == [f"tray-{i:02d}" for i in range(18)]
        assert sorted(int(str(e["index"])) for e in entries.values()) == list(range(18))
        # Half of them flip Ready at once: the others' entries stay as they were.
        await asyncio.gather(*(w.upsert("Ready") for w in workloads[::2]))
        entries = _entries(fake_api)
        assert {n for n, e in entries.items() if e["status"] == "Ready"} == {
            f"tray-{i:02d}" for i in range(0, 18, 2)}
        # Conflicts happened and were retried, not lost: 18 joins + 9 flips were written.
        writes = [r.status for r in fake_api.requests if r.resource == "computedomains/status"]
        assert writes.count(200) == 27
        assert 409 in writes and set(writes) == {200, 409}


@pytest.mark.asyncio
async def test_peers_are_the_same_clique_and_a_stopped_daemon_leaves(
        fake_api: FakeApiServer, tmp_path: Path) -> None:
    uid = _domain(fake_api)
    async with ApiSession.for_url(fake_api.url) as session:
        api = RawApi(session)
        ready = _workload(api, uid, 0, tmp_path, answer="READY")
        peer = _workload(api, uid, 1, tmp_path)
        stranger = _workload(api, uid, 2, tmp_path, clique=OTHER_CLIQUE)
        await peer.upsert("NotReady")
        await stranger.upsert("NotReady")
        stop = asyncio.Event()
        running = asyncio.create_task(ready.run(stop))
        try:
            for _ in range(400):
                if _entries(fake_api).get("tray-00", {}).get("status") == "Ready":
                    break
                await asyncio.sleep(0.02)
            assert _entries(fake_api)["tray-00"]["status"] == "Ready"
            nodes = (tmp_path / "tray-00" / uid / NODES_CONFIG).read_text().split()
            assert nodes == ["10.0.0.1", "10.0.0.2"]  # not 10.0.0.3: another clique
            assert ready.starts == 1
        finally:
            stop.set()
            await running
        assert set(_entries(fake_api)) == {"tray-01", "tray-02"}  # it left; others stay


@pytest.mark.asyncio
async def test_an_imex_daemon_that_keeps_exiting_is_restarted_ever_later(
        fake_api: FakeApiServer, tmp_path: Path) -> None:
    uid = _domain(fake_api)
    now = [0.0]
    async with ApiSession.for_url(fake_api.url) as session:
        workload = ImexWorkload(WorkloadConfig(
            domain_uid=uid, domain_namespace="default", domain_name="rack", node="tray-00",
            address="10.0.0.1", imex_dir=tmp_path / uid, clique=CLIQUE,
            imex_command=[sys.executable, "-c", "raise SystemExit(3)"], query=lambda: None),
            RawApi(session), clock=lambda: now[0])

        async def round_once_exited() -> None:
            await workload.round()
            for _ in range(500):  # the crashing daemon's exit, not a clock
                if not workload.imex_running:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the daemon did not exit")

        starts = []
        for t in (0.0, 0.0, 0.4, 0.6, 1.5, 1.7, 3.6, 3.8):
            now[0] = t
            await round_once_exited()
            starts.append(workload.starts)
        # Started at 0; its exit seen at 0 (next start at 0.5 or later: at 0.6); that one's
        # exit seen at 1.5 (next at 2.5 or later: at 3.6); then 2 s: a crash loop slows down.
        assert starts == [1, 1, 1, 2, 2, 2, 3, 3]
        assert _entries(fake_api)["tray-00"]["status"] == "NotReady"


@pytest.mark.asyncio
async def test_a_peer_entry_that_is_not_an_address_is_left_out(
        fake_api: FakeApiServer, tmp_path: Path) -> None:
    # Any daemon of the domain can write status entries: a hostile one must neither put
    # lines of its own in this node's IMEX config nor stop this daemon.
    uid = _domain(fake_api)
    async with ApiSession.for_url(fake_api.url) as session:
        api = RawApi(session)
        ready = _workload(api, uid, 0, tmp_path, answer="READY")
        peer = _workload(api, uid, 1, tmp_path)
        await peer.upsert("NotReady")
        cd = fake_api.get("ComputeDomain", "rack", "default") or {}
        cd["status"]["nodes"].append({"name": "evil", "ipAddress": "10.0.0.9\nIMEX_BAD=1",
                                      "cliqueID": CLIQUE, "index": 7, "status": "Ready"})
        fake_api.put(cd)  # as stored, status included
        stop = asyncio.Event()
        running = asyncio.create_task(ready.run(stop))
        try:
            for _ in range(400):  # until its first round has written its entry
                if _entries(fake_api).get("tray-00", {}).get("status") == "Ready":
                    break
                await asyncio.sleep(0.02)
            assert _entries(fake_api)["tray-00"]["status"] == "Ready"  # not stopped by it
            nodes = (tmp_path / "tray-00" / uid / NODES_CONFIG).read_text().splitlines()
            assert nodes == ["10.0.0.1", "10.0.0.2"]
        finally:
            stop.set()
            await running
