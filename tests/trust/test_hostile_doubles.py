"""The test doubles' hostile modes do what the trust tests rely on: the API stand-in serves
a body exactly as given, the kubelet emulator writes any claim fields on the wire."""

from __future__ import annotations

import json
import urllib.request

import pytest

from gpudra.api.proto import dra_v1_pb2
from gpudra.testing.fakeapi.hostile import deep_json, with_raw
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import raw_claim, raw_claims

PATH = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c"


def get(api: FakeApiServer, path: str = PATH) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(api.url + path, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def test_a_body_is_served_exactly_as_given_and_forgotten(api: FakeApiServer) -> None:
    assert get(api)[0] == 404
    for body in (b"\x00not json{", deep_json(3000).encode(), b"x" * 2_000_000):
        api.serve_as_given("ResourceClaim", "c", body)
        assert get(api) == (200, body)
    claim = {"metadata": {"uid": "/etc", "name": 7}, "status": "ready"}
    api.serve_as_given("ResourceClaim", "c", claim)  # no defaults, no validation
    assert json.loads(get(api)[1]) == claim
    assert api.calls["get", "resourceclaims"] == 5
    api.forget_as_given()
    assert get(api)[0] == 404
    assert api.list("ResourceClaim") == []  # nothing was stored


def test_with_raw_splices_json_deeper_than_json_dumps_can_write() -> None:
    body = with_raw({"a": {"b": [0]}}, ("a", "b", 0), deep_json(5000, kind="{"))
    assert body.startswith(b'{"a":{"b":[{"a":{"a":') and body.count(b"{") == 5002


def test_raw_claims_are_claims_on_the_wire_whatever_they_hold() -> None:
    request = raw_claims([raw_claim("ns", "uid-1", "name"), raw_claim("", "../x", "a" * 300)])
    parsed = dra_v1_pb2.NodePrepareResourcesRequest.FromString(request)
    assert [(c.namespace, c.uid, c.name) for c in parsed.claims] == [
        ("ns", "uid-1", "name"), ("", "../x", "a" * 300)]
    # an unknown field is kept by the parser, not an error
    unknown = raw_claims([raw_claim("ns", "u", "n", extra=b"\x22\x03abc")])
    assert dra_v1_pb2.NodePrepareResourcesRequest.FromString(unknown).claims[0].uid == "u"
