"""The real ``gpudra controller`` process against the API stand-in over HTTP: a domain's
objects, daemon pods per (domain, node), readiness into status and claims, failures with a
message, concurrent node status writes, and clean-up."""

from __future__ import annotations

from pathlib import Path

from gpudra.api import compute_domain as cd
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.controller.compute_domains.harness import (
    DRIVER_NS,
    allocate_channel,
    concurrently,
    condition,
    create_domain,
    daemon_pods,
    delete_domain,
    running,
    upsert_node_entry,
    wait_for,
)


def _status(api: FakeApiServer, name: str, namespace: str = "team") -> dict:
    return (api.get("ComputeDomain", name, namespace) or {}).get("status") or {}


def test_a_four_node_domain_from_creation_to_ready_failure_and_deletion(
        api: FakeApiServer, tmp_path: Path) -> None:
    with running(api, tmp_path):
        domain = create_domain(api, "train", num_nodes=4)
        uid = domain["metadata"]["uid"]
        template = wait_for("the channel template", lambda: api.get(
            "ResourceClaimTemplate", "train-channel", "team"))
        assert template["metadata"]["ownerReferences"][0]["uid"] == uid
        config = template["spec"]["spec"]["devices"]["config"][0]["opaque"]
        assert config == {"driver": cd.DRIVER_NAME, "parameters": cd.channel_config(uid)}
        daemon_template = wait_for("the daemon template", lambda: api.get(
            "ResourceClaimTemplate", f"imex-{uid}", DRIVER_NS))
        assert daemon_template["spec"]["spec"]["devices"]["requests"][0]["exactly"] == {
            "deviceClassName": cd.DAEMON_DEVICE_CLASS}

        nodes = [f"gb200-{i}" for i in range(4)]
        claims = [allocate_channel(api, domain, node) for node in nodes]
        pods = wait_for("4 daemon pods", lambda: (p := daemon_pods(api, uid)) and
                        len(p) == 4 and p)
        for node, pod in pods.items():
            terms = pod["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                               "values": [node]}]}]
            command = pod["spec"]["containers"][0]["command"]
            assert command[:2] == ["gpudra", "compute-domain-daemon"]
            assert command[command.index("--node") + 1] == node
            assert command[command.index("--domain-uid") + 1] == uid
            assert pod["spec"]["resourceClaims"] == [
                {"name": "daemon", "resourceClaimTemplateName": f"imex-{uid}"}]
        # Until a node's daemon reports, its claim waits: Ready False, not failed.
        waiting = wait_for("a waiting condition", lambda: condition(api, claims[0],
                                                                      cd.CONDITION_READY))
        assert waiting["status"] == "False" and waiting["reason"] == "WaitingForDaemon"
        assert _status(api, "train").get("status") == cd.STATUS_NOT_READY

        for i, node in enumerate(nodes[:3]):
            upsert_node_entry(api, domain, node, status="Ready", index=i)
        wait_for("3 claims ready", lambda: all(
            (condition(api, c, cd.CONDITION_READY) or {}).get("status") == "True"
            for c in claims[:3]))
        assert _status(api, "train")["status"] == cd.STATUS_NOT_READY  # 3 of numNodes 4
        upsert_node_entry(api, domain, nodes[3], status="Ready", index=3)
        wait_for("the domain Ready", lambda: _status(api, "train").get("status") ==
                 cd.STATUS_READY)
        wait_for("4 claims ready", lambda: all(
            (condition(api, c, cd.CONDITION_READY) or {}).get("status") == "True"
            for c in claims))

        # The daemon on node 2 dies: its entry still says Ready, but the pod says Failed.
        failed = pods[nodes[2]]["metadata"]["name"]
        api.modify("Pod", failed, {"status": {"phase": "Failed", "reason": "Error",
                                              "message": "imex daemon exited: peer lost"}},
                   DRIVER_NS)
        failure = wait_for("the failure condition", lambda: (
            c := condition(api, claims[2], cd.CONDITION_FAILED)) and c["status"] == "True"
            and c)
        assert "gb200-2" in failure["message"] and "peer lost" in failure["message"]
        assert (condition(api, claims[2], cd.CONDITION_READY) or {})["status"] == "False"
        wait_for("the domain NotReady", lambda: _status(api, "train").get("status") ==
                 cd.STATUS_NOT_READY)
        assert (condition(api, claims[0], cd.CONDITION_READY) or {})["status"] == "True"
        notes = [e.get("note", "") for e in api.list("events.events.k8s.io", "team")
                 if e.get("reason") == "DaemonFailed"]
        assert any("peer lost" in n for n in notes)

        delete_domain(api, "train")
        wait_for("everything the domain made gone", lambda: not daemon_pods(api, uid) and
                 api.get("ResourceClaimTemplate", "train-channel", "team") is None and
                 api.get("ResourceClaimTemplate", f"imex-{uid}", DRIVER_NS) is None)
        gone = wait_for("claims told the domain is gone", lambda: (
            c := condition(api, claims[0], cd.CONDITION_FAILED)) and
            c["reason"] == "ComputeDomainNotFound" and c)
        assert gone["status"] == "True"


def test_fifty_nodes_writing_at_once_lose_no_entry(api: FakeApiServer,
                                                   tmp_path: Path) -> None:
    with running(api, tmp_path):
        # numNodes 25: the controller's own status write (Ready) lands in the middle of
        # the daemons' storm and must not drop any of their entries either.
        domain = create_domain(api, "big", num_nodes=25)
        uid = domain["metadata"]["uid"]
        nodes = [f"n{i:02d}" for i in range(50)]
        claims = [allocate_channel(api, domain, node) for node in nodes]
        wait_for("50 daemon pods", lambda: len(daemon_pods(api, uid)) == 50)
        conflicts = concurrently([
            (lambda n=node, i=i: upsert_node_entry(api, domain, n, status="Ready", index=i))
            for i, node in enumerate(nodes)])
        assert sum(conflicts) > 0  # they did race
        status = wait_for("the domain Ready", lambda: (
            s := _status(api, "big")) and s.get("status") == cd.STATUS_READY and s)
        assert sorted(n["name"] for n in status["nodes"]) == nodes
        wait_for("every claim ready", lambda: all(
            (condition(api, c, cd.CONDITION_READY) or {}).get("status") == "True"
            for c in claims))
        assert sorted(n["name"] for n in _status(api, "big")["nodes"]) == nodes


def test_several_domains_share_nodes_each_with_its_own_daemon(api: FakeApiServer,
                                                              tmp_path: Path) -> None:
    with running(api, tmp_path):
        a = create_domain(api, "a")
        b = create_domain(api, "b", namespace="other")
        for node in ("n1", "n2"):
            allocate_channel(api, a, node, device="channel-0")
            allocate_channel(api, b, node, device="channel-1")
        for domain in (a, b):
            uid = domain["metadata"]["uid"]
            wait_for("2 pods per domain", lambda u=uid: sorted(daemon_pods(api, u)) ==
                     ["n1", "n2"])
        upsert_node_entry(api, a, "n1", status="Ready")
        upsert_node_entry(api, a, "n2", status="Ready")
        wait_for("domain a Ready", lambda: _status(api, "a").get("status") == "Ready")
        assert _status(api, "b", "other").get("status") == cd.STATUS_NOT_READY
        delete_domain(api, "a")
        wait_for("a's pods gone", lambda: not daemon_pods(api, a["metadata"]["uid"]))
        assert sorted(daemon_pods(api, b["metadata"]["uid"])) == ["n1", "n2"]


def test_a_node_leaving_removes_its_pod_and_entry(api: FakeApiServer, tmp_path: Path) -> None:
    with running(api, tmp_path):
        domain = create_domain(api, "shrink")
        uid = domain["metadata"]["uid"]
        allocate_channel(api, domain, "n1")
        gone = allocate_channel(api, domain, "n2")
        wait_for("2 pods", lambda: len(daemon_pods(api, uid)) == 2)
        upsert_node_entry(api, domain, "n1", status="Ready")
        upsert_node_entry(api, domain, "n2", status="Ready")
        wait_for("Ready", lambda: _status(api, "shrink").get("status") == "Ready")
        api.delete("ResourceClaim", gone["metadata"]["name"], "team")
        wait_for("n2's pod and entry gone", lambda: sorted(daemon_pods(api, uid)) == ["n1"]
                 and [n["name"] for n in _status(api, "shrink")["nodes"]] == ["n1"])
        assert _status(api, "shrink")["status"] == cd.STATUS_READY


def test_a_claim_of_another_namespace_cannot_join_a_domain(api: FakeApiServer,
                                                            tmp_path: Path) -> None:
    with running(api, tmp_path):
        domain = create_domain(api, "private")
        uid = domain["metadata"]["uid"]
        allocate_channel(api, domain, "n1")
        # Another tenant copies the domain's uid into a claim of its own namespace.
        stolen = {**domain, "metadata": {**domain["metadata"], "namespace": "other"}}
        intruder = allocate_channel(api, stolen, "n2", name="steal")
        failed = wait_for("the intruder refused", lambda: (
            c := condition(api, intruder, cd.CONDITION_FAILED)) and c["status"] == "True"
            and c)
        assert failed["reason"] == "ForeignNamespace"
        assert sorted(daemon_pods(api, uid)) == ["n1"]
