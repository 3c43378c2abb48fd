"""The controller's pure core, as tables: given a domain, its channel claims and its daemon
pods (and what was observed before), what should exist and what everyone is told."""

from __future__ import annotations

from typing import Any

import pytest

from gpudra.api import compute_domain as cd
from gpudra.controller.compute_domains import objects
from gpudra.controller.compute_domains.claims import ChannelUse, ClaimKey, DeviceKey, read_claim
from gpudra.controller.compute_domains.plan import (
    Condition,
    Observed,
    condition_json,
    plan_domain,
    same_conditions,
)
from gpudra.controller.compute_domains.pods import DaemonPod, read_pod

UID = "0b5f5e5e-1111-4222-8333-444455556666"
OTHER = "9b5f5e5e-1111-4222-8333-444455556666"
SETTINGS = objects.Settings(namespace="gpudra-system", daemon_image="img", ready_timeout=100,
                            restart_delay=30)


def domain(num_nodes: int = 0, nodes: dict[str, str] | None = None) -> cd.ComputeDomain:
    return cd.parse_compute_domain({
        "metadata": {"name": "d", "namespace": "team", "uid": UID},
        "spec": {"numNodes": num_nodes, "channel": {"resourceClaimTemplate": {"name": "ch"}}},
        "status": {"nodes": [{"name": n, "status": s} for n, s in (nodes or {}).items()]}})


def use(node: str, claim: str = "c") -> ChannelUse:
    return ChannelUse(ClaimKey("team", f"{claim}-{node}", "u"), UID, node,
                      DeviceKey(cd.DRIVER_NAME, node, "channel-0"))


def pod(node: str, *, phase: str = "Running", failure: str = "", name: str | None = None,
        deleting: bool = False) -> DaemonPod:
    return DaemonPod(name or objects.daemon_pod_name(UID, node), UID, node, phase, deleting,
                     "", failure)


ALL_TEMPLATES = {("team", "ch"), ("gpudra-system", f"imex-{UID}")}


def plan(d: cd.ComputeDomain, uses: list[ChannelUse], pods: list[DaemonPod], *,
         now: float = 1000.0, seen: Observed | None = None,
         templates: set[tuple[str, str]] = ALL_TEMPLATES) -> Any:
    return plan_domain(d, uses, pods, templates=templates, now=now, seen=seen or Observed(),
                       settings=SETTINGS)


def test_a_new_domain_gets_both_templates_and_nothing_else():
    p = plan(domain(), [], [], templates=set())
    assert [(t["metadata"]["namespace"], t["metadata"]["name"]) for t in p.templates] == [
        ("team", "ch"), ("gpudra-system", f"imex-{UID}")]
    assert (p.create_pods, p.delete_pods, p.status) == ([], [], cd.STATUS_NOT_READY)


@pytest.mark.parametrize(("num_nodes", "entries", "pods", "status"), [
    # numNodes 0: every node with a channel claim must be Ready.
    (0, {"a": "Ready", "b": "Ready"}, "ab", "Ready"),
    (0, {"a": "Ready", "b": "NotReady"}, "ab", "NotReady"),
    (0, {"a": "Ready"}, "ab", "NotReady"),
    # numNodes n: n Ready nodes suffice.
    (2, {"a": "Ready", "b": "Ready"}, "ab", "Ready"),
    (3, {"a": "Ready", "b": "Ready"}, "ab", "NotReady"),
    (1, {"a": "Ready", "b": "NotReady"}, "ab", "Ready"),
    # A Ready entry without a healthy pod does not count (a crashed daemon cannot say so).
    (2, {"a": "Ready", "b": "Ready"}, "a", "NotReady"),
])
def test_domain_status(num_nodes, entries, pods, status):
    p = plan(domain(num_nodes, entries), [use("a"), use("b")], [pod(n) for n in pods])
    assert p.status == status


def test_one_pod_per_node_created_and_strays_deleted():
    stray = pod("gone")
    p = plan(domain(), [use("a"), use("b"), use("b", claim="second")], [pod("a"), stray])
    assert [x["metadata"]["annotations"][objects.NODE_ANNOTATION] for x in p.create_pods] == ["b"]
    assert p.delete_pods == [stray.name]


def test_entries_of_nodes_that_left_are_pruned_once_their_pod_is_gone():
    d = domain(0, {"a": "Ready", "left": "Ready", "leaving": "Ready"})
    p = plan(d, [use("a")], [pod("a"), pod("leaving", deleting=True)])
    assert p.prune_nodes == ["left"]


@pytest.mark.parametrize(("entry", "the_pod", "ready", "failed", "reason"), [
    ("Ready", pod("a"), "True", "False", "DaemonReady"),
    ("NotReady", pod("a"), "False", "False", "WaitingForDaemon"),
    (None, pod("a", phase="Pending"), "False", "False", "WaitingForDaemon"),
    (None, None, "False", "False", "WaitingForDaemon"),
    ("Ready", pod("a", phase="Failed", failure="daemon pod failed: OOMKilled"), "False", "True",
     "DaemonFailed"),
    ("Ready", pod("a", failure="daemon container CrashLoopBackOff"), "False", "True",
     "DaemonFailed"),
])
def test_binding_conditions(entry, the_pod, ready, failed, reason):
    d = domain(0, {"a": entry} if entry else {})
    p = plan(d, [use("a")], [the_pod] if the_pod else [])
    got_ready, got_failed = p.conditions[use("a")]
    assert (got_ready.type, got_failed.type) == (cd.CONDITION_READY, cd.CONDITION_FAILED)
    assert ("True" if got_ready.status else "False", "True" if got_failed.status else "False",
            got_ready.reason) == (ready, failed, reason)
    if failed == "True":
        assert "node a" in got_failed.message and (the_pod.failure in got_failed.message)


def test_a_claim_of_another_namespace_does_not_join_the_domain():
    intruder = ChannelUse(ClaimKey("tenant-b", "steal", "u2"), UID, "n9",
                          DeviceKey(cd.DRIVER_NAME, "n9", "channel-0"))
    p = plan(domain(), [use("a"), intruder], [pod("a")])
    assert [x["metadata"]["annotations"][objects.NODE_ANNOTATION] for x in p.create_pods] == []
    assert "n9" not in p.nodes
    ready, failed = p.conditions[intruder]
    assert not ready.status and failed.status and failed.reason == "ForeignNamespace"
    assert "tenant-b/steal" in failed.message and "team/d" in failed.message


def test_not_ready_past_the_bound_fails_with_the_reason_and_before_it_asks_to_look_again():
    d = domain(0, {"a": "NotReady"})
    early = plan(d, [use("a")], [pod("a")], now=1050, seen=Observed({"a": 1000}))
    assert not early.conditions[use("a")][1].status
    assert early.recheck_at == 1100
    late = plan(d, [use("a")], [pod("a")], now=1100, seen=Observed({"a": 1000}))
    failed = late.conditions[use("a")][1]
    assert failed.status and "not Ready after 100s" in failed.message
    assert "reports NotReady" in failed.message


def test_a_failed_pod_is_replaced_only_after_the_restart_delay():
    failed = pod("a", phase="Failed", failure="daemon pod failed")
    kept = plan(domain(), [use("a")], [failed], now=1010, seen=Observed({}, {failed.name: 1000}))
    assert kept.delete_pods == [] and kept.recheck_at == 1030
    replaced = plan(domain(), [use("a")], [failed], now=1030,
                    seen=Observed({}, {failed.name: 1000}))
    assert replaced.delete_pods == [failed.name]


def test_daemon_pods_carry_the_priority_class_when_one_is_set():
    assert "priorityClassName" not in objects.daemon_pod(domain(), "n1", SETTINGS)["spec"]
    urgent = objects.Settings(namespace="ns", daemon_image="img",
                              daemon_priority_class="system-node-critical")
    assert objects.daemon_pod(domain(), "n1", urgent)["spec"]["priorityClassName"] == \
        "system-node-critical"


def test_nodes_of_several_domains_and_names_per_domain_and_node():
    assert objects.daemon_pod_name(UID, "n1") != objects.daemon_pod_name(OTHER, "n1")
    assert objects.daemon_pod_name(UID, "n1") != objects.daemon_pod_name(UID, "n2")
    long_node = "x" * 100 + ".example.com"
    made = objects.daemon_pod(domain(), long_node, SETTINGS)
    assert made["metadata"]["annotations"][objects.NODE_ANNOTATION] == long_node
    assert len(made["metadata"]["labels"][cd.LABEL_NODE]) <= 63
    assert read_pod(made, crash_restarts=3).node == long_node


def _claim(configs: list[dict], results: list[dict], devices: list[dict] | None = None) -> dict:
    return {"metadata": {"namespace": "team", "name": "c", "uid": "u"},
            "status": {"allocation": {"devices": {"results": results, "config": configs}},
                       "devices": devices or []}}


def _result(request: str, device: str, driver: str = cd.DRIVER_NAME) -> dict:
    return {"request": request, "driver": driver, "pool": "n1", "device": device}


def _config(uid: str, requests: list[str] | None = None, kind: str = "ComputeDomainChannelConfig"
            ) -> dict:
    params = {"apiVersion": cd.API_VERSION, "kind": kind, "domainID": uid}
    return {"source": "FromClaim", "requests": requests or [],
            "opaque": {"driver": cd.DRIVER_NAME, "parameters": params}}


@pytest.mark.parametrize(("configs", "results", "want"), [
    # A config without requests applies to every result of the driver.
    ([_config(UID)], [_result("ch", "channel-0")], [(UID, "channel-0")]),
    # Configs name their requests; "req" covers "req/sub".
    ([_config(UID, ["a"]), _config(OTHER, ["b"])],
     [_result("a/first", "channel-0"), _result("b", "channel-1")],
     [(UID, "channel-0"), (OTHER, "channel-1")]),
    # A daemon config, another driver's result, no config at all: no channel use.
    ([_config(UID, kind="ComputeDomainDaemonConfig")], [_result("d", "daemon-0")], []),
    ([_config(UID)], [_result("g", "gpu-0", driver="gpu.nvidia.com")], []),
    ([], [_result("ch", "channel-0")], []),
])
def test_reading_channel_uses_from_a_claim(configs, results, want):
    reading = read_claim(_claim(configs, results))
    assert [(u.domain_uid, u.device.device) for u in reading.uses] == want
    assert reading.problems == ()


def test_a_bad_channel_config_is_a_problem_naming_the_claim_and_field():
    bad = _config("not-a-uid")
    reading = read_claim(_claim([bad], [_result("ch", "channel-0")]))
    assert reading.uses == ()
    assert reading.problems and reading.problems[0].startswith(
        "claim team/c: status.allocation.devices.config[0].opaque.parameters: domainID")


def test_pod_failures_read_from_status():
    base = objects.daemon_pod(domain(), "n1", SETTINGS)
    crash = {**base, "status": {"phase": "Running", "containerStatuses": [{
        "name": "imex-daemon", "restartCount": 4,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                     "message": "peer 10.0.0.2 unreachable"}}}]}}
    read = read_pod(crash, crash_restarts=3)
    assert read is not None and "CrashLoopBackOff" in read.failure
    assert "code 1" in read.failure and "peer 10.0.0.2 unreachable" in read.failure
    restarts = {**base, "status": {"phase": "Running", "containerStatuses": [{
        "name": "imex-daemon", "restartCount": 3, "state": {"running": {}}}]}}
    assert "restarted 3 times" in read_pod(restarts, crash_restarts=3).failure
    assert read_pod(restarts, crash_restarts=0).failure == ""
    assert read_pod({"metadata": {"name": "x", "labels": {}}}, crash_restarts=3) is None


def test_conditions_keep_their_transition_time_while_unchanged():
    wanted = Condition(cd.CONDITION_READY, True, "DaemonReady", "m")
    before = {"type": cd.CONDITION_READY, "status": "True", "reason": "DaemonReady",
              "message": "old", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    assert condition_json(wanted, before, "2026-02-02T00:00:00Z")["lastTransitionTime"] == \
        "2026-01-01T00:00:00Z"
    flipped = {**before, "status": "False"}
    assert condition_json(wanted, flipped, "2026-02-02T00:00:00Z")["lastTransitionTime"] == \
        "2026-02-02T00:00:00Z"
    assert not same_conditions({cd.CONDITION_READY: before}, [wanted])  # message differs
    assert same_conditions({cd.CONDITION_READY: {**before, "message": "m"}}, [wanted])
