"""Watch streams through the real clients: ordering, resume, 410, selectors, bookmarks."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import kubernetes.aio.client as aio_k8s
import kubernetes.aio.watch
import kubernetes.client as k8s
import kubernetes.watch
import pytest
from kubernetes.client.exceptions import ApiException

from gpudra.testing.fakeapi import samples
from gpudra.testing.fakeapi.server import FakeApiServer


@pytest.fixture
def resource(k8s_client: k8s.ApiClient) -> k8s.ResourceV1Api:
    return k8s.ResourceV1Api(k8s_client)


def collect(stream, n: int, watch) -> list[tuple[str, str]]:
    """The first ``n`` (type, name) events of a sync watch stream, then stop it."""
    seen = []
    for event in stream:
        name = event["raw_object"].get("metadata", {}).get("name", "")
        seen.append((event["type"], name))
        if len(seen) == n:
            watch.stop()
            break
    return seen


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_replay_from_a_resource_version_is_ordered(resource):
    start = resource.list_resource_slice().metadata.resource_version
    resource.create_resource_slice(samples.resource_slice("s1", devices=[]))
    resource.patch_resource_slice("s1", {"metadata": {"labels": {"a": "b"}}},
                                  _content_type="application/merge-patch+json")
    resource.create_resource_slice(samples.resource_slice("s2", devices=[]))
    resource.delete_resource_slice("s1")
    w = kubernetes.watch.Watch()
    events = collect(w.stream(resource.list_resource_slice, resource_version=start), 4, w)
    assert events == [("ADDED", "s1"), ("MODIFIED", "s1"), ("ADDED", "s2"), ("DELETED", "s1")]


def test_live_events_and_resume_from_the_last_seen_version(resource, fake_api):
    w = kubernetes.watch.Watch()
    seen: list[tuple[str, str, str]] = []

    def consume() -> None:
        for event in w.stream(resource.list_resource_slice, field_selector="spec.nodeName=n1"):
            obj = event["object"]
            seen.append((event["type"], obj.metadata.name, obj.metadata.resource_version))
            if len(seen) == 2:
                w.stop()  # from this thread: stopping from another one breaks the read

    thread = threading.Thread(target=consume)
    fake_api.put(samples.resource_slice("existing", "n1", devices=[]))
    thread.start()
    wait_for(lambda: seen)  # the initial state arrives as ADDED
    resource.create_resource_slice(samples.resource_slice("other-node", "n2", devices=[]))
    resource.create_resource_slice(samples.resource_slice("new", "n1", devices=[]))
    thread.join(5)
    assert [(t, n) for t, n, _ in seen] == [("ADDED", "existing"), ("ADDED", "new")]
    resource.delete_resource_slice("existing")
    w2 = kubernetes.watch.Watch()
    resumed = collect(w2.stream(resource.list_resource_slice, resource_version=seen[-1][2],
                                field_selector="spec.nodeName=n1"), 1, w2)
    assert resumed == [("DELETED", "existing")]
    wait_for(lambda: fake_api.open_watches == 0)


def test_selector_transitions_become_added_and_deleted(resource):
    start = resource.list_resource_slice().metadata.resource_version
    resource.create_resource_slice(samples.resource_slice("s", devices=[]))
    resource.patch_resource_slice("s", {"metadata": {"labels": {"pick": "me"}}},
                                  _content_type="application/merge-patch+json")
    resource.patch_resource_slice("s", {"metadata": {"labels": {"pick": "other"}}},
                                  _content_type="application/merge-patch+json")
    w = kubernetes.watch.Watch()
    events = collect(w.stream(resource.list_resource_slice, resource_version=start,
                              label_selector="pick=me"), 2, w)
    assert events == [("ADDED", "s"), ("DELETED", "s")]


def test_expired_resource_version_is_410_gone(resource, fake_api):
    old = resource.list_resource_slice().metadata.resource_version
    resource.create_resource_slice(samples.resource_slice("s", devices=[]))
    fake_api.expire_watches()
    w = kubernetes.watch.Watch()
    with pytest.raises(ApiException) as err:
        list(w.stream(resource.list_resource_slice, resource_version=old, timeout_seconds=5))
    assert err.value.status == 410
    assert "too old resource version" in err.value.reason
    # On the wire: HTTP 200, then one ERROR event carrying an Expired Status.
    response = resource.list_resource_slice(watch=True, resource_version=old,
                                            _preload_content=False)
    try:
        event = json.loads(response.data)
    finally:
        response.close()
    assert response.status == 200 and event["type"] == "ERROR"
    assert {k: event["object"][k] for k in ("kind", "reason", "code")} == {
        "kind": "Status", "reason": "Expired", "code": 410}
    # A current resourceVersion still works after the compaction.
    now = resource.list_resource_slice().metadata.resource_version
    w3 = kubernetes.watch.Watch()
    resource.delete_resource_slice("s")
    assert collect(w3.stream(resource.list_resource_slice, resource_version=now), 1, w3) == [
        ("DELETED", "s")]


def test_timeout_seconds_ends_the_stream_and_bookmarks_arrive():
    with FakeApiServer(bookmark_interval=0.05) as api, \
            k8s.ApiClient(api.configuration()) as client:
        resource = k8s.ResourceV1Api(client)
        w = kubernetes.watch.Watch()
        # The server ends the stream (the client would wait 30 s before giving up).
        events = list(w.stream(resource.list_resource_slice, timeout_seconds=1,
                               allow_watch_bookmarks=True, _request_timeout=30))
        assert events and {e["type"] for e in events} == {"BOOKMARK"}
        assert events[-1]["raw_object"]["metadata"]["resourceVersion"] == api.resource_version


def test_initial_events_end_bookmark_and_send_bookmarks(resource, fake_api):
    fake_api.put(samples.resource_slice("s", devices=[]))
    w = kubernetes.watch.Watch()
    stream = w.stream(resource.list_resource_slice, send_initial_events=True,
                      allow_watch_bookmarks=True, resource_version_match="NotOlderThan")
    first, second = next(stream), next(stream)
    assert (first["type"], second["type"]) == ("ADDED", "BOOKMARK")
    assert second["raw_object"]["metadata"]["annotations"] == {
        "k8s.io/initial-events-end": "true"}
    fake_api.send_bookmarks()
    assert next(stream)["type"] == "BOOKMARK"
    w.stop()
    stream.close()


def test_close_watches_ends_streams_and_clients_rewatch(resource, fake_api):
    w = kubernetes.watch.Watch()
    stream = w.stream(resource.list_resource_slice, timeout_seconds=30)
    seen = []
    thread = threading.Thread(target=lambda: seen.extend(stream))
    thread.start()
    wait_for(lambda: fake_api.open_watches == 1)
    fake_api.close_watches()
    thread.join(5)
    assert not thread.is_alive() and seen == []
    assert fake_api.calls["watch", "resourceslices"] == 1


async def test_aio_list_then_watch(aio_k8s_client: aio_k8s.ApiClient, fake_api):
    api = aio_k8s.ResourceV1Api(aio_k8s_client)
    await api.create_resource_slice(samples.resource_slice("s1", devices=[]))
    listed = await api.list_resource_slice(field_selector="spec.nodeName=node-1")
    assert [s.metadata.name for s in listed.items] == ["s1"]
    seen: list[tuple[str, str]] = []
    async with kubernetes.aio.watch.Watch() as w:
        async def consume() -> None:
            async for event in w.stream(api.list_resource_slice,
                                        resource_version=listed.metadata.resource_version,
                                        timeout_seconds=10):
                seen.append((event["type"], event["object"].metadata.name))
                if len(seen) == 3:
                    return

        task = asyncio.create_task(consume())
        await api.create_resource_slice(samples.resource_slice("s2", devices=[]))
        await api.patch_resource_slice("s2", {"metadata": {"labels": {"a": "b"}}},
                                       _content_type="application/merge-patch+json")
        await api.delete_resource_slice("s1")
        await asyncio.wait_for(task, 5)
    assert seen == [("ADDED", "s2"), ("MODIFIED", "s2"), ("DELETED", "s1")]


async def test_aio_watch_resumes_after_the_server_closes_it(aio_k8s_client, fake_api):
    api = aio_k8s.ResourceV1Api(aio_k8s_client)
    rv = (await api.list_resource_slice()).metadata.resource_version
    seen: list[str] = []
    first = asyncio.Event()
    async with kubernetes.aio.watch.Watch() as w:
        async def consume() -> None:
            async for event in w.stream(api.list_resource_slice, resource_version=rv):
                seen.append(event["object"].metadata.name)
                first.set()
                if len(seen) == 2:
                    return

        task = asyncio.create_task(consume())
        await api.create_resource_slice(samples.resource_slice("a", devices=[]))
        await asyncio.wait_for(first.wait(), 5)
        fake_api.close_watches()  # the client re-watches from the last version it saw
        await api.create_resource_slice(samples.resource_slice("b", devices=[]))
        await asyncio.wait_for(task, 5)
    assert seen == ["a", "b"]
    assert fake_api.calls["watch", "resourceslices"] == 2


async def test_aio_watch_410_raises(aio_k8s_client, fake_api):
    api = aio_k8s.ResourceV1Api(aio_k8s_client)
    rv = (await api.list_resource_slice()).metadata.resource_version
    await api.create_resource_slice(samples.resource_slice("a", devices=[]))
    fake_api.expire_watches()
    async with kubernetes.aio.watch.Watch() as w:
        with pytest.raises(aio_k8s.exceptions.ApiException) as err:
            async for _ in w.stream(api.list_resource_slice, resource_version=rv,
                                    timeout_seconds=5):
                pass
    assert err.value.status == 410


def test_storage_helpers_emit_watch_events(resource, fake_api):
    start = fake_api.resource_version
    fake_api.put(samples.resource_slice("s", devices=[]))
    fake_api.modify("ResourceSlice", "s", {"metadata": {"labels": {"a": "b"}}})
    fake_api.put(samples.resource_slice("other", devices=[]))
    fake_api.delete("ResourceSlice", "s")
    w = kubernetes.watch.Watch()
    events = collect(w.stream(resource.list_resource_slice, resource_version=start,
                              field_selector="metadata.name=s"), 3, w)
    assert events == [("ADDED", "s"), ("MODIFIED", "s"), ("DELETED", "s")]


def test_expiry_forces_an_up_to_date_client_to_relist(resource, fake_api):
    resource.create_resource_slice(samples.resource_slice("s", devices=[]))
    latest = resource.read_resource_slice("s").metadata.resource_version
    fake_api.close_watches()
    fake_api.expire_watches()
    w = kubernetes.watch.Watch()
    with pytest.raises(ApiException) as err:
        list(w.stream(resource.list_resource_slice, resource_version=latest, timeout_seconds=5))
    assert err.value.status == 410
    relisted = resource.list_resource_slice()
    resource.delete_resource_slice("s")
    w2 = kubernetes.watch.Watch()
    assert collect(w2.stream(resource.list_resource_slice,
                             resource_version=relisted.metadata.resource_version), 1, w2) == [
        ("DELETED", "s")]
