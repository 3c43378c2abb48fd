"""Typed API errors, over real HTTP to the test API server.

Each answer a caller acts on arrives as its own class (``NotFound``, ``Conflict``, ``Gone``,
``Invalid``; ``Unreachable`` without an answer, ``BadAnswer`` for a success that is not a JSON
object), keeps the server's status, reason and message, and is counted once in
``gpudra_api_calls`` with its outcome.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from gpudra.kube.errors import (
    ApiCallError,
    BadAnswer,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    Unreachable,
    api_error,
)
from gpudra.kube.raw_api import NODES, RESOURCE_CLAIMS, RESOURCE_SLICES, RawApi
from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi import samples
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.kube.stalling_server import client_of, http_answer

TYPED = (Unreachable, BadAnswer, NotFound, Conflict, Gone, Invalid)


def calls(verb: str, resource: str, outcome: str) -> float:
    return REGISTRY.get_sample_value(
        "gpudra_api_calls_total", {"verb": verb, "resource": resource, "outcome": outcome},
    ) or 0.0


@pytest.fixture
def api(api_session: ApiSession) -> RawApi:
    return RawApi(api_session, timeout=2.0)


@pytest.mark.parametrize(("status", "kind"), [
    (0, Unreachable), (400, Invalid), (404, NotFound), (409, Conflict), (410, Gone),
    (422, Invalid), (429, ApiCallError), (500, ApiCallError), (503, ApiCallError),
])
def test_the_factory_picks_the_class_by_status(status, kind):
    error = api_error("get", "nodes", "node-a", status=status, reason="R", message="m")
    assert type(error) is kind
    assert (error.status, error.reason, error.message) == (status, "R", "m")


async def test_a_missing_object_is_not_found_and_counted_once(api: RawApi):
    before = calls("get", "nodes", "not_found"), calls("get", "nodes", "ok")
    with pytest.raises(NotFound) as caught:
        await api.get(NODES, "node-x")
    error = caught.value
    assert (error.verb, error.resource, error.name, error.status) == (
        "get", "nodes", "node-x", 404)
    assert error.reason == "NotFound" and 'nodes "node-x" not found' in error.message
    assert str(error).startswith("get nodes/node-x: HTTP 404 NotFound: ")
    assert (calls("get", "nodes", "not_found"), calls("get", "nodes", "ok")) == (
        before[0] + 1, before[1])


async def test_creating_what_exists_and_writing_a_stale_version_conflict(
        api: RawApi, fake_api: FakeApiServer):
    created = await api.create(RESOURCE_SLICES, samples.resource_slice(devices=[]))
    before = calls("create", "resourceslices", "conflict")
    with pytest.raises(Conflict) as exists:
        await api.create(RESOURCE_SLICES, samples.resource_slice(devices=[]))
    assert exists.value.reason == "AlreadyExists"
    assert calls("create", "resourceslices", "conflict") == before + 1
    fake_api.modify("ResourceSlice", "node-1-gpu", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(Conflict) as stale:
        await api.replace(RESOURCE_SLICES, "node-1-gpu", created)  # the old resourceVersion
    assert stale.value.verb == "update" and stale.value.name == "node-1-gpu"
    with pytest.raises(Conflict):
        await api.delete(RESOURCE_SLICES, "node-1-gpu", preconditions={"uid": "someone-else"})
    assert fake_api.get("ResourceSlice", "node-1-gpu") is not None


async def test_deleting_what_is_gone_is_not_found(api: RawApi):
    with pytest.raises(NotFound) as caught:
        await api.delete(RESOURCE_SLICES, "never-there")
    assert caught.value.verb == "delete"


async def test_an_object_the_server_rejects_is_invalid(api: RawApi):
    bad = samples.resource_slice(devices=[samples.device("GPU 0 (bad name)")])
    before = calls("create", "resourceslices", "invalid")
    with pytest.raises(Invalid) as caught:
        await api.create(RESOURCE_SLICES, bad)
    assert caught.value.status == 422 and caught.value.reason == "Invalid"
    assert "spec.devices[0].name" in caught.value.message
    assert calls("create", "resourceslices", "invalid") == before + 1


async def test_an_expired_version_is_gone(api: RawApi, fake_api: FakeApiServer):
    fake_api.fail_next(1, status=410, verb="list", message="too old resource version: 1 (5)")
    before = calls("list", "resourceslices", "expired")
    with pytest.raises(Gone) as caught:
        await api.list(RESOURCE_SLICES)
    assert caught.value.message == "too old resource version: 1 (5)"
    assert calls("list", "resourceslices", "expired") == before + 1


@pytest.mark.parametrize(("status", "outcome"), [(429, "throttled"), (503, "server_error"),
                                                 (403, "error")])
async def test_other_statuses_are_plain_errors_with_their_retry_after(
        api: RawApi, fake_api: FakeApiServer, status, outcome):
    fake_api.fail_next(1, status=status, verb="get", retry_after=3)
    before = calls("get", "nodes", outcome)
    with pytest.raises(ApiCallError) as caught:
        await api.get(NODES, "node-a")
    assert not isinstance(caught.value, TYPED)
    assert caught.value.status == status
    assert caught.value.retry_after == (3.0 if status in (429, 503) else None)
    assert calls("get", "nodes", outcome) == before + 1


async def test_a_dropped_connection_is_unreachable(api: RawApi, fake_api: FakeApiServer):
    # A fresh connection the server drops is not resent (only a stale pooled one is:
    # tests/kube/test_http_client.py), so one drop is the caller's to see.
    fake_api.drop_next(1, verb="list")
    before = calls("list", "resourceslices", "unreachable")
    with pytest.raises(Unreachable) as caught:
        await api.list(RESOURCE_SLICES)
    assert caught.value.status == 0 and caught.value.outcome == "unreachable"
    assert calls("list", "resourceslices", "unreachable") == before + 1


async def test_a_slow_server_is_unreachable_within_the_deadline(
        api_session: ApiSession, fake_api: FakeApiServer):
    fake_api.delay(2.0, verb="get")
    api = RawApi(api_session, timeout=0.3)
    before = calls("get", "nodes", "timeout")
    started = time.monotonic()
    with pytest.raises(Unreachable) as caught:
        await api.get(NODES, "node-a")
    assert time.monotonic() - started < 1.5
    assert caught.value.reason == "Timeout" and caught.value.message == "no answer within 0.3s"
    assert calls("get", "nodes", "timeout") == before + 1


async def test_a_body_that_stalls_is_cut_off_by_the_same_deadline():
    # Headers arrive at once, then 20 of the promised 4000 bytes and silence.
    async with client_of(http_answer(b'{"kind": "Node", "me', length=4000)) as client:
        api = RawApi(client, timeout=0.3)
        before = calls("get", "nodes", "timeout"), calls("get", "nodes", "ok")
        started = time.monotonic()
        with pytest.raises(Unreachable) as caught:
            await api.get(NODES, "node-a")
        assert time.monotonic() - started < 1.5
    assert caught.value.reason == "Timeout"
    assert (calls("get", "nodes", "timeout"), calls("get", "nodes", "ok")) == (
        before[0] + 1, before[1])


@pytest.mark.parametrize(("body", "message"), [
    (b"<html>proxy error</html>", "the server answered with invalid JSON"),
    (b"[1, 2]", "expected an object, got list"),
])
async def test_a_success_that_is_not_an_object_is_a_bad_answer(body, message):
    async with client_of(http_answer(body)) as client:
        before = calls("get", "nodes", "bad_answer")
        with pytest.raises(BadAnswer) as caught:
            await RawApi(client).get(NODES, "node-a")
    assert caught.value.message == message and caught.value.status == 200
    assert calls("get", "nodes", "bad_answer") == before + 1


# --- namespaced resources --------------------------------------------------------------------

async def test_claims_are_read_and_written_in_their_namespace(
        api: RawApi, fake_api: FakeApiServer):
    created = await api.create(RESOURCE_CLAIMS, samples.claim("c1", "team-a"),
                               namespace="team-a")
    assert created["metadata"]["namespace"] == "team-a"
    got = await api.get(RESOURCE_CLAIMS, "c1", namespace="team-a")
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    got["metadata"]["labels"] = {"a": "b"}
    replaced = await api.replace(RESOURCE_CLAIMS, "c1", got, namespace="team-a")
    assert replaced["metadata"]["labels"] == {"a": "b"}
    listed = await api.list(RESOURCE_CLAIMS, namespace="team-a")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["c1"]
    with pytest.raises(NotFound) as elsewhere:
        await api.get(RESOURCE_CLAIMS, "c1", namespace="team-b")
    assert elsewhere.value.name == "team-b/c1"
    assert str(elsewhere.value).startswith("get resourceclaims/team-b/c1: HTTP 404 NotFound")
    await api.delete(RESOURCE_CLAIMS, "c1", namespace="team-a")
    assert fake_api.get("ResourceClaim", "c1", "team-a") is None
    paths = [r.path for r in fake_api.requests if r.resource == "resourceclaims"]
    assert set(paths) == {"/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims",
                          "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c1",
                          "/apis/resource.k8s.io/v1/namespaces/team-b/resourceclaims/c1"}


def test_paths_quote_names_and_refuse_a_missing_or_needless_namespace():
    assert RESOURCE_CLAIMS.item("a b", "ns/x") == (
        "/apis/resource.k8s.io/v1/namespaces/ns%2Fx/resourceclaims/a%20b")
    assert RESOURCE_CLAIMS.collection() == "/apis/resource.k8s.io/v1/resourceclaims"
    assert NODES.item("node-a") == "/api/v1/nodes/node-a"
    with pytest.raises(ValueError, match="resourceclaims are namespaced"):
        RESOURCE_CLAIMS.item("c1")
    with pytest.raises(ValueError, match="nodes are cluster-scoped"):
        NODES.item("node-a", "default")
