"""The stand-in serves resource.k8s.io as 1.32 (v1beta1), 1.33 (v1beta2 + v1beta1) and 1.34+
(v1 + both betas) do: discovery, shapes, and the fields each release does not know."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from typing import Any

import kubernetes.client as k8s
import pytest

from gpudra.testing.fakeapi import FakeApiServer, samples

Obj = dict[str, Any]


@dataclass
class Answer:
    status_code: int
    headers: Message
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class Http:
    """Plain HTTP to the stand-in, to see exactly what goes over the wire."""

    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, method: str, path: str, body: Any = None,
             content_type: str = "application/json") -> Answer:
        data = None if body is None else (body if isinstance(body, bytes)
                                          else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return Answer(response.status, response.headers, response.read().decode())
        except urllib.error.HTTPError as error:
            return Answer(error.code, error.headers, error.read().decode())

    def get(self, path: str) -> Answer:
        return self.call("GET", path)

    def post(self, path: str, json: Any) -> Answer:
        return self.call("POST", path, json)

    def lines(self, path: str) -> list[Any]:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return [json.loads(line) for line in response if line.strip()]


@pytest.fixture(params=["v1", "v1beta2", "v1beta1"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def api(mode: str) -> Iterator[FakeApiServer]:
    with FakeApiServer(resource_api=mode) as server:
        yield server


@pytest.fixture
def http(api: FakeApiServer) -> Http:
    return Http(api.url)


SERVED = {"v1": ["v1", "v1beta2", "v1beta1"], "v1beta2": ["v1beta2", "v1beta1"],
          "v1beta1": ["v1beta1"]}
MINOR = {"v1": "37", "v1beta2": "33", "v1beta1": "32"}


def test_discovery_lists_the_served_versions_preferred_first(api, mode):
    client = k8s.ApiClient(api.configuration())
    try:
        assert k8s.VersionApi(client).get_code().minor == MINOR[mode]
        groups = {g.name: g for g in k8s.ApisApi(client).get_api_versions().groups}
        group = groups["resource.k8s.io"]
        assert [v.version for v in group.versions] == SERVED[mode]
        assert group.preferred_version.version == mode
    finally:
        client.close()  # type: ignore[no-untyped-call]


def test_a_version_not_served_is_not_found(http, mode):
    for version in ("v1", "v1beta2", "v1beta1", "v1alpha3"):
        answer = http.get(f"/apis/resource.k8s.io/{version}/resourceslices")
        assert answer.status_code == (200 if version in SERVED[mode] else 404), version
        resources = http.get(f"/apis/resource.k8s.io/{version}")
        assert resources.status_code == (200 if version in SERVED[mode] else 404)
        if version in SERVED[mode]:
            names = {r["name"] for r in resources.json()["resources"]}
            assert {"resourceslices", "resourceclaims", "resourceclaims/status",
                    "deviceclasses", "resourceclaimtemplates"} <= names
            assert ("devicetaintrules" in names) == (version == "v1")


def _beta1_device(name: str) -> Obj:
    plain = samples.device(name)
    return {"name": name, "basic": {k: v for k, v in plain.items() if k != "name"}}


def test_a_v1beta1_slice_is_stored_flat_and_read_back_in_every_version(api, http, mode):
    body = samples.resource_slice(devices=[_beta1_device("gpu-0")])
    body["apiVersion"] = "resource.k8s.io/v1beta1"
    created = http.post("/apis/resource.k8s.io/v1beta1/resourceslices", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["apiVersion"] == "resource.k8s.io/v1beta1"
    assert created.json()["spec"]["devices"] == [_beta1_device("gpu-0")]
    assert created.headers.get("Warning") is None
    # Stored in the v1 shape, read in the shape of the version asked for.
    assert api.get("ResourceSlice", "node-1-gpu")["spec"]["devices"] == [
        samples.device("gpu-0")]
    for version in SERVED[mode]:
        read = http.get(f"/apis/resource.k8s.io/{version}/resourceslices/node-1-gpu").json()
        assert read["apiVersion"] == f"resource.k8s.io/{version}"
        expected = _beta1_device("gpu-0") if version == "v1beta1" else samples.device("gpu-0")
        assert read["spec"]["devices"] == [expected]
        listed = http.get(f"/apis/resource.k8s.io/{version}/resourceslices").json()
        assert listed["apiVersion"] == f"resource.k8s.io/{version}"
        assert listed["items"][0]["spec"]["devices"] == [expected]
    assert api.pruned == []


def test_a_v1beta1_claim_request_is_exactly_in_v1(api, http):
    claim = samples.claim()
    request = claim["spec"]["devices"]["requests"][0]
    flat = {"name": request["name"], **request["exactly"]}
    body = {**claim, "apiVersion": "resource.k8s.io/v1beta1",
            "spec": {"devices": {"requests": [flat]}}}
    created = http.post("/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaims",
                        json=body)
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["devices"]["requests"] == [flat]
    assert api.get("ResourceClaim", "claim-1", "default")["spec"]["devices"]["requests"] == [
        request]


def test_the_beta_releases_drop_what_they_do_not_know_with_a_warning(api, http, mode):
    tainted = samples.device("gpu-0", taints=[{"key": "gpu.nvidia.com/xid", "effect":
                                               "NoSchedule"}])
    body = samples.resource_slice(devices=[tainted])
    version = SERVED[mode][0]
    body["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1":
        body["spec"]["devices"] = [{"name": "gpu-0", "basic": {
            k: v for k, v in tainted.items() if k != "name"}}]
    created = http.post(f"/apis/resource.k8s.io/{version}/resourceslices", json=body)
    assert created.status_code == 201, created.text  # never rejected
    stored = api.get("ResourceSlice", "node-1-gpu")["spec"]["devices"][0]
    if mode == "v1":
        assert stored["taints"][0]["key"] == "gpu.nvidia.com/xid"
        assert api.pruned == [] and created.headers.get("Warning") is None
        return
    assert "taints" not in stored
    where = ("spec.devices[0].basic.taints" if version == "v1beta1"
             else "spec.devices[0].taints")
    assert api.pruned == [("resourceslices", "node-1-gpu", where)]
    assert where in created.headers["Warning"]


def test_a_merge_patch_is_made_against_the_version_asked_for(api, http, mode):
    api.put(samples.resource_slice(devices=[samples.device("gpu-0")]))
    patch = {"spec": {"devices": [_beta1_device("gpu-1")]}}
    answer = http.call("PATCH", "/apis/resource.k8s.io/v1beta1/resourceslices/node-1-gpu",
                       patch, "application/merge-patch+json")
    assert answer.status_code == 200, answer.text
    assert answer.json()["spec"]["devices"] == [_beta1_device("gpu-1")]
    assert api.get("ResourceSlice", "node-1-gpu")["spec"]["devices"] == [
        samples.device("gpu-1")]


def test_a_watch_of_a_beta_version_sends_its_shape(api, http):
    api.put(samples.resource_slice(devices=[samples.device("gpu-0")]))
    events = http.lines("/apis/resource.k8s.io/v1beta1/resourceslices?watch=true"
                        "&resourceVersion=1&timeoutSeconds=1")
    assert events[0]["type"] == "ADDED"
    assert events[0]["object"]["apiVersion"] == "resource.k8s.io/v1beta1"
    assert events[0]["object"]["spec"]["devices"] == [_beta1_device("gpu-0")]


def test_shown_as_reads_a_stored_object_as_a_version_does(api):
    stored = api.put(samples.resource_slice(devices=[samples.device("gpu-0")]))
    assert api.shown_as("v1beta1", stored)["spec"]["devices"] == [_beta1_device("gpu-0")]


@pytest.mark.parametrize("mode", ["v1beta2", "v1beta1"])
def test_strict_field_validation_refuses_what_the_release_does_not_know(api, http, mode):
    version = SERVED[mode][0]
    device = samples.device("gpu-0", allowMultipleAllocations=True)
    if version == "v1beta1":
        device = {"name": "gpu-0", "basic": {k: v for k, v in device.items() if k != "name"}}
    body = {**samples.resource_slice(devices=[device]),
            "apiVersion": f"resource.k8s.io/{version}"}
    answer = http.post(f"/apis/resource.k8s.io/{version}/resourceslices"
                       "?fieldValidation=Strict", body)
    assert answer.status_code == 400
    assert "allowMultipleAllocations" in answer.json()["message"]
    assert api.list("ResourceSlice") == [] and api.pruned == []
