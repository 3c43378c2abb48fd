"""A 4-node ComputeDomain end to end, on simulated GB200 NVL72 trays.

Real processes over real transports: per node a ``gpudra compute-domain-node`` (the
compute-domain.nvidia.com kubelet plugin) registered by a kubelet stand-in over its unix
sockets and publishing to the API stand-in over HTTP; a pod runner per node
(:mod:`gpudra.testing.pod_runner`) running the IMEX daemon pods, whose command is the
contract's ``gpudra compute-domain-daemon`` with the simulated node's settings in its
environment, each running a simulated IMEX daemon that talks TCP to its peers.

The controller is the real ``gpudra controller`` process: it makes one IMEX daemon pod per
(domain, node) and sets the channel claims' binding conditions. The scheduler and the
resourceclaim controller are played by the test: it allocates each node's ``channel-0`` as
the scheduler would (binding conditions copied from the published device), schedules each
daemon pod (its daemon claim made from the template, allocated on the pod's node, prepared
through that node's kubelet stand-in, then ``spec.nodeName`` set), and binds a workload pod
only once its claim's ``ComputeDomainReady`` is True.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpudra.api.claims import ClaimRef
from gpudra.api.compute_domain import (
    CONDITION_FAILED,
    CONDITION_READY,
    DRIVER_NAME,
    LABEL_NODE,
    channel_config,
)
from gpudra.driver.cdi import spec_path
from gpudra.driver.sim.imex_daemon import crash_file
from gpudra.testing.fakeapi import FakeApiServer
from tests.compute_domains.harness import SimNode, published, until
from tests.controller.compute_domains.harness import running
from tests.examples.test_examples import EXAMPLES, folder_objects

T = TypeVar("T")
NODES = [f"gb-{i}" for i in range(4)]
EXAMPLE = EXAMPLES / "compute-domain"
NAMESPACE = "default"
DRIVER_NAMESPACE = "gpudra-system"


def _schedule_daemon_pods(api: FakeApiServer, cluster: dict[str, SimNode],
                          done: set[str]) -> None:
    """What the resourceclaim controller, the scheduler and the kubelet do for a daemon pod
    before its container starts: claim from the template, allocation on the pod's node,
    prepare through that node's plugin, then the binding."""
    for pod in api.list("Pod", DRIVER_NAMESPACE):
        meta = pod["metadata"]
        if pod["spec"].get("nodeName") or meta["name"] in done:
            continue
        node = meta["annotations"][LABEL_NODE]
        (ref,) = pod["spec"]["resourceClaims"]
        template = api.get("ResourceClaimTemplate", ref["resourceClaimTemplateName"],
                           DRIVER_NAMESPACE) or {}
        devices = template["spec"]["spec"]["devices"]
        request = devices["requests"][0]["name"]
        slot = sum(1 for p in api.list("Pod", DRIVER_NAMESPACE)
                   if p["spec"].get("nodeName") == node)
        claim = api.put({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{meta['name']}-{ref['name']}", "namespace": DRIVER_NAMESPACE},
            "spec": template["spec"]["spec"],
            "status": {"allocation": {"devices": {
                "results": [{"request": request, "driver": DRIVER_NAME, "pool": node,
                             "device": f"daemon-{slot}"}],
                "config": [{"source": "FromClaim", **c} for c in devices["config"]]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                    "key": "metadata.name", "operator": "In", "values": [node]}]}]}}}})
        claim_ref = ClaimRef(DRIVER_NAMESPACE, claim["metadata"]["name"],
                             claim["metadata"]["uid"])
        answer = cluster[node].prepare(claim_ref)
        assert answer["error"] == "", answer
        api.modify("Pod", meta["name"], {
            "spec": {"nodeName": node},
            "status": {"resourceClaimStatuses": [
                {"name": ref["name"], "resourceClaimName": claim["metadata"]["name"]}]}},
            DRIVER_NAMESPACE)
        done.add(meta["name"])


def _allocated(name: str, spec: dict[str, Any], node: str,
               results: list[tuple[str, str, str, dict[str, Any]]]) -> dict[str, Any]:
    """A claim from a template's spec, allocated on ``node`` as the scheduler does it:
    each result's binding conditions are the device's; configs from the claim."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec,
        "status": {"allocation": {"devices": {
            "results": [{"request": request, "driver": driver, "pool": node, "device": device,
                         **{k: published[k] for k in ("bindingConditions",
                                                      "bindingFailureConditions")
                            if k in published}}
                        for request, driver, device, published in results],
            "config": [{"source": "FromClaim", **c}
                       for c in spec["devices"].get("config") or []]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                "key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}


def _condition(api: FakeApiServer, claim: str, kind: str) -> str | None:
    obj = api.get("ResourceClaim", claim, NAMESPACE) or {}
    for device in (obj.get("status") or {}).get("devices") or []:
        for condition in device.get("conditions") or []:
            if condition["type"] == kind:
                return str(condition["status"])
    return None


def _entries(api: FakeApiServer, domain: str = "training") -> dict[str, str]:
    cd = api.get("ComputeDomain", domain, NAMESPACE) or {}
    return {n["name"]: n["status"] for n in (cd.get("status") or {}).get("nodes") or []}


@pytest.fixture
def cluster(request: pytest.FixtureRequest, fake_api: FakeApiServer,
            tmp_path: Path) -> Iterator[list[SimNode]]:
    """Simulated trays, each with ``gpudra compute-domain-node``, and ``gpudra controller``:
    ``NODES`` with ``gpudra node`` beside, or (indirect parameter) that many trays without."""
    network = tmp_path / "imex-net"
    trays: int | None = getattr(request, "param", None)
    names = NODES if trays is None else NODES[:trays]
    nodes = [SimNode(name, f"10.0.0.{i + 1}", fake_api.url, network,
                     gpu_daemon=trays is None)
             for i, name in enumerate(names)]
    for node in nodes:
        fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name}})
    try:
        for node in nodes:
            node.start()
        # The controller starts once the nodes are up: on two shared cores, eight daemons
        # and a controller starting at once load the API stand-in past its clients' 10 s
        # deadlines (seen as the controller's first list timing out).
        for node in nodes:
            until(lambda node=node: "channel-0" in published(fake_api, node.name),
                  lambda node=node: f"{node.name}'s channels published\n{node.log()}")
        with running(fake_api, tmp_path, extra=("--leader-elect", "false")):
            yield nodes
    finally:
        for node in nodes:
            node.stop()


def _published_channel(api: FakeApiServer, node: str) -> dict[str, Any] | None:
    for s in api.list("ResourceSlice"):
        if s["spec"]["driver"] == DRIVER_NAME and s["spec"]["pool"]["name"] == node:
            for device in s["spec"].get("devices") or []:
                if device["name"] == "channel-0":
                    return dict(device)
    return None


def test_four_node_domain_forms_runs_and_reports_a_crashed_daemon(
        fake_api: FakeApiServer, cluster: list[SimNode], tmp_path: Path) -> None:
    # Each tray publishes its GPUs (gpudra node) and, beside them, its channels in its
    # clique with the binding conditions (gpudra compute-domain-node), to one kubelet.
    for node in cluster:
        until(lambda node=node: len(published(fake_api, node.name, "gpu.nvidia.com")) >= 4,
              f"{node.name}'s GPUs published")
    channels = {n.name: until(lambda n=n: _published_channel(fake_api, n.name),
                              f"{n.name}'s channels published\n{n.log()}") for n in cluster}
    for device in channels.values():
        assert device["bindingConditions"] == [CONDITION_READY]
        assert device["bindingFailureConditions"] == [CONDITION_FAILED]
        assert device["bindsToNode"] is True
        attrs = device["attributes"]
        assert attrs["cliqueID"] == {"string": "9c6f5af3-53bf-49b5-a436-b66766c413c3.4026"}
        assert attrs["type"] == {"string": "channel"}

    # examples/compute-domain/: the domain, the GPU claim template and the job's pods.
    objects = {o["kind"]: o for o in folder_objects(EXAMPLE)}
    domain = fake_api.put({**objects["ComputeDomain"],
                           "metadata": {**objects["ComputeDomain"]["metadata"],
                                        "namespace": NAMESPACE}})
    uid = domain["metadata"]["uid"]
    gpu_template = objects["ResourceClaimTemplate"]
    worker = objects["Job"]["spec"]["template"]
    channel_template = until(
        lambda: fake_api.get("ResourceClaimTemplate", "training-channel", NAMESPACE),
        "the controller's channel claim template")

    # The resourceclaim controller makes each worker's claims from the templates; the
    # scheduler allocates a channel per node (binding conditions copied from the device)
    # and the node's 4 GPUs.
    refs: dict[str, ClaimRef] = {}
    gpu_refs: dict[str, ClaimRef] = {}
    for i, node in enumerate(NODES):
        stored = fake_api.put(_allocated(
            f"training-{i}-imex-channel", channel_template["spec"]["spec"], node,
            [("channel", DRIVER_NAME, "channel-0", channels[node])]))
        refs[node] = ClaimRef(NAMESPACE, stored["metadata"]["name"], stored["metadata"]["uid"])
        stored = fake_api.put(_allocated(
            f"training-{i}-gpus", gpu_template["spec"]["spec"], node,
            [("gpus", "gpu.nvidia.com", f"gpu-{n}", {}) for n in range(4)]))
        gpu_refs[node] = ClaimRef(NAMESPACE, stored["metadata"]["name"],
                                  stored["metadata"]["uid"])

    # Before its daemon is Ready a channel prepare is refused, naming claim and domain.
    early = cluster[0].prepare(refs[NODES[0]])
    assert early["error"].startswith(f"claim {NAMESPACE}/training-0-imex-channel")
    assert "ComputeDomain" in early["error"] and uid in early["error"]

    # The controller's daemon pods (scheduled here) join each node to the domain.
    by_name = {n.name: n for n in cluster}
    scheduled: set[str] = set()

    def daemons_scheduled() -> bool:
        _schedule_daemon_pods(fake_api, by_name, scheduled)
        return len(scheduled) == len(NODES)

    until(daemons_scheduled, lambda: f"the controller's daemon pods: {scheduled} of "
          f"{[p['metadata']['name'] for p in fake_api.list('Pod', DRIVER_NAMESPACE)]}\n"
          + (tmp_path / "controller-a.log").read_text()[-3000:])
    until(lambda: _entries(fake_api) == dict.fromkeys(NODES, "Ready"),
          f"every node Ready: {_entries(fake_api)}\n" + "\n".join(
              (n.runner.log(DRIVER_NAMESPACE, f"imex-{n.name}") if n.runner else "")
              for n in cluster), timeout=90)
    cd = fake_api.get("ComputeDomain", "training", NAMESPACE) or {}
    nodes = cd["status"]["nodes"]
    assert sorted(n["index"] for n in nodes) == [0, 1, 2, 3]  # each its own
    assert {n["ipAddress"] for n in nodes} == {f"10.0.0.{i}" for i in range(1, 5)}
    for node in cluster:
        peers = (node.imex_root / uid / "nodes_config.cfg").read_text().split()
        assert peers == [f"10.0.0.{i}" for i in range(1, 5)]

    until(lambda: (fake_api.get("ComputeDomain", "training", NAMESPACE) or {}).get(
        "status", {}).get("status") == "Ready", "the controller to call the domain Ready")
    # Binding: the scheduler binds a pod only once ComputeDomainReady is True.
    for node in NODES:
        until(lambda node=node: _condition(fake_api, refs[node].name, CONDITION_READY)
              == "True", f"ComputeDomainReady on {node}'s claim")
    for i, (node, sim_node) in enumerate(zip(NODES, cluster, strict=True)):
        answer = sim_node.prepare(refs[node])
        assert answer["error"] == "", answer
        (device,) = answer["devices"]
        assert device["device_name"] == "channel-0"
        spec = json.loads(spec_path(sim_node.cdi_root, DRIVER_NAME,
                                    refs[node].uid).read_text())
        paths = [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
        assert paths == ["/dev/nvidia-caps-imex-channels/channel0"]
        gpus = sim_node.prepare(gpu_refs[node], driver="gpu.nvidia.com")
        assert gpus["error"] == "" and len(gpus["devices"]) == 4, gpus
        # The job's worker, bound to the node; its command is a local one (no image here).
        container = {**worker["spec"]["containers"][0],
                     "command": [sys.executable, "-c", "import time; time.sleep(600)"]}
        fake_api.put({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"training-{i}", "namespace": NAMESPACE,
            "labels": worker["metadata"]["labels"]},
            "spec": {**worker["spec"], "nodeName": node, "containers": [container]},
            "status": {"resourceClaimStatuses": [
                {"name": "imex-channel", "resourceClaimName": refs[node].name},
                {"name": "gpus", "resourceClaimName": gpu_refs[node].name}]}})
    for i, sim_node in enumerate(cluster):
        assert sim_node.runner is not None
        sim_node.runner.wait_running(NAMESPACE, f"training-{i}")

    # One IMEX daemon crashes (and keeps crashing when started again): its node and every
    # peer say NotReady in the domain's status, and the claims are told.
    crashed = cluster[3]
    crash = crash_file(crashed.network, crashed.address, uid)
    crash.touch()
    until(lambda: _entries(fake_api) == dict.fromkeys(NODES, "NotReady"),
          f"every node NotReady: {_entries(fake_api)}")
    until(lambda: (fake_api.get("ComputeDomain", "training", NAMESPACE) or {}).get(
        "status", {}).get("status") == "NotReady", "the domain to say NotReady")
    for node in NODES:
        until(lambda node=node: _condition(fake_api, refs[node].name, CONDITION_READY)
              == "False", f"ComputeDomainReady False on {node}'s claim")
    # A workload that comes now is refused by prepare too, naming the claim and the domain.
    late = fake_api.put({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "late", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "channel", "exactly": {
            "deviceClassName": "compute-domain-default-channel.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "channel", "driver": DRIVER_NAME, "pool": NODES[0],
                         "device": "channel-1"}],
            "config": [{"source": "FromClaim", "requests": ["channel"], "opaque": {
                "driver": DRIVER_NAME, "parameters": channel_config(uid)}}]}}}})
    refused = cluster[0].prepare(ClaimRef(NAMESPACE, "late", late["metadata"]["uid"]))
    assert "is 'NotReady', not Ready" in refused["error"] and "default/late" in refused["error"]

    # It recovers once the daemon stays up.
    crash.unlink()
    until(lambda: _entries(fake_api) == dict.fromkeys(NODES, "Ready"),
          f"every node Ready again: {_entries(fake_api)}")

    # Leaving: the workload's claim is unprepared, the daemon pod deleted; its entry goes.
    assert crashed.unprepare(refs[crashed.name])["error"] == ""
    assert not spec_path(crashed.base / "cdi", DRIVER_NAME, refs[crashed.name].uid).exists()
    fake_api.delete("Pod", f"training-{NODES.index(crashed.name)}", NAMESPACE)
    fake_api.delete("ResourceClaim", refs[crashed.name].name, NAMESPACE)
    # No channel claim of the domain on that node any more: the controller removes the
    # daemon pod, whose daemon takes its entry out on SIGTERM.
    until(lambda: crashed.name not in _entries(fake_api), "the node to leave the domain",
          timeout=30)
    assert set(_entries(fake_api)) == set(NODES[:3])


def _status(api: FakeApiServer, domain: str) -> str | None:
    return (api.get("ComputeDomain", domain, NAMESPACE) or {}).get("status", {}).get("status")


@pytest.mark.parametrize("cluster", [2], indirect=True)
def test_two_domains_share_two_trays_and_fail_apart(
        fake_api: FakeApiServer, cluster: list[SimNode]) -> None:
    """Several domains per node and per clique: each takes its own channel and daemon slot
    on both trays, and a crash in one leaves the other Ready."""
    names = [n.name for n in cluster]
    by_name = {n.name: n for n in cluster}
    uids = {}
    for domain in ("alpha", "beta"):
        uids[domain] = fake_api.put({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": domain, "namespace": NAMESPACE},
            "spec": {"numNodes": 2, "channel": {
                "resourceClaimTemplate": {"name": f"{domain}-channel"}}}})["metadata"]["uid"]
    refs: dict[tuple[str, str], ClaimRef] = {}
    for channel, domain in enumerate(("alpha", "beta")):
        template = until(lambda d=domain: fake_api.get("ResourceClaimTemplate",
                                                       f"{d}-channel", NAMESPACE),
                         f"{domain}'s channel template")
        for node in names:
            device = published(fake_api, node)[f"channel-{channel}"]
            stored = fake_api.put(_allocated(f"{domain}-{node}", template["spec"]["spec"],
                                             node, [("channel", DRIVER_NAME,
                                                     f"channel-{channel}", device)]))
            refs[domain, node] = ClaimRef(NAMESPACE, stored["metadata"]["name"],
                                          stored["metadata"]["uid"])
    scheduled: set[str] = set()

    def daemons_scheduled() -> bool:
        _schedule_daemon_pods(fake_api, by_name, scheduled)
        return len(scheduled) == 4

    until(daemons_scheduled, lambda: f"4 daemon pods, have {scheduled}")
    for domain in ("alpha", "beta"):
        until(lambda d=domain: _status(fake_api, d) == "Ready", f"{domain} Ready")
    for (domain, node), ref in refs.items():
        until(lambda r=ref: _condition(fake_api, r.name, CONDITION_READY) == "True",
              f"{domain} on {node} bindable")
        assert by_name[node].prepare(ref)["error"] == ""
    for node in cluster:  # one IMEX config per domain, each with both trays
        for uid in uids.values():
            assert (node.imex_root / uid / "nodes_config.cfg").read_text().split() == [
                "10.0.0.1", "10.0.0.2"]

    crash_file(cluster[1].network, cluster[1].address, uids["alpha"]).touch()
    until(lambda: _status(fake_api, "alpha") == "NotReady", "alpha NotReady")
    until(lambda: _condition(fake_api, refs["alpha", names[0]].name, CONDITION_READY)
          == "False", "alpha's claims told")
    assert _status(fake_api, "beta") == "Ready"
    assert _entries(fake_api, "beta") == dict.fromkeys(names, "Ready")
    assert _condition(fake_api, refs["beta", names[0]].name, CONDITION_READY) == "True"
