"""What the kubelet and the API server hand the daemon is checked at its edge: identifiers
before they reach a path (issue 27 item 1), every claim against its schema (item 5), through
the real ``gpudra node`` process over gRPC."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpudra.api.claims import ClaimRef
from gpudra.testing.fakeapi.hostile import deep_json, with_raw
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator, raw_claim, raw_claims
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import DRIVER, Daemon, claim_object
from tests.trust.conftest import cdi_specs, hardware, tree

GV = "resource.nvidia.com/v1beta1"
MPS = {"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
    "apiVersion": GV, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}}}


def stored(api: FakeApiServer, obj: dict[str, Any]) -> ClaimRef:
    meta = api.put(obj)["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def path_uids(victim: Path) -> list[str]:
    # Absolute, and relative to the daemon's MPS directory (enough ".." to reach "/").
    return [str(victim), "../" * 30 + str(victim).lstrip("/")]


async def test_a_path_shaped_uid_is_refused_and_touches_no_directory(
        kubelet: KubeletEmulator, node: Daemon, api: FakeApiServer, sentinel: Path) -> None:
    before, gpus = tree(sentinel), hardware(node)
    for uid in path_uids(sentinel / "victim"):
        # The API server agrees with the kubelet about the uid: only the daemon can refuse.
        obj = claim_object("evil", devices=["gpu-2"], configs=[MPS])
        obj["metadata"]["uid"] = uid
        api.serve_as_given("ResourceClaim", "evil", obj)
        entry = (await kubelet.prepare([ClaimRef("default", "evil", uid)]))[uid]
        assert "is not a lower-case RFC 4122 UUID" in entry["error"], entry
        assert entry["devices"] == []
        unprepared = (await kubelet.unprepare([ClaimRef("default", "evil", uid)]))[uid]
        assert "is not a lower-case RFC 4122 UUID" in unprepared["error"]
    api.forget_as_given()
    assert sim_daemons(sentinel) == []
    assert tree(sentinel) == before
    assert hardware(node) == gpus
    assert cdi_specs(node) == []


async def test_a_path_shaped_uid_from_the_api_server_alone_is_refused(
        kubelet: KubeletEmulator, node: Daemon, api: FakeApiServer, sentinel: Path) -> None:
    before = tree(sentinel)
    ref = stored(api, claim_object("liar", devices=["gpu-2"], configs=[MPS]))
    obj = api.get("ResourceClaim", "liar")
    assert obj is not None
    obj["metadata"]["uid"] = str(sentinel / "victim")
    api.serve_as_given("ResourceClaim", "liar", obj)
    entry = (await kubelet.prepare([ref]))[ref.uid]
    api.forget_as_given()
    assert "metadata.uid" in entry["error"] and "replaced" in entry["error"], entry
    assert tree(sentinel) == before
    assert cdi_specs(node) == []


@pytest.mark.parametrize(("field", "value", "message"), [
    ("namespace", "../../etc", "namespace '../../etc' is not a valid DNS label"),
    ("name", "a/b", "name 'a/b' is not a valid DNS subdomain"),
    ("name", "x" * 300, "name 'xxxx"),
    ("uid", "", "uid must not be empty"),
])
async def test_kubelet_fields_are_checked_before_the_api_server_is_asked(
        kubelet: KubeletEmulator, node: Daemon, api: FakeApiServer, field: str, value: str,
        message: str) -> None:
    fields = {"namespace": "default", "name": "fine",
              "uid": "0b0e3a9c-1d2e-4f30-8a4b-5c6d7e8f9a0b", field: value}
    gets = api.calls["get", "resourceclaims"]
    answer = await kubelet.send_raw("NodePrepareResources", raw_claims([raw_claim(**fields)]))
    assert answer.code == grpc.StatusCode.OK, answer
    [entry] = answer.claims.values()
    assert message in entry["error"], entry
    assert api.calls["get", "resourceclaims"] == gets  # refused before any GET


async def test_a_request_field_that_is_not_utf8_fails_only_that_call(
        kubelet: KubeletEmulator, node: Daemon) -> None:
    # protobuf refuses to parse it: the call fails as a whole (the kubelet, written in Go,
    # cannot send it); the daemon keeps serving.
    answer = await kubelet.send_raw("NodePrepareResources", raw_claims(
        [raw_claim("default", b"\xff\xfe", "x")]))
    assert answer.code != grpc.StatusCode.OK
    good = await kubelet.send_raw("NodeUnprepareResources", raw_claims(
        [raw_claim("default", "0b0e3a9c-1d2e-4f30-8a4b-5c6d7e8f9a0c", "x")]))
    assert good.code == grpc.StatusCode.OK


def _bad_claims(api: FakeApiServer) -> dict[str, tuple[bytes | dict[str, Any], str]]:
    """Claim name -> (body the API server sends, what the claim's error must say)."""
    base = claim_object("template", devices=["gpu-7"])

    def variant(name: str, change: Any) -> dict[str, Any]:
        obj = json.loads(json.dumps(base))
        obj["metadata"].update(name=name, uid=UIDS[name])
        change(obj)
        return obj

    def deep_config(name: str, driver: str) -> bytes:
        obj = variant(name, lambda o: None)
        obj["status"]["allocation"]["devices"]["config"] = [
            {"source": "FromClaim", "opaque": {"driver": driver, "parameters": {"x": 0}}}]
        return with_raw(obj, ("status", "allocation", "devices", "config", 0, "opaque",
                              "parameters", "x"), deep_json(1000))

    return {
        "results-string": (variant("results-string", lambda o: o["status"]["allocation"][
            "devices"].update(results="gpu-7")), "status.allocation.devices.results"),
        "config-string": (variant("config-string", lambda o: o["status"]["allocation"][
            "devices"].update(config="all")), "status.allocation.devices.config"),
        "status-string": (variant("status-string", lambda o: o.update(status="ready")),
                          "status"),
        "result-number": (variant("result-number", lambda o: o["status"]["allocation"][
            "devices"].update(results=[7])), "status.allocation.devices.results[0]"),
        "deep-other": (deep_config("deep-other", "other.example.com"),
                       "levels deep (at most 100) at "
                       "status.allocation.devices.config[0].opaque.parameters.x[0]"),
        "deep-mine": (deep_config("deep-mine", DRIVER),
                      "at status.allocation.devices.config[0].opaque.parameters.x[0]"),
        "meta-list": (variant("meta-list", lambda o: o.update(metadata=[])), "metadata"),
        "many-results": (variant("many-results", lambda o: o["status"]["allocation"][
            "devices"].update(results=o["status"]["allocation"]["devices"]["results"] * 33)),
            "status.allocation.devices.results"),
        "device-path": (variant("device-path", lambda o: o["status"]["allocation"][
            "devices"]["results"][0].update(device="../../gpu-7")),
            "status.allocation.devices.results[0].device"),
        "not-json": (b"{\"metadata\": ", "invalid JSON"),
        "admin-string": (variant("admin-string", lambda o: o["status"]["allocation"][
            "devices"]["results"][0].update(adminAccess="true")),
            "status.allocation.devices.results[0].adminAccess must be true or false"),
        "share-path": (variant("share-path", lambda o: o["status"]["allocation"][
            "devices"]["results"][0].update(shareID="../../x")),
            "results[0].shareID '../../x' is not a lower-case UUID"),
        "pod-path": (variant("pod-path", lambda o: o["status"].update(reservedFor=[
            {"resource": "pods", "name": "../../etc", "uid": "x"}])),
            "status.reservedFor[0].name '../../etc' is not a valid DNS subdomain"),
        "huge-device": (variant("huge-device", lambda o: o["status"]["allocation"][
            "devices"]["results"][0].update(device="g" * 1_000_000)),
            "status.allocation.devices.results[0].device has more than 1024 characters"),
    }


UIDS = {name: f"0b0e3a9c-1d2e-4f30-8a4b-{i:012x}" for i, name in enumerate([
    "results-string", "config-string", "status-string", "result-number", "deep-other",
    "deep-mine", "meta-list", "many-results", "device-path", "not-json", "admin-string",
    "share-path", "pod-path", "huge-device"])}


@pytest.mark.parametrize("calls", ["one call", "a call each"])
async def test_each_malformed_claim_gets_its_own_error_and_the_good_one_prepares(
        kubelet: KubeletEmulator, node: Daemon, api: FakeApiServer, calls: str) -> None:
    good_claim = claim_object(f"good-{calls.replace(' ', '-')}", devices=["gpu-6"])
    good_claim["metadata"]["annotations"] = {"big": "y" * 2_000_000}  # huge, yet valid
    good = stored(api, good_claim)
    bad = _bad_claims(api)
    for name, (body, _) in bad.items():
        api.serve_as_given("ResourceClaim", name, body)
    gpus = hardware(node)
    refs = [ClaimRef("default", name, UIDS[name]) for name in bad]
    try:
        if calls == "one call":
            response = await kubelet.prepare([*refs, good])
        else:
            response = {ref.uid: (await kubelet.prepare([ref]))[ref.uid]
                        for ref in [*refs, good]}
    finally:
        api.forget_as_given()
    try:
        assert response[good.uid]["error"] == "", response[good.uid]
        for ref in refs:
            error = response[ref.uid]["error"]
            assert error.startswith(f"claim default/{ref.name}:{ref.uid}: "), error
            assert bad[ref.name][1] in error, (ref.name, error)
            assert "RecursionError" not in error and "AttributeError" not in error
        assert cdi_specs(node) == [f"k8s.{DRIVER}-claim_{good.uid}.json"]
        assert hardware(node) == gpus
    finally:  # whatever the assertions say: the next test needs gpu-6
        assert (await kubelet.unprepare([good]))[good.uid]["error"] == ""


async def test_a_duplicate_uid_with_an_empty_name_prepares_nothing(
        kubelet: KubeletEmulator, node: Daemon, api: FakeApiServer) -> None:
    ref = stored(api, claim_object("dup", devices=["gpu-5"]))
    for claims in ([ref, ClaimRef(ref.namespace, "", ref.uid)],
                   [ClaimRef(ref.namespace, "", ref.uid), ref]):
        entry = (await kubelet.prepare(claims))[ref.uid]
        assert entry["error"] != "" and entry["devices"] == [], entry
        assert cdi_specs(node) == [], entry
