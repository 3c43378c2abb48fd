"""Claim GETs through the Kubernetes layer, over real HTTP to the test API server.

Every GET is counted in ``gpudra_api_calls``; every failure is one ``ClaimFetchError`` that
names the claim as ``ns/name:uid`` and the API server, in words ``error_reason`` sorts; one
deadline covers headers and body. A claim that was replaced (another uid) is an error for
that claim alone, through a real Preparer on a simulated node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpudra.api.claims import ClaimRef
from gpudra.driver.claims import ClaimError
from gpudra.driver.metrics import error_reason
from gpudra.kube.errors import ApiCallError
from gpudra.kube.session import ApiSession
from gpudra.kubeletplugin.claims.claim_fetcher import ClaimFetcher, ClaimFetchError
from gpudra.kubeletplugin.claims.preparer import Preparer
from gpudra.testing.fakeapi import samples
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.driver.node_fixture import DRIVER, SimNode, start_node
from tests.fakeapi.fixtures import api_session, fake_api  # noqa: F401
from tests.integration.daemon import claim_object
from tests.kube.stalling_server import client_of, http_answer

UID = "00000000-0000-4000-8000-0000000000aa"


def claim_gets(outcome: str) -> float:
    return REGISTRY.get_sample_value("gpudra_api_calls_total", {
        "verb": "get", "resource": "resourceclaims", "outcome": outcome}) or 0.0


@pytest.fixture
def fetcher(api_session: ApiSession) -> ClaimFetcher:  # noqa: F811
    return ClaimFetcher(api_session, timeout=2.0)


async def fetch(fetcher: ClaimFetcher, how: str, namespace: str, name: str,
                uid: str = UID) -> Mapping[str, Any]:
    """The claim, or its ClaimFetchError raised: alone (``fetch``) or as one of a call's
    claims (``fetch_all``, what a kubelet call uses)."""
    if how == "fetch":
        return await fetcher.fetch(namespace, name, uid)
    [result] = await fetcher.fetch_all([(namespace, name, uid)])
    if isinstance(result, ClaimError):
        raise result
    return result


HOW = pytest.mark.parametrize("how", ["fetch", "fetch_all"])


@HOW
async def test_a_claim_arrives_as_raw_json_and_the_get_is_counted(
        fetcher: ClaimFetcher, fake_api: FakeApiServer, how: str):  # noqa: F811
    stored = samples.claim("c1", "team-a")
    stored["spec"]["devices"]["futureField"] = {"kept": True}  # unknown to client models
    fake_api.put(stored)
    before = claim_gets("ok")
    claim = await fetch(fetcher, how, "team-a", "c1")
    assert claim["metadata"]["name"] == "c1"
    assert claim["spec"]["devices"]["futureField"] == {"kept": True}
    assert claim_gets("ok") == before + 1
    assert [r.path for r in fake_api.requests] == [
        "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c1"]


@HOW
async def test_a_missing_claim_is_not_found_in_the_api_server(fetcher: ClaimFetcher, how: str):
    before = claim_gets("not_found")
    with pytest.raises(ClaimFetchError) as caught:
        await fetch(fetcher, how, "default", "nope")
    message = str(caught.value)
    assert message == f"claim default/nope:{UID}: not found in the API server"
    assert error_reason(message) == "claim_not_found"
    assert isinstance(caught.value.__cause__, ApiCallError)
    assert claim_gets("not_found") == before + 1


@HOW
@pytest.mark.parametrize(("status", "outcome"), [(503, "server_error"), (403, "error"),
                                                 (429, "throttled")])
async def test_an_error_status_names_the_claim_status_and_api_server(
        fetcher: ClaimFetcher, fake_api: FakeApiServer, status, outcome, how):  # noqa: F811
    fake_api.fail_next(1, status=status, verb="get", resource="resourceclaims",
                       message="go away")
    before = claim_gets(outcome)
    with pytest.raises(ClaimFetchError) as caught:
        await fetch(fetcher, how, "default", "c1")
    message = str(caught.value)
    assert message == f"claim default/c1:{UID}: API error {status} from the API server: go away"
    assert error_reason(message) == "api_error"
    assert claim_gets(outcome) == before + 1


@HOW
async def test_no_answer_says_the_api_server_cannot_be_reached(
        fetcher: ClaimFetcher, fake_api: FakeApiServer, how: str):  # noqa: F811
    # A fresh connection the server drops is not resent (only a stale pooled one is:
    # tests/kube/test_http_client.py), so one drop is the caller's to see.
    fake_api.drop_next(1, verb="get")
    before = claim_gets("unreachable")
    with pytest.raises(ClaimFetchError) as caught:
        await fetch(fetcher, how, "default", "c1")
    assert str(caught.value).startswith(f"claim default/c1:{UID}: cannot reach the API server: ")
    assert error_reason(str(caught.value)) == "api_error"
    assert claim_gets("unreachable") == before + 1


@HOW
async def test_slow_headers_end_at_the_deadline(
        api_session: ApiSession, fake_api: FakeApiServer, how: str):  # noqa: F811
    fake_api.put(samples.claim("c1"))
    fake_api.delay(2.0, verb="get", resource="resourceclaims")
    before = claim_gets("timeout")
    started = time.monotonic()
    with pytest.raises(ClaimFetchError) as caught:
        await fetch(ClaimFetcher(api_session, timeout=0.3), how, "default", "c1")
    assert time.monotonic() - started < 1.5
    assert str(caught.value) == (
        f"claim default/c1:{UID}: cannot reach the API server: no answer within 0.3s")
    assert claim_gets("timeout") == before + 1


@HOW
async def test_a_stalled_body_ends_at_the_same_deadline(how: str):
    async with client_of(http_answer(b'{"kind": "ResourceClaim"', length=9000)) as client:
        started = time.monotonic()
        with pytest.raises(ClaimFetchError) as caught:
            await fetch(ClaimFetcher(client, timeout=0.3), how, "default", "c1")
        assert time.monotonic() - started < 1.5
    assert "no answer within 0.3s" in str(caught.value)


@HOW
async def test_a_body_that_is_not_a_claim_is_a_bad_answer(how: str):
    async with client_of(http_answer(b"<html>a proxy's login page</html>")) as client:
        with pytest.raises(ClaimFetchError) as caught:
            await fetch(ClaimFetcher(client), how, "default", "c1")
    assert str(caught.value) == (f"claim default/c1:{UID}: bad answer from the API server: "
                                 "the server answered with invalid JSON")
    assert error_reason(str(caught.value)) == "api_error"


async def test_fetch_all_keeps_order_and_gives_each_claim_its_own_error(
        fetcher: ClaimFetcher, fake_api: FakeApiServer):  # noqa: F811
    fake_api.put(samples.claim("a"))
    fake_api.put(samples.claim("b"))
    results = await fetcher.fetch_all([("default", "a", "u-a"), ("default", "gone", "u-g"),
                                       ("default", "b", "u-b")])
    first, missing, last = results
    assert not isinstance(first, ClaimError) and first["metadata"]["name"] == "a"
    assert not isinstance(last, ClaimError) and last["metadata"]["name"] == "b"
    assert isinstance(missing, ClaimFetchError)
    assert str(missing) == "claim default/gone:u-g: not found in the API server"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    node = start_node(tmp_path / "node")
    try:
        yield node
    finally:
        node.close()


async def test_a_missing_or_replaced_claim_fails_alone_naming_the_claim(
        node: SimNode, fake_api: FakeApiServer, api_session: ApiSession):  # noqa: F811
    good = fake_api.put(claim_object("good", devices=["gpu-0"]))["metadata"]
    replaced = fake_api.put(claim_object("replaced", devices=["gpu-1"]))["metadata"]
    refs = [ClaimRef(namespace=good["namespace"], name="good", uid=good["uid"]),
            ClaimRef(namespace="default", name="gone", uid=UID),
            # The kubelet still knows the claim by the uid it had before it was replaced.
            ClaimRef(namespace=replaced["namespace"], name="replaced", uid=UID)]
    preparer = Preparer(driver=DRIVER, fetcher=ClaimFetcher(api_session, timeout=2.0),
                        state=node.state, loop=asyncio.get_running_loop())
    outcomes = await asyncio.to_thread(preparer.prepare, refs)
    assert outcomes[good["uid"]].error is None
    assert outcomes[UID].error is not None  # both others share the uid: the last one wins
    gone = (await asyncio.to_thread(preparer.prepare, refs[1:2]))[UID].error
    assert gone == f"claim default/gone:{UID}: not found in the API server"
    other = (await asyncio.to_thread(preparer.prepare, refs[2:]))[UID].error
    assert other is not None and other.startswith(f"claim default/replaced:{UID}: the claim "
                                                   "was replaced")
    assert replaced["uid"] in other
    assert node.state.prepared_many([UID]) == {}
