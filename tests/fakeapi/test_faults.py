"""Fault injection and call accounting, seen through the real clients."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import kubernetes.aio.client as aio_k8s
import kubernetes.client as k8s
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from gpudra.testing.fakeapi import FakeApiServer, samples


@pytest.fixture
def resource(k8s_client: k8s.ApiClient) -> k8s.ResourceV1Api:
    return k8s.ResourceV1Api(k8s_client)


@pytest.mark.parametrize(("code", "reason"), [
    (409, "Conflict"), (429, "TooManyRequests"), (500, "InternalError"),
    (503, "ServiceUnavailable"), (504, "Timeout"), (403, "Forbidden"),
])
def test_fail_next_answers_with_a_status_of_that_code(resource, fake_api, code, reason):
    fake_api.fail_next(1, status=code)
    with pytest.raises(ApiException) as err:
        resource.list_resource_slice()
    assert err.value.status == code
    body = json.loads(err.value.body)
    assert (body["kind"], body["reason"], body["code"]) == ("Status", reason, code)
    if code in (429, 503, 504):
        assert err.value.headers["Retry-After"] == "1"
        assert body["details"]["retryAfterSeconds"] == 1
    resource.list_resource_slice()  # only the next one failed


def test_fail_next_counts_and_filters_by_verb_and_resource(resource, fake_api):
    fake_api.fail_next(2, status=500, verb="create", resource="resourceslices")
    resource.list_resource_slice()  # not matched
    for _ in range(2):
        with pytest.raises(ApiException):
            resource.create_resource_slice(samples.resource_slice(devices=[]))
    resource.create_resource_slice(samples.resource_slice(devices=[]))
    assert fake_api.calls["create", "resourceslices"] == 3
    assert [r.status for r in fake_api.requests if r.verb == "create"] == [500, 500, 201]


def test_subresources_are_separate_resources(resource, fake_api):
    resource.create_namespaced_resource_claim("default", samples.claim())
    fake_api.fail_next(1, status=409, resource="resourceclaims/status")
    resource.patch_namespaced_resource_claim("claim-1", "default", {"metadata": {
        "labels": {"a": "b"}}}, _content_type="application/merge-patch+json")
    with pytest.raises(ApiException) as err:
        resource.patch_namespaced_resource_claim_status(
            "claim-1", "default", {"status": {}}, _content_type="application/merge-patch+json")
    assert err.value.status == 409


def test_delay_holds_matching_requests_until_cleared():
    # Proven by the order of answers: a held LIST is still unanswered while other requests
    # are answered. The holds are long and end only when the server stops (which cuts
    # them short), so no bound on seconds is needed.
    with FakeApiServer() as api, k8s.ApiClient(api.configuration()) as client:
        resource = k8s.ResourceV1Api(client)

        def held_list() -> threading.Thread:
            before = api.calls["list", "resourceslices"]
            thread = threading.Thread(target=_list_ignoring_errors, args=(resource,))
            thread.start()
            for _ in range(2000):  # until it has reached the server (10 s at most)
                if api.calls["list", "resourceslices"] > before:
                    return thread
                time.sleep(0.005)
            raise AssertionError("the list never reached the server")

        api.delay(600, verb="list")
        first = held_list()
        # Other verbs are not held: answered while the list waits.
        resource.create_resource_slice(samples.resource_slice(devices=[]),
                                       _request_timeout=10)
        assert first.is_alive()
        api.delay(0, verb="list")  # cleared: the next list is answered
        assert len(resource.list_resource_slice(_request_timeout=10).items) == 1
        assert first.is_alive()  # (a request already held stays held)

        api.delay(600, count=1)  # only the next request, whatever its verb
        second = held_list()
        assert len(resource.list_resource_slice(_request_timeout=10).items) == 1
        assert second.is_alive()
    for thread in (first, second):  # stopping the server ended their holds
        thread.join(10)
        assert not thread.is_alive()


def _list_ignoring_errors(resource: k8s.ResourceV1Api) -> None:
    with contextlib.suppress(Exception):  # the server stops under it
        resource.list_resource_slice(_request_timeout=30)


def test_drop_next_closes_the_connection_without_an_answer(resource, fake_api):
    fake_api.drop_next(1, verb="list")
    with pytest.raises(urllib3.exceptions.ProtocolError):
        resource.list_resource_slice()
    assert resource.list_resource_slice().items == []


def test_writes_and_reset_calls(resource, fake_api):
    resource.create_resource_slice(samples.resource_slice(devices=[]))
    resource.patch_resource_slice("node-1-gpu", {"metadata": {"labels": {"a": "b"}}},
                                  _content_type="application/merge-patch+json")
    resource.list_resource_slice()
    resource.read_resource_slice("node-1-gpu")
    resource.delete_collection_resource_slice()
    assert fake_api.writes() == 3
    assert fake_api.writes("resourceslices") == 3 and fake_api.writes("nodes") == 0
    assert fake_api.calls["get", "resourceslices"] == 1
    fake_api.reset_calls()
    assert fake_api.writes() == 0 and not fake_api.calls and not fake_api.requests


def test_mutate_writes_drops_fields_like_a_disabled_feature_gate(resource, fake_api):
    def drop_taints(obj: dict) -> None:
        for dev in obj["spec"].get("devices") or []:
            dev.pop("taints", None)

    fake_api.mutate_writes("ResourceSlice", drop_taints)
    created = resource.create_resource_slice(samples.resource_slice(devices=[samples.device(
        "gpu-0", taints=[{"key": "gpu.nvidia.com/unhealthy", "effect": "NoSchedule"}])]))
    assert created.spec.devices[0].taints is None
    fake_api.mutate_writes("ResourceSlice", None)


def test_taint_time_added_is_set_by_the_server(resource):
    created = resource.create_resource_slice(samples.resource_slice(devices=[samples.device(
        "gpu-0", taints=[{"key": "gpu.nvidia.com/unhealthy", "effect": "NoSchedule"}])]))
    assert created.spec.devices[0].taints[0].time_added is not None


async def test_aio_client_sees_injected_failures(aio_k8s_client, fake_api):
    api = aio_k8s.ResourceV1Api(aio_k8s_client)
    fake_api.fail_next(1, status=429, retry_after=2)
    with pytest.raises(aio_k8s.exceptions.ApiException) as err:
        await api.list_resource_slice()
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "2"
    assert (await api.list_resource_slice()).items == []
