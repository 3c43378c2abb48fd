"""How IMEX daemons joining one ComputeDomain at once write the domain's status.

    python -m bench.compute_domain_join [--runs 3] [--nodes 4,18,72]

N ``gpudra compute-domain-daemon`` status writers (:class:`ImexWorkload`, the code the
daemon runs) against the API stand-in over real HTTP, in one event loop: all N add their
entry at once (``NotReady``), then all N flip to ``Ready`` at once. Each write is a GET and
a PUT of ``/status`` with the resourceVersion, retried on 409. Reports wall time per phase,
PUTs that landed, 409s, and whether every entry is there (none lost).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpudra.kube.raw_api import RawApi
from gpudra.kube.session import ApiSession
from gpudra.kubeletplugin.node.imex_workload import ImexWorkload, WorkloadConfig
from gpudra.testing.fakeapi.server import FakeApiServer


async def _phase(workloads: list[ImexWorkload], status: str) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(w.upsert(status) for w in workloads))  # type: ignore[arg-type]
    return time.perf_counter() - started


async def one_run(nodes: int, base: Path) -> dict[str, float]:
    with FakeApiServer() as api:
        uid = api.put({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": "bench", "namespace": "default"},
            "spec": {"numNodes": nodes, "channel": {"resourceClaimTemplate": {"name": "c"}}},
        })["metadata"]["uid"]
        async with ApiSession.for_url(api.url) as session:
            raw = RawApi(session)
            workloads = [ImexWorkload(WorkloadConfig(
                domain_uid=uid, domain_namespace="default", domain_name="bench",
                node=f"tray-{i:03d}", address=f"10.0.{i // 250}.{i % 250 + 1}",
                imex_dir=base / str(i), clique="c.1", imex_command=[sys.executable],
                query=lambda: None), raw) for i in range(nodes)]
            join = await _phase(workloads, "NotReady")
            ready = await _phase(workloads, "Ready")
        puts = [r.status for r in api.requests if r.resource == "computedomains/status"]
        cd = api.get("ComputeDomain", "bench", "default") or {}
        entries = [n for n in cd["status"]["nodes"] if n["status"] == "Ready"]
        return {"join": join, "ready": ready, "landed": puts.count(200),
                "conflicts": puts.count(409), "entries": len(entries)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", default="4,18,72")
    args = parser.parse_args()
    print("| nodes | all joined | all Ready | PUTs landed | 409s retried | entries kept |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.nodes.split(",")):
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(asyncio.run(one_run(n, Path(tmp))))
        join = statistics.median(r["join"] for r in runs)
        ready = statistics.median(r["ready"] for r in runs)
        print(f"| {n} | {join:.2f} s ({min(r['join'] for r in runs):.2f}) "
              f"| {ready:.2f} s ({min(r['ready'] for r in runs):.2f}) "
              f"| {statistics.median(r['landed'] for r in runs):.0f} "
              f"| {statistics.median(r['conflicts'] for r in runs):.0f} "
              f"| {min(r['entries'] for r in runs):.0f} of {n} |")


if __name__ == "__main__":
    main()
