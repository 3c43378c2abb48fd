"""ResourceSlice validation (dra-interfaces.md §5): every rule rejects with 422 naming the
field, through the real client; valid slices, including a partitionable pool, pass."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import kubernetes.client as k8s
import pytest
from kubernetes.client.exceptions import ApiException

from gpudra.testing.fakeapi import samples

Obj = dict[str, Any]


@pytest.fixture
def resource(k8s_client: k8s.ApiClient) -> k8s.ResourceV1Api:
    return k8s.ResourceV1Api(k8s_client)


def base() -> Obj:
    return samples.resource_slice("node-1-gpu", devices=[samples.device("gpu-0")])


def dev(obj: Obj, i: int = 0) -> Obj:
    return obj["spec"]["devices"][i]


def set_in(path: str, value: Any) -> Callable[[Obj], None]:
    """Mutator: set a dotted path (list indexes as numbers) to value, None deletes it."""

    def mutate(obj: Obj) -> None:
        keys = path.split(".")
        node: Any = obj
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if value is None:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = value

    return mutate


def devices(n: int, **extra: Any) -> Callable[[Obj], None]:
    return set_in("spec.devices", [samples.device(f"gpu-{i}", **extra) for i in range(n)])


def attrs(n: int) -> Callable[[Obj], None]:
    return set_in("spec.devices.0.attributes", {f"a{i}": {"int": i} for i in range(n)})


TAINT = {"key": "gpu.nvidia.com/unhealthy", "effect": "NoSchedule"}
COUNTERS = [{"counterSet": "gpu-0-counters", "counters": {"memory-slices": {"value": "1"}}}]


def _both(obj: Obj) -> None:
    obj["spec"]["sharedCounters"] = [{"name": "c", "counters": {"x": {"value": "1"}}}]


def _duplicate_devices(obj: Obj) -> None:
    obj["spec"]["devices"].append(samples.device("gpu-0"))


def _two_terms(obj: Obj) -> None:
    del obj["spec"]["nodeName"]
    term = {"matchExpressions": [{"key": "a", "operator": "Exists"}]}
    obj["spec"]["nodeSelector"] = {"nodeSelectorTerms": [term, term]}


# (id, mutation, field named in the cause, cause reason, text in the message)
CASES: list[tuple[str, Callable[[Obj], None], str, str, str]] = [
    ("metadata-name", set_in("metadata.name", "Bad_Name"), "metadata.name",
     "FieldValueInvalid", "a lowercase RFC 1123 subdomain"),
    ("no-node-selection", set_in("spec.nodeName", None), "spec", "FieldValueRequired",
     "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is "
     "required"),
    ("two-node-selections", set_in("spec.allNodes", True), "spec", "FieldValueInvalid",
     "{`nodeName`, `allNodes`}"),
    ("all-nodes-false", set_in("spec.allNodes", False), "spec.allNodes", "FieldValueInvalid",
     "must be either unset or set to true"),
    ("node-name-empty", set_in("spec.nodeName", ""), "spec.nodeName", "FieldValueInvalid",
     "must be either unset or set to a non-empty string"),
    ("node-selector-terms", _two_terms, "spec.nodeSelector.nodeSelectorTerms",
     "FieldValueInvalid", "must have exactly one node selector term"),
    ("driver-empty", set_in("spec.driver", ""), "spec.driver", "FieldValueRequired",
     "Required value"),
    ("driver-format", set_in("spec.driver", "gpu_nvidia!"), "spec.driver",
     "FieldValueInvalid", "a lowercase RFC 1123 subdomain"),
    ("driver-too-long", set_in("spec.driver", "a" * 64), "spec.driver", "FieldValueTooLong",
     "may not be more than 63 bytes"),
    ("pool-name-empty", set_in("spec.pool.name", ""), "spec.pool.name", "FieldValueRequired",
     "Required value"),
    ("pool-name-part", set_in("spec.pool.name", "ok/Not_OK"), "spec.pool.name",
     "FieldValueInvalid", 'Invalid value: "Not_OK"'),
    ("pool-slice-count", set_in("spec.pool.resourceSliceCount", 0),
     "spec.pool.resourceSliceCount", "FieldValueInvalid", "must be greater than zero"),
    ("pool-generation", set_in("spec.pool.generation", -1), "spec.pool.generation",
     "FieldValueInvalid", "must be greater than or equal to zero"),
    ("too-many-devices", devices(129), "spec.devices", "FieldValueTooMany",
     "Too many: 129: must have at most 128 items"),
    ("too-many-tainted-devices", devices(65, taints=[TAINT]), "spec.devices",
     "FieldValueTooMany", "must have at most 64 items"),
    ("too-many-counter-devices", devices(65, consumesCounters=COUNTERS), "spec.devices",
     "FieldValueTooMany", "must have at most 64 items"),
    ("devices-and-counters", _both, "spec", "FieldValueInvalid",
     "only one of `sharedCounters` or `devices` is allowed"),
    ("device-name", set_in("spec.devices.0.name", "GPU_0"), "spec.devices[0].name",
     "FieldValueInvalid", "a lowercase RFC 1123 label must consist of"),
    ("duplicate-device", _duplicate_devices, "spec.devices[1]", "FieldValueDuplicate",
     'Duplicate value: "gpu-0"'),
    ("attribute-name", set_in("spec.devices.0.attributes.bad-name", {"int": 1}),
     "spec.devices[0].attributes", "FieldValueInvalid", "a valid C identifier"),
    ("attribute-domain", set_in("spec.devices.0.attributes.Bad_Domain/x", {"int": 1}),
     "spec.devices[0].attributes", "FieldValueInvalid", "a lowercase RFC 1123 subdomain"),
    ("attribute-slashes", set_in("spec.devices.0.attributes.a/b/c", {"int": 1}),
     "spec.devices[0].attributes", "FieldValueInvalid", "must not contain more than one slash"),
    ("attribute-id-too-long", set_in("spec.devices.0.attributes." + "x" * 33, {"int": 1}),
     "spec.devices[0].attributes", "FieldValueTooLong", "may not be more than 32 bytes"),
    ("capacity-name", set_in("spec.devices.0.capacity.9lives", {"value": "1"}),
     "spec.devices[0].capacity", "FieldValueInvalid", "a valid C identifier"),
    ("attribute-two-values", set_in("spec.devices.0.attributes.x", {"int": 1, "bool": True}),
     "spec.devices[0].attributes[x]", "FieldValueInvalid", "exactly one value must be specified"),
    ("attribute-no-value", set_in("spec.devices.0.attributes.x", {}),
     "spec.devices[0].attributes[x]", "FieldValueInvalid", "exactly one value must be specified"),
    ("string-too-long", set_in("spec.devices.0.attributes.x", {"string": "s" * 65}),
     "spec.devices[0].attributes[x].string", "FieldValueTooLong",
     "may not be more than 64 bytes"),
    ("version-not-semver", set_in("spec.devices.0.attributes.x", {"version": "12.4"}),
     "spec.devices[0].attributes[x].version", "FieldValueInvalid",
     "must be a string compatible with semver.org spec 2.0.0"),
    ("version-leading-zero", set_in("spec.devices.0.attributes.x", {"version": "1.02.3"}),
     "spec.devices[0].attributes[x].version", "FieldValueInvalid", "semver.org"),
    ("too-many-attributes", attrs(32), "spec.devices[0]", "FieldValueInvalid",
     "Invalid value: 33: the total number of attributes and capacities must not exceed 32"),
    ("too-many-consumptions", set_in("spec.devices.0.consumesCounters", [
        {"counterSet": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(3)]),
     "spec.devices[0].consumesCounters", "FieldValueTooMany", "must have at most 2 items"),
    ("consumption-counter-name", set_in("spec.devices.0.consumesCounters", [
        {"counterSet": "s", "counters": {"Bad_Counter": {"value": "1"}}}]),
     "spec.devices[0].consumesCounters[0].counters", "FieldValueInvalid", "RFC 1123 label"),
    ("consumption-set-required", set_in("spec.devices.0.consumesCounters", [
        {"counterSet": "", "counters": {"c": {"value": "1"}}}]),
     "spec.devices[0].consumesCounters[0].counterSet", "FieldValueRequired", "Required value"),
    ("taint-key", set_in("spec.devices.0.taints", [{"key": "bad key", "effect": "NoSchedule"}]),
     "spec.devices[0].taints[0].key", "FieldValueInvalid", "name part must consist of"),
    ("taint-value", set_in("spec.devices.0.taints", [{**TAINT, "value": "-bad-"}]),
     "spec.devices[0].taints[0].value", "FieldValueInvalid", "a valid label must be"),
    ("taint-effect", set_in("spec.devices.0.taints", [{**TAINT, "effect": "Sometimes"}]),
     "spec.devices[0].taints[0].effect", "FieldValueNotSupported",
     'supported values: "NoExecute", "NoSchedule", "None"'),
    ("too-many-taints", set_in("spec.devices.0.taints", [
        {"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]),
     "spec.devices[0].taints", "FieldValueTooMany", "must have at most 16 items"),
    ("request-policy-forbidden", set_in("spec.devices.0.capacity.memory.requestPolicy", {
        "default": "1Gi", "validValues": ["1Gi"]}),
     "spec.devices[0].capacity[memory].requestPolicy", "FieldValueForbidden",
     "allowMultipleAllocations must be true"),
    ("per-device-node-without-flag", set_in("spec.devices.0.nodeName", "node-1"),
     "spec.devices[0]", "FieldValueInvalid", "can only be set if `perDeviceNodeSelection`"),
]

COUNTER_CASES: list[tuple[str, Callable[[Obj], None], str, str, str]] = [
    ("too-many-counter-sets", set_in("spec.sharedCounters", [
        {"name": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(9)]),
     "spec.sharedCounters", "FieldValueTooMany", "must have at most 8 items"),
    ("too-many-counters", set_in("spec.sharedCounters.0.counters", {
        f"c{i}": {"value": "1"} for i in range(33)}),
     "spec.sharedCounters[0].counters", "FieldValueTooMany", "must have at most 32 items"),
    ("counter-set-name", set_in("spec.sharedCounters.0.name", "Set_0"),
     "spec.sharedCounters[0].name", "FieldValueInvalid", "RFC 1123 label"),
    ("counter-name", set_in("spec.sharedCounters.0.counters", {"memory_slices": {"value": "1"}}),
     "spec.sharedCounters[0].counters", "FieldValueInvalid", "RFC 1123 label"),
    ("counters-required", set_in("spec.sharedCounters.0.counters", {}),
     "spec.sharedCounters[0].counters", "FieldValueRequired", "Required value"),
    ("duplicate-counter-set", lambda o: o["spec"]["sharedCounters"].append(
        copy.deepcopy(o["spec"]["sharedCounters"][0])),
     "spec.sharedCounters[1]", "FieldValueDuplicate", 'Duplicate value: "gpu-0-counters"'),
]


def rejected(resource: k8s.ResourceV1Api, body: Obj) -> dict:
    with pytest.raises(ApiException) as err:
        resource.create_resource_slice(body)
    assert err.value.status == 422, err.value.body
    status = json.loads(err.value.body)
    assert (status["reason"], status["code"]) == ("Invalid", 422)
    assert status["message"].startswith(
        f'ResourceSlice.resource.k8s.io "{body["metadata"]["name"]}" is invalid: ')
    assert status["details"]["kind"] == "ResourceSlice"
    assert status["details"]["group"] == "resource.k8s.io"
    return status


@pytest.mark.parametrize(("mutate", "field", "reason", "text"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_device_slices_are_rejected_naming_the_field(resource, mutate, field, reason,
                                                             text):
    body = base()
    mutate(body)
    status = rejected(resource, body)
    causes = [(c["field"], c["reason"]) for c in status["details"]["causes"]]
    assert (field, reason) in causes, causes
    assert text in status["message"]


@pytest.mark.parametrize(("mutate", "field", "reason", "text"),
                         [c[1:] for c in COUNTER_CASES], ids=[c[0] for c in COUNTER_CASES])
def test_invalid_counter_slices_are_rejected_naming_the_field(resource, mutate, field, reason,
                                                              text):
    body = samples.counters_slice("node-1-counters")
    mutate(body)
    status = rejected(resource, body)
    causes = [(c["field"], c["reason"]) for c in status["details"]["causes"]]
    assert (field, reason) in causes, causes
    assert text in status["message"]


def test_several_errors_make_the_apiservers_bracketed_message(resource):
    body = base()
    body["spec"]["devices"].extend(samples.device(f"gpu-{i}") for i in range(1, 4))
    dev(body, 3)["name"] = "X"
    body["spec"]["pool"]["resourceSliceCount"] = 0
    status = rejected(resource, body)
    assert status["message"] == (
        'ResourceSlice.resource.k8s.io "node-1-gpu" is invalid: [spec.pool.resourceSliceCount: '
        "Invalid value: 0: must be greater than zero, spec.devices[3].name: Invalid value: "
        '"X": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '
        "'-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
        "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')]")
    assert [c["field"] for c in status["details"]["causes"]] == [
        "spec.pool.resourceSliceCount", "spec.devices[3].name"]
    assert status["details"]["causes"][1]["message"].startswith('Invalid value: "X": ')


def test_unparsable_quantity_is_a_bad_request(resource):
    body = base()
    dev(body)["capacity"]["memory"]["value"] = "80 GiB"
    with pytest.raises(ApiException) as err:
        resource.create_resource_slice(body)
    assert err.value.status == 400
    status = json.loads(err.value.body)
    assert status["reason"] == "BadRequest"
    assert status["message"] == (
        'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: quantities must '
        "match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")


def test_wrong_json_types_are_bad_requests(fake_api):
    # The client's models refuse to send this, so speak HTTP directly.
    body = base()
    dev(body)["attributes"]["index"] = {"int": "zero"}
    request = urllib.request.Request(
        f"{fake_api.url}/apis/resource.k8s.io/v1/resourceslices", method="POST",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=5)
    with err.value:
        status = json.loads(err.value.read())
    assert (err.value.code, status["reason"]) == (400, "BadRequest")
    assert "cannot unmarshal string" in status["message"]


def test_immutable_fields_on_update(resource):
    resource.create_resource_slice(base())
    for path, value in (("spec.driver", "other.example.com"), ("spec.pool.name", "other"),
                        ("spec.nodeName", "node-2")):
        body = base()
        set_in(path, value)(body)
        if path == "spec.driver":
            body["spec"]["devices"] = []
        with pytest.raises(ApiException) as err:
            resource.replace_resource_slice("node-1-gpu", body)
        status = json.loads(err.value.body)
        assert err.value.status == 422
        assert {"reason": "FieldValueInvalid", "field": path,
                "message": f'Invalid value: "{value}": field is immutable'} in \
            status["details"]["causes"]


def test_valid_limits_are_accepted(resource):
    body = base()
    devices(128)(body)
    resource.create_resource_slice(body)
    body = base()
    body["metadata"]["name"] = "tainted"
    devices(64, taints=[TAINT])(body)
    resource.create_resource_slice(body)
    body = base()
    body["metadata"]["name"] = "attributes"
    attrs(31)(body)  # 31 attributes + 1 capacity = 32
    dev(body)["attributes"]["gpu.nvidia.com/uuid"] = {"string": "u" * 64}
    del dev(body)["attributes"]["a0"]
    dev(body)["attributes"]["v"] = {"version": "1.2.3-rc.1+build.5"}
    del dev(body)["attributes"]["a1"]
    resource.create_resource_slice(body)


def test_partitionable_pool_is_accepted_and_consistent(resource, fake_api):
    counters = samples.counters_slice("node-1-counters", gpus=2)
    resource.create_resource_slice(counters)
    mig = [samples.device("gpu-0")]
    mig[0]["consumesCounters"] = [{"counterSet": "gpu-0-counters", "counters": {
        "memory-slices": {"value": "8"}, "compute-slices": {"value": "7"},
        "memory": {"value": "80Gi"}}}]
    mig += [samples.mig_device(f"gpu-0-mig-1g10gb-{i}", 0, 1, 1) for i in range(7)]
    mig += [samples.mig_device(f"gpu-1-mig-3g40gb-{i}", 1, 4, 3) for i in (0, 4)]
    body = samples.resource_slice("node-1-devices", devices=mig, count=2)
    created = resource.create_resource_slice(body)
    assert len(created.spec.devices) == 10
    assert created.spec.devices[1].consumes_counters[0].counters["memory"].value == "10Gi"
    stored = resource.read_resource_slice("node-1-counters")
    assert stored.spec.shared_counters[0].counters["memory"].value == "80Gi"  # was 81920Mi
    assert fake_api.pool_problems() == []


def test_pool_problems_reports_what_the_scheduler_would_reject(resource, fake_api):
    resource.create_resource_slice(samples.counters_slice("c"))
    body = samples.resource_slice("d", devices=[samples.mig_device("gpu-9-mig", 9, 1, 1)],
                                  count=2)
    resource.create_resource_slice(body)
    assert fake_api.pool_problems() == [
        "pool gpu.nvidia.com/node-1: device 'gpu-9-mig' consumes unknown counter set "
        "'gpu-9-counters'"]
