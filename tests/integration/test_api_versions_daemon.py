"""``gpudra node`` on a 1.32 cluster (resource.k8s.io v1beta1 only, a v1beta1-only kubelet)
and a 1.33 one (v1beta2): it finds the version by discovery, publishes slices the server
takes whole, and prepares a claim a v1beta1 scheduler wrote and allocated."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpudra.api.claims import ClaimRef
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import DRA_V1BETA1_ADVERTISED, KubeletEmulator
from tests.integration.daemon import DRIVER, Daemon, claim_object, node_daemon

WARNING = "the API server's resource.k8s.io version lacks features some devices need; " \
          "publishing without them"


@pytest.fixture(params=["v1beta1", "v1beta2"])
def old_api(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    with FakeApiServer(resource_api=str(request.param)) as server:
        yield server


@pytest.fixture
def daemon(old_api: FakeApiServer) -> Iterator[Daemon]:
    # The kubelet of 1.32/1.33 speaks DRA v1beta1 over gRPC: the test registers as it.
    with node_daemon(old_api, kubelet=False) as d:
        yield d


def published(api: FakeApiServer) -> list[str]:
    return sorted(d["name"] for s in api.list("ResourceSlice")
                  for d in s["spec"].get("devices") or [])


def send(api: FakeApiServer, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(api.url + path, data=json.dumps(body).encode(),
                                     method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def v1beta1_claim(api: FakeApiServer, name: str, device: str) -> ClaimRef:
    """What a 1.32 user and scheduler leave: the claim written and allocated in v1beta1."""
    claim = api.shown_as("v1beta1", claim_object(name, devices=[device]))
    assert "exactly" not in claim["spec"]["devices"]["requests"][0]  # the v1beta1 shape
    base = "/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaims"
    created = send(api, "POST", base, {k: v for k, v in claim.items() if k != "status"})
    created["status"] = claim["status"]
    send(api, "PUT", f"{base}/{name}/status", created)
    meta = created["metadata"]
    return ClaimRef(namespace="default", name=name, uid=meta["uid"])


async def test_the_node_publishes_and_prepares_on_an_older_cluster(daemon: Daemon,
                                                                   old_api: FakeApiServer):
    daemon.start()
    kubelet = await KubeletEmulator.discover(daemon.registrar,
                                             services=(DRA_V1BETA1_ADVERTISED,))
    try:
        ref = v1beta1_claim(old_api, "old-cluster", "gpu-3")
        entry = (await kubelet.prepare([ref]))[ref.uid]
        assert entry["error"] == ""
        assert [d["device_name"] for d in entry["devices"]] == ["gpu-3"]
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    finally:
        await kubelet.close()
    # The slices: full GPUs, taken whole (the dynamic MIG placements the daemon offers need
    # partitionable devices, which these releases lack: left out with one warning).
    expected = [f"gpu-{i}" for i in range(8)]
    async with asyncio.timeout(20):
        while published(old_api) != expected:  # noqa: ASYNC110 (another process publishes)
            await asyncio.sleep(0.02)
    # Nothing of the slices was lost. (1.32 drops a claim's status.devices, an alpha field
    # there, which the daemon writes after prepare: dropped, not refused, as in a cluster.)
    assert [p for p in old_api.pruned if p[0] != "resourceclaims"] == []
    assert {p[2] for p in old_api.pruned} <= {"status.devices"}
    assert old_api.pool_problems(DRIVER) == []
    refused = [(r.verb, r.path, r.status) for r in old_api.requests if r.status >= 400]
    assert refused == []
    served = old_api.served.versions[0]
    claim_reads = [r.path for r in old_api.requests
                   if r.verb == "get" and r.path.endswith("/resourceclaims/old-cluster")]
    assert claim_reads and all(f"/resource.k8s.io/{served}/" in p for p in claim_reads)
    [warning] = [e for e in daemon.events() if e.get("event") == WARNING]  # one, only
    assert warning["lacks"] == [
        "binding conditions", "consumable capacity", "device taints", "partitionable devices"]
    chosen = [e for e in daemon.events()
              if e.get("event") == "publishing ResourceSlices in resource.k8s.io"]
    assert [e["version"] for e in chosen] == [served]
