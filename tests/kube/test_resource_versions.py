"""The Kubernetes layer speaks the resource.k8s.io version the server serves: the choice
(discovery, preference, pinning, errors), and every call shape through real HTTP to the
stand-in as 1.32, 1.33 and 1.34+, converted to and from v1's shape."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpudra.kube.errors import ApiCallError, NotFound
from gpudra.kube.raw_api import RESOURCE_CLAIMS, RESOURCE_SLICES, RawApi
from gpudra.kube.resource_versions import (
    NEWER_FEATURES,
    ResourceApi,
    UnsupportedServer,
    choose,
)
from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi import FakeApiServer, samples

SERVED = {"v1": ("v1", "v1beta2", "v1beta1"), "v1beta2": ("v1beta2", "v1beta1"),
          "v1beta1": ("v1beta1",)}


# ---- choosing ------------------------------------------------------------------------------

@pytest.mark.parametrize(("served", "chosen"), [
    (("v1", "v1beta2", "v1beta1"), "v1"),
    (("v1beta2", "v1beta1"), "v1beta2"),
    (("v1beta1",), "v1beta1"),
    (("v1beta1", "v1"), "v1"),  # our preference, not the server's order
    (("v1alpha3", "v1beta1"), "v1beta1"),
])
def test_auto_takes_the_first_of_v1_v1beta2_v1beta1_served(served, chosen):
    assert choose("auto", served) == ResourceApi(chosen, served)


def test_nothing_we_speak_is_said_with_what_is_served():
    with pytest.raises(UnsupportedServer, match=r"it serves: v1alpha3\. DRA needs Kubernetes "
                                                r"1\.32 or later"):
        choose("auto", ("v1alpha3",))
    with pytest.raises(UnsupportedServer, match="it serves: none"):
        choose("auto", ())


def test_a_pinned_version_must_be_served():
    assert choose("v1beta1", ("v1", "v1beta1")).version == "v1beta1"
    with pytest.raises(UnsupportedServer, match=r"--resource-api-version v1: the API server "
                                                r"does not serve resource.k8s.io/v1 \(it "
                                                r"serves: v1beta1\)"):
        choose("v1", ("v1beta1",))
    with pytest.raises(ValueError, match="expected one of auto, v1, v1beta2, v1beta1"):
        choose("v2", ("v1",))


def test_only_v1_has_every_feature():
    assert ResourceApi("v1").lacks == frozenset()
    assert ResourceApi("v1beta2").lacks == ResourceApi("v1beta1").lacks == NEWER_FEATURES


# ---- shapes --------------------------------------------------------------------------------

def claim_with_alternatives() -> dict[str, Any]:
    claim = samples.claim()
    claim["spec"]["devices"]["requests"].append({"name": "mig", "firstAvailable": [
        {"name": "small", "deviceClassName": "mig.nvidia.com", "count": 1}]})
    return claim


def test_v1beta1_bodies_convert_both_ways_and_back():
    beta = ResourceApi("v1beta1")
    slice_ = samples.resource_slice(devices=[samples.device("gpu-0")])
    sent = beta.outgoing("resourceslices", slice_)
    assert sent["apiVersion"] == "resource.k8s.io/v1beta1"
    assert sent["spec"]["devices"][0]["basic"]["capacity"] == {"memory": {"value": "80Gi"}}
    assert beta.incoming("resourceslices", sent) == slice_
    claim = claim_with_alternatives()
    sent = beta.outgoing("resourceclaims", claim)
    assert sent["spec"]["devices"]["requests"][0]["deviceClassName"] == "gpu.nvidia.com"
    assert "exactly" not in sent["spec"]["devices"]["requests"][0]
    # A v1beta1 server sends deviceClassName (not omitempty) empty beside firstAvailable.
    sent["spec"]["devices"]["requests"][1]["deviceClassName"] = ""
    assert beta.incoming("resourceclaims", sent) == claim
    assert slice_ == samples.resource_slice(devices=[samples.device("gpu-0")])  # not touched


def test_v1beta2_is_v1_under_another_name():
    beta2 = ResourceApi("v1beta2")
    claim = samples.claim()
    sent = beta2.outgoing("resourceclaims", claim)
    assert sent == {**claim, "apiVersion": "resource.k8s.io/v1beta2"}
    assert beta2.incoming("resourceclaims", sent) == claim


# ---- through HTTP --------------------------------------------------------------------------

@pytest.fixture(params=list(SERVED))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def api(mode: str) -> Iterator[FakeApiServer]:
    with FakeApiServer(resource_api=mode) as server:
        yield server


@pytest.fixture
async def raw(api: FakeApiServer) -> AsyncIterator[RawApi]:
    async with ApiSession.for_url(api.url, resource_api="auto") as session:
        yield RawApi(session, timeout=10)


def discoveries() -> float:
    return REGISTRY.get_sample_value("gpudra_api_calls_total", {
        "verb": "get", "resource": "resource.k8s.io", "outcome": "ok"}) or 0.0


async def test_every_call_speaks_the_served_version_in_v1_shapes(api, raw, mode):
    before = discoveries()
    assert (await raw.resource_version()).version == mode
    slice_ = samples.resource_slice(devices=[samples.device("gpu-0")])
    created = await raw.create(RESOURCE_SLICES, copy.deepcopy(slice_))
    assert created["apiVersion"] == "resource.k8s.io/v1"
    assert created["spec"]["devices"] == slice_["spec"]["devices"]
    got = await raw.get(RESOURCE_SLICES, "node-1-gpu")
    assert got["spec"] == created["spec"]
    listed = await raw.list(RESOURCE_SLICES, field_selector="spec.nodeName=node-1")
    assert [i["spec"]["devices"] for i in listed["items"]] == [slice_["spec"]["devices"]]
    got["spec"]["devices"].append(samples.device("gpu-1"))
    replaced = await raw.replace(RESOURCE_SLICES, "node-1-gpu", got)
    assert [d["name"] for d in replaced["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert api.get("ResourceSlice", "node-1-gpu")["spec"]["devices"][1] == samples.device(
        "gpu-1")
    claim = claim_with_alternatives() if mode == "v1" else samples.claim()
    await raw.create(RESOURCE_CLAIMS, claim, namespace="default")
    read = await raw.get(RESOURCE_CLAIMS, "claim-1", namespace="default")
    assert read["spec"] == claim["spec"]
    await raw.delete(RESOURCE_SLICES, "node-1-gpu")
    with pytest.raises(NotFound):
        await raw.get(RESOURCE_SLICES, "node-1-gpu")
    assert {r.path.split("/")[3] for r in api.requests} == {mode}
    assert api.pruned == []
    assert discoveries() == before + 1  # asked once, kept


async def test_watch_events_come_in_v1_shape(api, raw, mode):
    listed = await raw.list(RESOURCE_SLICES)
    api.put(samples.resource_slice(devices=[samples.device("gpu-0")]))
    async with await raw.watch(RESOURCE_SLICES, field_selector="",
                               resource_version=listed["metadata"]["resourceVersion"],
                               timeout_seconds=5) as stream:
        event = await asyncio.wait_for(stream.next(), 5)
    assert event is not None and event["type"] == "ADDED"
    assert event["object"]["apiVersion"] == "resource.k8s.io/v1"
    assert event["object"]["spec"]["devices"] == [samples.device("gpu-0")]
    assert any(f"/resource.k8s.io/{mode}/resourceslices" in r.path and r.verb == "watch"
               for r in api.requests)


@pytest.mark.parametrize("mode", ["v1beta2", "v1beta1"])
async def test_a_pinned_version_the_server_lacks_fails_each_call_naming_the_flag(api, mode):
    async with ApiSession.for_url(api.url, resource_api="v1") as session:
        raw = RawApi(session, timeout=10)
        for _ in range(2):  # asked again: the server may have been upgraded meanwhile
            with pytest.raises(ApiCallError) as failure:
                await raw.get(RESOURCE_SLICES, "any")
            assert not isinstance(failure.value, NotFound)  # not "the slice is gone"
            assert failure.value.reason == "VersionNotServed"
            assert "--resource-api-version v1" in failure.value.message
    assert api.requests == []  # nothing was sent to a version that is not there


async def test_without_a_choice_the_session_speaks_v1_without_asking(fake_api):
    before = discoveries()
    async with ApiSession.for_url(fake_api.url) as session:
        raw = RawApi(session, timeout=10)
        assert (await raw.list(RESOURCE_SLICES))["items"] == []
    assert discoveries() == before
