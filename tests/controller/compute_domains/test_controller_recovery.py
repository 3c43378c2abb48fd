"""The controller across its own restarts, expired watches and daemons that never get
Ready: nothing it made is left behind, nothing happening meanwhile is missed, and a node
that stays not Ready fails its claims with the reason instead of leaving them waiting."""

from __future__ import annotations

from pathlib import Path

from gpudra.api import compute_domain as cd
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.controller.compute_domains.harness import (
    DRIVER_NS,
    allocate_channel,
    condition,
    create_domain,
    daemon_pods,
    delete_domain,
    running,
    upsert_node_entry,
    wait_for,
)


def test_a_domain_deleted_while_the_controller_was_down_is_cleaned_up_at_its_start(
        api: FakeApiServer, tmp_path: Path) -> None:
    with running(api, tmp_path):
        domain = create_domain(api, "gone")
        uid = domain["metadata"]["uid"]
        allocate_channel(api, domain, "n1")
        allocate_channel(api, domain, "n2")
        wait_for("pods", lambda: len(daemon_pods(api, uid)) == 2)
        wait_for("daemon template", lambda: api.get("ResourceClaimTemplate", f"imex-{uid}",
                                                    DRIVER_NS))
    api.delete("ComputeDomain", "gone", "team")  # no controller to see it
    assert len(daemon_pods(api, uid)) == 2
    with running(api, tmp_path, identity="controller-b"):
        wait_for("everything the domain made gone", lambda: not daemon_pods(api, uid) and
                 api.get("ResourceClaimTemplate", f"imex-{uid}", DRIVER_NS) is None)


def test_changes_during_an_expired_watch_are_not_missed(api: FakeApiServer,
                                                        tmp_path: Path) -> None:
    with running(api, tmp_path):
        domain = create_domain(api, "relist")
        uid = domain["metadata"]["uid"]
        wait_for("template", lambda: api.get("ResourceClaimTemplate", "relist-channel", "team"))
        api.expire_watches()
        api.close_watches()
        claim = allocate_channel(api, domain, "n1")
        wait_for("the pod, after listing again", lambda: list(daemon_pods(api, uid)) == ["n1"])
        upsert_node_entry(api, domain, "n1", status="Ready")
        wait_for("ready", lambda: (condition(api, claim, cd.CONDITION_READY) or {})
                 .get("status") == "True")


def test_a_node_never_ready_fails_its_claims_with_the_reason(api: FakeApiServer,
                                                             tmp_path: Path) -> None:
    with running(api, tmp_path, extra=("--ready-timeout", "0.3s")):
        domain = create_domain(api, "stuck")
        claim = allocate_channel(api, domain, "n1")
        upsert_node_entry(api, domain, "n1", status="NotReady")
        failed = wait_for("the failure condition", lambda: (
            c := condition(api, claim, cd.CONDITION_FAILED)) and c["status"] == "True" and c)
        assert "not Ready after 0.3s" in failed["message"]
        assert "reports NotReady" in failed["message"]
        # The daemon recovers: the claim says so (for a pod still waiting to bind).
        upsert_node_entry(api, domain, "n1", status="Ready")
        wait_for("ready again", lambda: (condition(api, claim, cd.CONDITION_READY) or {})
                 .get("status") == "True" and (condition(api, claim, cd.CONDITION_FAILED)
                                               or {}).get("status") == "False")


def test_a_crash_looping_daemon_fails_its_claim_and_unready_its_domain(
        api: FakeApiServer, tmp_path: Path) -> None:
    with running(api, tmp_path):
        domain = create_domain(api, "loop")
        uid = domain["metadata"]["uid"]
        claim = allocate_channel(api, domain, "n1")
        pod = wait_for("pod", lambda: daemon_pods(api, uid).get("n1"))
        upsert_node_entry(api, domain, "n1", status="Ready")
        wait_for("Ready", lambda: ((api.get("ComputeDomain", "loop", "team") or {})
                                   .get("status") or {}).get("status") == "Ready")
        api.modify("Pod", pod["metadata"]["name"], {"status": {
            "phase": "Running", "containerStatuses": [{
                "name": "imex-daemon", "restartCount": 5, "ready": False, "image": "x",
                "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                             "message": "peer 10.0.0.2 unreachable"}}}]}},
            DRIVER_NS)
        failed = wait_for("failure", lambda: (
            c := condition(api, claim, cd.CONDITION_FAILED)) and c["status"] == "True" and c)
        assert "CrashLoopBackOff" in failed["message"] and "unreachable" in failed["message"]
        wait_for("NotReady", lambda: ((api.get("ComputeDomain", "loop", "team") or {})
                                      .get("status") or {}).get("status") == "NotReady")


def test_a_domain_made_again_under_its_name_gets_its_own_template(api: FakeApiServer,
                                                                  tmp_path: Path) -> None:
    with running(api, tmp_path):
        first = create_domain(api, "again")
        wait_for("first template", lambda: api.get("ResourceClaimTemplate", "again-channel",
                                                    "team"))
        delete_domain(api, "again")
        second = create_domain(api, "again")
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        template = wait_for("the new domain's template", lambda: (
            t := api.get("ResourceClaimTemplate", "again-channel", "team")) and
            t["metadata"]["labels"][cd.LABEL_DOMAIN] == second["metadata"]["uid"] and t)
        params = template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
        assert params["domainID"] == second["metadata"]["uid"]


def test_a_template_name_taken_by_someone_else_is_left_alone_until_freed(
        api: FakeApiServer, tmp_path: Path) -> None:
    theirs = api.put({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                      "metadata": {"name": "taken-channel", "namespace": "team"},
                      "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                          "deviceClassName": "gpu.nvidia.com"}}]}}}})
    with running(api, tmp_path) as proc:
        domain = create_domain(api, "taken")
        uid = domain["metadata"]["uid"]
        wait_for("the daemon template", lambda: api.get("ResourceClaimTemplate", f"imex-{uid}",
                                                        DRIVER_NS))
        wait_for("the refusal logged", lambda: "not touching it" in proc.output())
        assert api.get("ResourceClaimTemplate", "taken-channel", "team") == theirs
        api.delete("ResourceClaimTemplate", "taken-channel", "team")
        wait_for("the domain's own template", lambda: (
            t := api.get("ResourceClaimTemplate", "taken-channel", "team")) and
            t["metadata"].get("labels", {}).get(cd.LABEL_DOMAIN) == uid)
