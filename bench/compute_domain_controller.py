"""How fast ``gpudra controller`` brings up a large ComputeDomain, through the real paths.

    python -m bench.compute_domain_controller [--runs 3] [--nodes 18,72,144]

The API stand-in runs in this process, the controller as its own process (as in
``tests/controller/compute_domains``). Per run: a domain with ``numNodes`` N; N channel
claims allocated on N nodes at once (written straight to the store, as the scheduler's
writes would land); timed until the controller has created all N daemon pods. Then every
node's entry turns Ready in one write; timed until every claim's ``ComputeDomainReady`` is
True and the domain is Ready. Counts the controller's API requests by verb. The tests check
that it happens; how fast is measured here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from gpudra.api import compute_domain as cd
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.controller.compute_domains.harness import (
    DRIVER_NS,
    ControllerProcess,
    allocate_channel,
    condition,
    daemon_pods,
    wait_for,
)


def one_run(nodes: int, base: Path, *, latency: float,
            at_once: int) -> tuple[float, float, Counter[str]]:
    with FakeApiServer() as api:
        for ns in ("team", DRIVER_NS):
            api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        proc = ControllerProcess(api.url, base, identity=f"bench-{nodes}",
                                 extra=("--writes-at-once", str(at_once))).start()
        try:
            wait_for("leader", lambda: "caches filled; reconciling" in proc.events(), 120)
            domain = api.put({"apiVersion": cd.API_VERSION, "kind": cd.KIND,
                              "metadata": {"name": "big", "namespace": "team"},
                              "spec": {"numNodes": nodes, "channel": {
                                  "resourceClaimTemplate": {"name": "big-channel"}}}})
            uid = domain["metadata"]["uid"]
            wait_for("template", lambda: api.get("ResourceClaimTemplate", "big-channel",
                                                  "team"), 120)
            api.reset_calls()
            if latency:  # a real API server's round trip, for every write
                for verb in ("create", "patch", "update", "delete"):
                    api.delay(latency, verb)
            names = [f"node-{i:03d}" for i in range(nodes)]
            start = time.monotonic()
            claims = [allocate_channel(api, domain, n) for n in names]
            wait_for("pods", lambda: len(daemon_pods(api, uid)) == nodes, 600)
            pods_at = time.monotonic() - start
            start = time.monotonic()
            api.modify("ComputeDomain", "big", {"status": {"nodes": [
                cd.node_entry(n, ip_address="10.0.0.1", clique_id="u.1", index=i,
                              status="Ready") for i, n in enumerate(names)]}}, "team")
            wait_for("ready", lambda: all(
                (condition(api, c, cd.CONDITION_READY) or {}).get("status") == "True"
                for c in claims) and ((api.get("ComputeDomain", "big", "team") or {})
                                      .get("status") or {}).get("status") == "Ready", 600)
            ready_at = time.monotonic() - start
            verbs = Counter(f"{r.verb} {r.resource}" for r in api.requests)
        finally:
            proc.stop()
    return pods_at, ready_at, verbs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", default="18,72,144")
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds added to every write the stand-in answers")
    parser.add_argument("--writes-at-once", type=int, default=16)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, write latency "
          f"{args.latency * 1000:g} ms, {args.writes_at_once} writes at once")
    for n in (int(x) for x in args.nodes.split(",")):
        pods, ready = [], []
        verbs: Counter[str] = Counter()
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                p, r, verbs = one_run(n, Path(tmp), latency=args.latency,
                                      at_once=args.writes_at_once)
            pods.append(p)
            ready.append(r)
        print(f"{n:4d} nodes: all daemon pods after {statistics.median(pods):.2f} s "
              f"(min {min(pods):.2f}), all claims Ready after {statistics.median(ready):.2f} s "
              f"(min {min(ready):.2f}); requests in the last run: {dict(sorted(verbs.items()))}")


if __name__ == "__main__":
    main()
