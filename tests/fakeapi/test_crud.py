"""CRUD through the real sync ``kubernetes`` client over HTTP."""

from __future__ import annotations

import json

import kubernetes.client as k8s
import pytest
from kubernetes.client.exceptions import ApiException, NotFoundException

from gpudra.testing.fakeapi import samples
from gpudra.testing.fakeapi.server import FakeApiServer


@pytest.fixture
def resource(k8s_client: k8s.ApiClient) -> k8s.ResourceV1Api:
    return k8s.ResourceV1Api(k8s_client)


@pytest.fixture
def core(k8s_client: k8s.ApiClient) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(k8s_client)


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


def test_create_get_list_with_server_set_metadata(resource):
    created = resource.create_resource_slice(samples.resource_slice(devices=[
        samples.device("gpu-0")]))
    meta = created.metadata
    assert meta.uid and meta.resource_version and meta.creation_timestamp
    assert meta.generation == 1
    assert resource.read_resource_slice("node-1-gpu").metadata.uid == meta.uid
    listed = resource.list_resource_slice()
    assert [s.metadata.name for s in listed.items] == ["node-1-gpu"]
    assert int(listed.metadata.resource_version) >= int(meta.resource_version)


def test_generate_name_and_already_exists(resource):
    first = resource.create_resource_slice(samples.resource_slice(None, devices=[]))
    assert first.metadata.name.startswith("node-1-gpu.nvidia.com-")
    assert len(first.metadata.name) == len("node-1-gpu.nvidia.com-") + 5
    resource.create_resource_slice(samples.resource_slice("fixed", devices=[]))
    with pytest.raises(ApiException) as err:
        resource.create_resource_slice(samples.resource_slice("fixed", devices=[]))
    assert err.value.status == 409
    body = status_of(err.value)
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'resourceslices.resource.k8s.io "fixed" already exists'


def test_not_found_raises_the_clients_not_found_exception(resource, core):
    with pytest.raises(NotFoundException) as err:
        resource.read_resource_slice("missing")
    assert status_of(err.value)["details"] == {
        "name": "missing", "group": "resource.k8s.io", "kind": "resourceslices"}
    with pytest.raises(NotFoundException) as err:
        core.read_node("missing")
    assert status_of(err.value)["message"] == 'nodes "missing" not found'


def test_list_filters_by_field_and_label_selectors_and_pages(resource, fake_api):
    for node in ("a", "b", "c"):
        body = samples.resource_slice(f"{node}-gpu", node, devices=[])
        body["metadata"]["labels"] = {"node": node, "tier": "gpu"}
        resource.create_resource_slice(body)
    other = samples.resource_slice("other", "a", devices=[], pool="shared")
    other["spec"]["driver"] = "other.example.com"
    resource.create_resource_slice(other)

    def names(**kw):
        return [s.metadata.name for s in resource.list_resource_slice(**kw).items]

    assert names(field_selector="spec.nodeName=a") == ["a-gpu", "other"]
    assert names(field_selector="spec.nodeName=a,spec.driver=gpu.nvidia.com") == ["a-gpu"]
    assert names(field_selector="spec.driver!=gpu.nvidia.com") == ["other"]
    assert names(field_selector="spec.pool.name=shared") == ["other"]
    assert names(field_selector="metadata.name=b-gpu") == ["b-gpu"]
    assert names(label_selector="node in (a,c)") == ["a-gpu", "c-gpu"]
    assert names(label_selector="tier=gpu,node!=a") == ["b-gpu", "c-gpu"]
    page = resource.list_resource_slice(limit=3)
    assert len(page.items) == 3 and page.metadata._continue
    rest = resource.list_resource_slice(limit=3, _continue=page.metadata._continue)
    assert [s.metadata.name for s in rest.items] == ["other"] and not rest.metadata._continue
    with pytest.raises(ApiException) as err:
        resource.list_resource_slice(field_selector="spec.devices=x")
    assert err.value.status == 400
    assert "field label not supported: spec.devices" in status_of(err.value)["message"]


def test_update_conflicts_on_a_stale_resource_version(resource):
    created = resource.create_resource_slice(samples.resource_slice(devices=[]))
    fresh = resource.read_resource_slice("node-1-gpu")
    fresh.spec.devices = [k8s.V1Device(name="gpu-0")]
    updated = resource.replace_resource_slice("node-1-gpu", fresh)
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    assert updated.metadata.generation == 2
    created.spec.devices = [k8s.V1Device(name="gpu-9")]  # still carries the old version
    with pytest.raises(ApiException) as err:
        resource.replace_resource_slice("node-1-gpu", created)
    assert err.value.status == 409
    body = status_of(err.value)
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "node-1-gpu": the '
        "object has been modified; please apply your changes to the latest version and try "
        "again")


def test_noop_update_keeps_the_resource_version(resource):
    created = resource.create_resource_slice(samples.resource_slice(devices=[
        samples.device("gpu-0")]))
    again = resource.replace_resource_slice("node-1-gpu", created)
    assert again.metadata.resource_version == created.metadata.resource_version


def test_merge_json_and_strategic_patches(resource, fake_api):
    resource.create_resource_slice(samples.resource_slice(devices=[samples.device("gpu-0")]))
    merged = resource.patch_resource_slice(
        "node-1-gpu", {"metadata": {"labels": {"a": "1"}}, "spec": {"pool": {"generation": 3}}},
        _content_type="application/merge-patch+json")
    assert merged.metadata.labels == {"a": "1"} and merged.spec.pool.generation == 3
    patched = resource.patch_resource_slice(
        "node-1-gpu", [{"op": "replace", "path": "/spec/devices/0/name", "value": "gpu-7"},
                       {"op": "remove", "path": "/metadata/labels/a"}])
    assert patched.spec.devices[0].name == "gpu-7" and not patched.metadata.labels
    strategic = resource.patch_resource_slice("node-1-gpu", {"metadata": {"labels": {"b": "2"}}})
    assert strategic.metadata.labels == {"b": "2"}
    assert [r.content_type for r in fake_api.requests if r.verb == "patch"] == [
        "application/merge-patch+json", "application/json-patch+json",
        "application/strategic-merge-patch+json"]
    with pytest.raises(ApiException) as err:
        resource.patch_resource_slice("node-1-gpu", [
            {"op": "test", "path": "/spec/driver", "value": "other"}])
    assert err.value.status == 422
    with pytest.raises(ApiException) as err:  # a resourceVersion in a patch is a precondition
        resource.patch_resource_slice("node-1-gpu", {"metadata": {"resourceVersion": "1"}},
                                      _content_type="application/merge-patch+json")
    assert err.value.status == 409


def test_server_side_apply_creates_merges_and_owns_fields(resource, fake_api):
    body = samples.resource_slice(devices=[samples.device("gpu-0")])
    body["metadata"]["labels"] = {"owned": "yes"}
    first = resource.patch_resource_slice("node-1-gpu", body, field_manager="gpudra",
                                          _content_type="application/apply-patch+yaml")
    assert first.metadata.uid and first.metadata.managed_fields[0].manager == "gpudra"
    assert first.metadata.managed_fields[0].operation == "Apply"
    assert fake_api.calls["patch", "resourceslices"] == 1
    # Re-applying without the label removes it: the manager no longer wants the field.
    del body["metadata"]["labels"]
    body["spec"]["devices"].append(samples.device("gpu-1"))
    second = resource.patch_resource_slice("node-1-gpu", body, field_manager="gpudra",
                                           _content_type="application/apply-patch+yaml")
    assert not second.metadata.labels and len(second.spec.devices) == 2
    # Identical re-apply is a no-op: no new resourceVersion.
    third = resource.patch_resource_slice("node-1-gpu", body, field_manager="gpudra",
                                          _content_type="application/apply-patch+yaml")
    assert third.metadata.resource_version == second.metadata.resource_version
    # Another manager changing an owned field conflicts, unless it forces.
    body["spec"]["pool"]["generation"] = 7
    with pytest.raises(ApiException) as err:
        resource.patch_resource_slice("node-1-gpu", body, field_manager="intruder",
                                      _content_type="application/apply-patch+yaml")
    assert err.value.status == 409 and ".spec.pool.generation" in status_of(err.value)["message"]
    forced = resource.patch_resource_slice("node-1-gpu", body, field_manager="intruder",
                                           force=True,
                                           _content_type="application/apply-patch+yaml")
    assert forced.spec.pool.generation == 7
    with pytest.raises(ApiException) as err:
        resource.patch_resource_slice("node-1-gpu", body,
                                      _content_type="application/apply-patch+yaml")
    assert err.value.status == 422 and "fieldManager" in status_of(err.value)["message"]


def test_delete_returns_the_object_and_honours_preconditions(resource):
    created = resource.create_resource_slice(samples.resource_slice(devices=[]))
    for pre in ({"uid": "00000000-0000-0000-0000-000000000000"}, {"resourceVersion": "1"}):
        with pytest.raises(ApiException) as err:
            resource.delete_resource_slice("node-1-gpu", body=k8s.V1DeleteOptions(
                preconditions=k8s.V1Preconditions(**pre)))
        assert err.value.status == 409
        assert "Precondition failed" in status_of(err.value)["message"]
    deleted = resource.delete_resource_slice("node-1-gpu", body=k8s.V1DeleteOptions(
        preconditions=k8s.V1Preconditions(uid=created.metadata.uid,
                                          resource_version=created.metadata.resource_version)))
    assert deleted.metadata.name == "node-1-gpu"
    with pytest.raises(NotFoundException):
        resource.delete_resource_slice("node-1-gpu")


def test_delete_collection_by_node_like_the_kubelet(resource, fake_api):
    for node in ("a", "b"):
        for i in range(2):
            resource.create_resource_slice(samples.resource_slice(f"{node}-{i}", node,
                                                                  devices=[]))
    result = resource.delete_collection_resource_slice(field_selector="spec.nodeName=a")
    assert result.kind == "ResourceSliceList"
    assert [s["metadata"]["name"] for s in fake_api.list("ResourceSlice")] == ["b-0", "b-1"]
    assert fake_api.calls["deletecollection", "resourceslices"] == 1


def test_node_deletion_garbage_collects_owned_slices(resource, core, fake_api):
    node = core.create_node(samples.node("node-1"))
    other = core.create_node(samples.node("node-2"))
    resource.create_resource_slice(samples.resource_slice("mine", owner_uid=node.metadata.uid,
                                                          devices=[]))
    resource.create_resource_slice(samples.resource_slice("theirs", "node-2", devices=[],
                                                          owner_uid=other.metadata.uid))
    shared = samples.resource_slice("shared", devices=[], owner_uid=node.metadata.uid)
    shared["metadata"]["ownerReferences"].append({"apiVersion": "v1", "kind": "Node",
                                                  "name": "node-2", "uid": other.metadata.uid})
    resource.create_resource_slice(shared)
    core.delete_node("node-1")
    remaining = {s["metadata"]["name"]: s for s in fake_api.list("ResourceSlice")}
    assert set(remaining) == {"theirs", "shared"}
    # The slice with a living second owner only loses the dangling reference.
    assert [r["name"] for r in remaining["shared"]["metadata"]["ownerReferences"]] == ["node-2"]


def test_claim_status_subresource(resource):
    claim = resource.create_namespaced_resource_claim("default", samples.claim())
    assert claim.status is None
    # The main resource ignores status; the status subresource changes only status.
    ignored = resource.patch_namespaced_resource_claim(
        "claim-1", "default", {"status": {"allocation": samples.allocation()}},
        _content_type="application/merge-patch+json")
    assert ignored.status is None
    allocated = resource.patch_namespaced_resource_claim_status(
        "claim-1", "default", {"metadata": {"labels": {"x": "y"}},
                               "status": {"allocation": samples.allocation()}},
        _content_type="application/merge-patch+json")
    assert allocated.status.allocation.devices.results[0].device == "gpu-0"
    assert not allocated.metadata.labels
    assert allocated.metadata.generation == claim.metadata.generation
    reserved = resource.read_namespaced_resource_claim_status("claim-1", "default")
    reserved.status.reserved_for = [k8s.V1ResourceClaimConsumerReference(
        resource="pods", name="p", uid="1234")]
    reserved.status.devices = [k8s.V1AllocatedDeviceStatus(
        driver="gpu.nvidia.com", pool="node-1", device="gpu-0")]
    updated = resource.replace_namespaced_resource_claim_status("claim-1", "default", reserved)
    assert updated.status.reserved_for[0].uid == "1234"
    with pytest.raises(ApiException) as err:  # allocation is immutable once set
        resource.patch_namespaced_resource_claim_status(
            "claim-1", "default", {"status": {"allocation": samples.allocation("gpu-1")}},
            _content_type="application/merge-patch+json")
    assert err.value.status == 422
    assert status_of(err.value)["details"]["causes"][0]["field"] == "status.allocation"
    with pytest.raises(ApiException) as err:  # the spec is immutable
        resource.patch_namespaced_resource_claim(
            "claim-1", "default", {"spec": {"devices": {"requests": []}}},
            _content_type="application/merge-patch+json")
    assert err.value.status == 422 and "field is immutable" in status_of(err.value)["message"]


def test_claim_status_devices_must_be_allocated(resource):
    resource.create_namespaced_resource_claim("default", samples.claim())
    with pytest.raises(ApiException) as err:
        resource.patch_namespaced_resource_claim_status(
            "claim-1", "default", {"status": {"reservedFor": [
                {"resource": "pods", "name": "p", "uid": "1"}]}},
            _content_type="application/merge-patch+json")
    assert status_of(err.value)["details"]["causes"][0]["field"] == "status.reservedFor"


def test_finalizers_hold_deletion_until_removed(resource, fake_api):
    body = samples.claim()
    body["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    resource.create_namespaced_resource_claim("default", body)
    deleting = resource.delete_namespaced_resource_claim("claim-1", "default")
    assert deleting.metadata.deletion_timestamp is not None
    assert fake_api.get("ResourceClaim", "claim-1", "default") is not None
    resource.patch_namespaced_resource_claim("claim-1", "default",
                                             {"metadata": {"finalizers": None}},
                                             _content_type="application/merge-patch+json")
    assert fake_api.get("ResourceClaim", "claim-1", "default") is None


def test_device_classes_templates_pods_and_events(k8s_client, resource, core, fake_api):
    resource.create_device_class({"metadata": {"name": "gpu.nvidia.com"}, "spec": {
        "selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]}})
    assert resource.list_device_class().items[0].spec.selectors[0].cel.expression
    template = {"metadata": {"name": "t"}, "spec": {"spec": samples.claim()["spec"]}}
    resource.create_namespaced_resource_claim_template("default", template)
    assert resource.read_namespaced_resource_claim_template("t", "default").spec.spec.devices
    core.create_namespaced_pod("ns1", {"metadata": {"name": "p"}, "spec": {
        "nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}]}})
    assert [p.metadata.name for p in
            core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-1").items] == ["p"]
    core.create_namespaced_event("ns1", {"metadata": {"name": "e1"}, "involvedObject": {
        "kind": "Pod", "name": "p", "namespace": "ns1"}, "reason": "Prepared", "type": "Normal",
        "message": "ok"})
    events = k8s.EventsV1Api(k8s_client)
    events.create_namespaced_event("ns1", {"metadata": {"name": "e2"}, "eventTime":
                                           "2026-01-01T00:00:00.000000Z", "reason": "R",
                                           "action": "A", "reportingController": "gpudra",
                                           "reportingInstance": "x", "type": "Normal"})
    assert core.list_namespaced_event("ns1", field_selector="reason=Prepared").items
    assert events.list_namespaced_event("ns1").items[0].reporting_controller == "gpudra"


def test_quantities_come_back_canonical(resource):
    body = samples.resource_slice(devices=[samples.device("gpu-0")])
    body["spec"]["devices"][0]["capacity"] = {"memory": {"value": "1024Mi"},
                                              "cores": {"value": "1000"}}
    created = resource.create_resource_slice(body)
    assert {k: v.value for k, v in created.spec.devices[0].capacity.items()} == {
        "memory": "1Gi", "cores": "1k"}


def test_discovery_and_version(k8s_client):
    version = k8s.VersionApi(k8s_client).get_code()
    assert (version.major, version.minor) == ("1", "37")
    groups = k8s.ApisApi(k8s_client).get_api_versions()
    assert "resource.k8s.io" in [g.name for g in groups.groups]
    resources = k8s.ResourceV1Api(k8s_client).get_api_resources()
    assert {"resourceslices", "resourceclaims", "resourceclaims/status", "deviceclasses"} <= {
        r.name for r in resources.resources}
    assert "v1" in k8s.CoreApi(k8s_client).get_api_versions().versions
    assert "pods" in {r.name for r in k8s.CoreV1Api(k8s_client).get_api_resources().resources}


def test_put_get_modify_delete_helpers_emit_state(fake_api: FakeApiServer, resource):
    stored = fake_api.put(samples.node("n"))
    assert stored["metadata"]["uid"] and fake_api.get("Node", "n")["metadata"]["name"] == "n"
    fake_api.put(samples.resource_slice("s", "n", devices=[], owner_uid=stored["metadata"]["uid"]))
    assert resource.read_resource_slice("s").spec.node_name == "n"
    fake_api.modify("ResourceSlice", "s", {"metadata": {"labels": {"a": "b"}}})
    assert resource.read_resource_slice("s").metadata.labels == {"a": "b"}
    fake_api.delete("Node", "n")
    assert fake_api.list("ResourceSlice") == []
    assert fake_api.writes() == 0  # helpers are not API calls


def test_server_side_apply_on_the_status_subresource(resource):
    resource.create_namespaced_resource_claim("default", samples.claim())
    resource.patch_namespaced_resource_claim_status(
        "claim-1", "default", {"status": {"allocation": samples.allocation()}},
        _content_type="application/merge-patch+json", field_manager="scheduler")
    applied = resource.patch_namespaced_resource_claim_status(
        "claim-1", "default",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "claim-1"}, "spec": {"devices": {"requests": []}},
         "status": {"devices": [{"driver": "gpu.nvidia.com", "pool": "node-1",
                                 "device": "gpu-0", "data": {"uuid": "GPU-1"}}]}},
        field_manager="gpudra", _content_type="application/apply-patch+yaml")
    assert applied.status.devices[0].data == {"uuid": "GPU-1"}
    assert applied.status.allocation is not None  # another manager's field is kept
    assert applied.spec.devices.requests  # the spec in an apply to /status is ignored
    managers = {(m.manager, m.operation, m.subresource) for m in applied.metadata.managed_fields}
    assert {("scheduler", "Update", "status"), ("gpudra", "Apply", "status")} <= managers


def test_orphan_propagation_and_namespace_deletion(resource, core, fake_api):
    owner = core.create_node(samples.node("n"))
    resource.create_resource_slice(samples.resource_slice("s", "n", devices=[],
                                                          owner_uid=owner.metadata.uid))
    core.delete_node("n", propagation_policy="Orphan")
    orphan = resource.read_resource_slice("s")
    assert orphan.metadata.owner_references is None
    core.create_namespace({"metadata": {"name": "team"}})
    resource.create_namespaced_resource_claim("team", samples.claim(namespace="team"))
    core.delete_namespace("team")
    assert fake_api.list("ResourceClaim") == []


def test_dry_run_changes_nothing(resource, fake_api):
    created = resource.create_resource_slice(samples.resource_slice(devices=[]), dry_run="All")
    assert created.metadata.name == "node-1-gpu"
    assert fake_api.list("ResourceSlice") == []
    resource.create_resource_slice(samples.resource_slice(devices=[]))
    version = fake_api.resource_version
    resource.patch_resource_slice("node-1-gpu", {"metadata": {"labels": {"a": "b"}}},
                                  dry_run="All", _content_type="application/merge-patch+json")
    resource.delete_resource_slice("node-1-gpu", dry_run="All")
    assert fake_api.resource_version == version
    assert fake_api.get("ResourceSlice", "node-1-gpu")["metadata"].get("labels") is None
