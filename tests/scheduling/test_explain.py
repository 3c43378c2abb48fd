"""explain: which claims, allocated on which node, and a readable why-not for many nodes."""

from __future__ import annotations

import pytest

from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.explain import default_device_classes, explain
from gpudra.scheduling.explain_output import render_table, to_json
from gpudra.scheduling.explain_subjects import ExplainError, subjects
from tests.scheduling.test_allocator import CLASSES, DRIVER, exactly, h100_node, mig
from tests.scheduling.test_allocator import claim as claim_spec

A = "device.attributes['gpu.nvidia.com']"


def claim(*requests: dict) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **claim_spec(*requests)}


def template(name: str, *requests: dict) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


def cluster(nodes: int = 1, gpus: int = 2, dynamic_mig: bool = True) -> tuple[Allocator, list]:
    names = [f"node-{i}" for i in range(nodes)]
    slices = [s for n in names for s in h100_node(n, gpus, dynamic_mig=dynamic_mig)]
    return Allocator(slices, CLASSES), names


def test_subjects_from_claims_templates_and_pods():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "ml"},
           "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two"},
                                       {"name": "shared", "resourceClaimName": "c"}]}}
    documents = [template("two", exactly("gpu", "gpu.nvidia.com", 2)), pod,
                 claim(exactly("gpu", "gpu.nvidia.com")), template("alone", mig("m", "1g.10gb")),
                 {"kind": "DeviceClass", "metadata": {"name": "custom"}}]
    found, classes = subjects(documents)
    assert [s.title for s in found] == ["Pod ml/train", "ResourceClaimTemplate ml/alone"]
    assert [c["metadata"] for c in found[0].claims] == [
        {"name": "train-gpus", "namespace": "ml"}, {"name": "c", "namespace": "default"}]
    assert [c["metadata"]["name"] for c in classes] == ["custom"]


def test_dangling_pod_references_and_empty_input_are_errors():
    pod = {"kind": "Pod", "metadata": {"name": "p"},
           "spec": {"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "missing"}]}}
    with pytest.raises(ExplainError, match="ResourceClaimTemplate missing, which is not in"):
        subjects([pod])
    with pytest.raises(ExplainError, match="nothing to explain"):
        subjects([{"kind": "ConfigMap"}])


def test_allocatable_verdict_names_node_and_devices():
    allocator, nodes = cluster(gpus=2)
    (subject,), _ = subjects([template("t", mig("a", "1g.10gb"), mig("b", "3g.40gb"))])
    explanation = explain(subject, allocator, nodes)
    assert explanation.allocatable
    assert explanation.verdict == ("ALLOCATABLE on node node-0: a -> gpu-0-mig-1g10gb-19-6, "
                                   "b -> gpu-0-mig-3g40gb-9-0")
    lines = render_table(explanation)
    assert lines[0] == "ResourceClaimTemplate ml/t: 1 node (node-0)"
    assert "    chosen on node-0: gpu-0-mig-1g10gb-19-6" in lines
    assert lines[-1] == explanation.verdict


def test_not_allocatable_gives_the_blocking_reason():
    allocator, nodes = cluster(gpus=2, dynamic_mig=False)
    (subject,), _ = subjects([claim(exactly("gpu", "gpu.nvidia.com", 3))])
    explanation = explain(subject, allocator, nodes)
    assert not explanation.allocatable
    assert explanation.verdict == (
        "NOT ALLOCATABLE: request gpu: needs 3, 2 of 2 devices usable")


def test_a_typo_names_the_attribute_and_the_closest_real_one():
    allocator, nodes = cluster()
    (subject,), _ = subjects([claim(exactly("gpu", "gpu.nvidia.com", 1,
                                            f"{A}.productNmae.startsWith('NVIDIA')"))])
    explanation = explain(subject, allocator, nodes)
    assert explanation.verdict == (
        "NOT ALLOCATABLE: claim default/c: selector #0: CEL runtime error: no such key: "
        "productNmae (did you mean 'productName'?)")
    assert explanation.hints == ["attribute 'productNmae' (domain gpu.nvidia.com) is not "
                                 "published by any device; did you mean 'productName'?"]


def test_a_guarded_typo_still_gets_a_hint():
    allocator, nodes = cluster()
    (subject,), _ = subjects([claim(exactly("gpu", "gpu.nvidia.com", 1,
                                            f"{A}.?nvlinkDomian.orValue('') != ''"))])
    explanation = explain(subject, allocator, nodes)
    assert not explanation.allocatable
    assert "did you mean 'nvlinkDomain'?" in explanation.hints[0]


def test_many_nodes_are_summarised_with_counts():
    allocator, nodes = cluster(nodes=50, gpus=2)
    (subject,), _ = subjects([template("t", mig("m", "7g.80gb", 3))])
    explanation = explain(subject, allocator, nodes)
    assert explanation.verdict == (
        "NOT ALLOCATABLE: request m: needs 3, 2 of 52 devices usable (48 devices: request "
        "selector #0 is false; 2 devices: class mig.nvidia.com selector #0 is false) "
        "(on each of the 50 nodes)")
    (summary,) = explanation.requests
    assert summary.matching == 100 and summary.nodes_matching == 50
    assert summary.reasons["class mig.nvidia.com selector #0 is false"] == 100
    lines = render_table(explanation)
    assert "      2400 on 50 nodes  request selector #0 is false" in lines
    # each false selector, then what it read: the commonest values, the rest counted
    at = lines.index("      2400 on 50 nodes  request selector #0 is false")
    pad = " " * 24
    assert lines[at + 1:at + 3] == [
        f"{pad}device.attributes['gpu.nvidia.com'].profile == '7g.80gb'",
        f"{pad}700 devices: profile '1g.10gb' != '7g.80gb'"]
    assert lines[at + 5] == f"{pad}… and 3 other values"
    assert f"{pad}type 'gpu' != 'mig'" in lines
    assert len(lines) < 16
    document = to_json(explanation)
    assert len(document["nodes"]) == 50
    rejected = document["requests"][0]["rejected"][0]
    assert {k: rejected[k] for k in ("reason", "devices", "nodes")} == {
        "reason": "request selector #0 is false", "devices": 2400, "nodes": 50}
    assert rejected["expression"] == f"{A}.profile == '7g.80gb'"
    assert sum(v["devices"] for v in rejected["values"]) == 2400
    assert document["nodes"][0]["requests"][0]["matching"] == [
        "gpu-0-mig-7g80gb-0-0", "gpu-1-mig-7g80gb-0-0"]


def test_fits_on_some_nodes_only():
    allocator, nodes = cluster(nodes=3, gpus=1, dynamic_mig=False)
    taken = allocator.allocate(claim(exactly("g", "gpu.nvidia.com")), "node-0").result
    allocator = Allocator([s for n in nodes for s in h100_node(n, 1, dynamic_mig=False)],
                          CLASSES, [taken])
    (subject,), _ = subjects([claim(exactly("gpu", "gpu.nvidia.com"))])
    explanation = explain(subject, allocator, nodes)
    assert explanation.verdict == "ALLOCATABLE on node node-1: gpu -> gpu-0 (fits on 2 of 3 nodes)"
    assert explanation.requests[0].reasons == {"already allocated": 1}


def test_default_classes_follow_the_driver_name():
    (gpu, mig_class, share_class) = default_device_classes("gpu.example.com")
    assert gpu["spec"]["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.example.com' && "
        "device.attributes['gpu.example.com'].type == 'gpu'")
    assert mig_class["metadata"]["name"] == "mig.nvidia.com"
    assert share_class["metadata"]["name"] == "gpu-share.nvidia.com"


def test_first_available_states_are_shown():
    allocator, nodes = cluster(gpus=1)
    request = {"name": "gpu", "firstAvailable": [
        {"name": "full", "deviceClassName": "gpu.nvidia.com", "count": 2},
        {"name": "part", "deviceClassName": "mig.nvidia.com"}]}
    (subject,), _ = subjects([claim(request)])
    lines = render_table(explain(subject, allocator, nodes))
    assert "  request gpu/full: 2 devices of class gpu.nvidia.com [tried]" in lines
    assert "  request gpu/part: 1 device of class mig.nvidia.com [selected]" in lines
    assert DRIVER in lines[-2] or lines[-1].startswith("ALLOCATABLE")


def test_selectors_run_once_per_distinct_device_content_not_per_device():
    import json

    base = h100_node("node-0", 8)
    text = json.dumps(base)
    slices = []
    for i in range(40):  # separate dicts per node, as a real API server's JSON gives
        slices.extend(json.loads(text.replace('"node-0', f'"node-{i}')))
    allocator = Allocator(slices, CLASSES)
    profile = f"{A}.profile == '2g.20gb' && {A}.productName.contains('H100')"
    (subject,), _ = subjects([template("t", exactly("m", "mig.nvidia.com", 1, profile))])
    from gpudra.scheduling.cel import compile_selector

    selectors = [compile_selector(profile),
                 compile_selector(CLASSES[1]["spec"]["selectors"][0]["cel"]["expression"])]
    before = [s.evaluations for s in selectors]
    explanation = explain(subject, allocator, [f"node-{i}" for i in range(40)])
    assert explanation.verdict.endswith("(fits on 40 of 40 nodes)")
    assert explanation.requests[0].matching == 40 * 8 * 3
    assert [s.evaluations - b for s, b in zip(selectors, before, strict=True)] <= [8, 2]


# --- every device counted once ----------------------------------------------------------

def test_a_device_is_usable_or_not_never_both():
    # A full H100 and its 7g.80gb partition both pass their selectors, but one takes the
    # counters the other needs: the partition is usable, and not chosen for that reason.
    allocator, nodes = cluster(gpus=1)
    (subject,), _ = subjects([claim(exactly("gpu", "gpu.nvidia.com"), mig("m", "7g.80gb"))])
    explanation = explain(subject, allocator, nodes)
    (trace,) = [t for t in explanation.allocations[0].requests if t.request == "m"]
    (summary,) = [s for s in explanation.requests if s.request == "m"]
    assert summary.matching == 1
    assert summary.matching + sum(summary.reasons.values()) == len(trace.outcomes)
    assert list(summary.conflicts.values()) == [1]
    assert not set(summary.conflicts) & set(summary.reasons)
    lines = render_table(explanation)
    at = lines.index("    usable, but not chosen:")
    assert lines[at - 1] == "    1 device usable"
    # The GPU the other request takes, not the first counter of its set that ran short.
    assert "held by GPU gpu-0, which request gpu takes" in lines[at + 1]
    assert explanation.verdict.endswith("(1 device)")
    document = to_json(explanation)["requests"][1]
    assert document["usable"] == 1 and len(document["notChosen"]) == 1
    assert sum(r["devices"] for r in document["rejected"]) == len(trace.outcomes) - 1


def test_counters_held_by_allocated_devices_make_a_device_not_usable():
    slices = h100_node("node-0", 1)
    taken = Allocator(slices, CLASSES).allocate(claim(mig("m", "1g.10gb")), "node-0").result
    allocator = Allocator(slices, CLASSES, [taken])
    (subject,), _ = subjects([claim(exactly("gpu", "gpu.nvidia.com"))])
    explanation = explain(subject, allocator, ["node-0"])
    (summary,) = explanation.requests
    assert summary.matching == 0 and not summary.conflicts
    # Named: the allocated MIG device, not the first counter of the set that ran short.
    assert any(r.startswith("held by allocated MIG device gpu-0-mig-1g10gb-")
               for r in summary.reasons), summary.reasons


# --- why a selector is false, with the values it read -----------------------------------

def test_a_false_selector_shows_what_it_read():
    allocator, nodes = cluster(gpus=2, dynamic_mig=False)
    memory = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0"
    (subject,), _ = subjects([claim(exactly("gpu", "gpu.nvidia.com", 1, memory,
                                            f"{A}.productName.contains('A100')"))])
    explanation = explain(subject, allocator, nodes)
    (summary,) = explanation.requests
    detail = summary.details["request selector #0 is false"]
    assert detail.expression == memory
    assert dict(detail.values) == {"memory 79.6Gi (81559Mi) < 80Gi": 2}
    lines = render_table(explanation)
    at = lines.index("      2  request selector #0 is false")
    assert lines[at + 1:at + 3] == [f"         {memory}",
                                    "         memory 79.6Gi (81559Mi) < 80Gi"]


@pytest.mark.parametrize(("expression", "why"), [
    (f"{A}.productName.contains('h100')",
     "productName 'NVIDIA H100 80GB HBM3' does not contain 'h100'"),
    (f"{A}.productName.lowerAscii().startsWith('nvidia a100')",
     "productName.lowerAscii() 'nvidia h100 80gb hbm3' does not start with 'nvidia a100'"),
    (f"{A}.productName.matches('A100') || {A}.numaNode > 5",
     "productName 'NVIDIA H100 80GB HBM3' does not match 'A100'; numaNode 0 <= 5"),
    (f"!({A}.type == 'gpu')", "type 'gpu' == 'gpu'"),
    (f"has({A}.nvlinkDomain) && !has({A}.uuid)", "uuid is set on the device"),
    ("device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('80G')) == false",
     "memory.isGreaterThan(quantity('80G')) true != false"),
    (f"{A}.driverVersion.compareTo(semver('999.0.0')) >= 0",
     "driverVersion 580.95.5 < 999.0.0"),
    ("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('90G')) >= 0",
     "memory 79.6Gi (81559Mi) < 83.8Gi (90G)"),
    (f"[1, 2].exists(i, i == {A}.numaNode)", "[1, 2].exists(i, i == numaNode) is false"),
])
def test_why_names_operands_and_values(expression, why):
    from gpudra.scheduling.cel import compile_selector
    from gpudra.scheduling.selector_why import SelectorWhy

    (gpu,) = [e for e in Allocator(h100_node("n", 1, dynamic_mig=False), CLASSES)
              .index.for_node("n").devices if e.name == "gpu-0"]
    selector = compile_selector(expression)
    assert selector.result(gpu.view) is False
    assert SelectorWhy().why(selector, gpu.view) == why


# --- opaque configs, checked as prepare will ------------------------------------------

def _config(kind: str, requests: list[str], **fields: object) -> dict:
    return {"requests": requests, "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, **fields}}}


def test_an_invalid_config_fails_at_prepare_with_its_field_path():
    allocator, nodes = cluster(gpus=1, dynamic_mig=False)
    bad = claim(exactly("gpu", "gpu.nvidia.com"))
    bad["spec"]["devices"]["config"] = [_config("GpuConfig", [], sharing={
        "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "VeryLong"}})]
    (subject,), _ = subjects([bad])
    explanation = explain(subject, allocator, nodes)
    assert explanation.allocatable and not explanation.ok
    (error,) = explanation.config_errors
    assert error.startswith("ResourceClaim default/c: spec.devices.config[0].opaque.parameters"
                            ".sharing.timeSlicingConfig.interval: ")
    assert explanation.verdict.startswith(f"FAILS AT PREPARE: {error}; the scheduler would "
                                          "allocate on node node-0: gpu -> gpu-0")
    assert f"  config: {error}" in render_table(explanation)
    assert to_json(explanation)["configErrors"] == [error]


def test_a_config_for_the_wrong_device_type_fails_at_prepare():
    allocator, nodes = cluster(gpus=1)
    wrong = claim(mig("m", "1g.10gb"))
    wrong["spec"]["devices"]["config"] = [_config("GpuConfig", ["m"])]
    (subject,), _ = subjects([wrong])
    explanation = explain(subject, allocator, nodes)
    (error,) = explanation.config_errors
    assert error == ("ResourceClaim default/c: spec.devices.config[0]: a GpuConfig but "
                     "request 'm' got mig device 'gpu-0-mig-1g10gb-19-6'; use MigDeviceConfig "
                     "for it")
    right = claim(mig("m", "1g.10gb"))
    right["spec"]["devices"]["config"] = [_config("MigDeviceConfig", ["m"])]
    (subject,), _ = subjects([right])
    assert explain(subject, allocator, nodes).ok


def test_class_configs_are_checked_too():
    strict = {**CLASSES[0], "spec": {**CLASSES[0]["spec"], "config": [
        {"opaque": _config("GpuConfig", [], computeMode="Sometimes")["opaque"]}]}}
    allocator = Allocator(h100_node("node-0", 1, dynamic_mig=False), [strict, CLASSES[1]])
    (subject,), _ = subjects([claim(exactly("gpu", "gpu.nvidia.com"))])
    (error,) = explain(subject, allocator, ["node-0"]).config_errors
    assert error.startswith("DeviceClass gpu.nvidia.com: spec.config[0].opaque.parameters."
                            "computeMode: ")


# --- extended resources -------------------------------------------------------------------

def _pod(limits: dict, init: dict | None = None, requests: dict | None = None) -> dict:
    resources: dict = {"limits": limits}
    if requests:
        resources["requests"] = requests
    spec: dict = {"containers": [{"name": "c", "image": "x", "resources": resources}]}
    if init:
        spec["initContainers"] = [{"name": "i", "image": "x", "resources": {"limits": init}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
            "spec": spec}


def test_a_pod_with_extended_resources_gets_the_claim_the_scheduler_makes():
    gpu_class = {**CLASSES[0], "spec": {**CLASSES[0]["spec"],
                                        "extendedResourceName": "nvidia.com/gpu"}}
    pod = _pod({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2"},
               init={f"deviceclass.resource.kubernetes.io/{CLASSES[1]['metadata']['name']}": 1})
    (subject,), _ = subjects([pod], [gpu_class, CLASSES[1]])
    (extended,) = subject.claims
    assert extended["metadata"] == {"name": "p-extended-resources", "namespace": "ml"}
    # container 0 is the init container; the index is the resource's among the sorted names
    assert extended["spec"]["devices"]["requests"] == [
        {"name": "container-0-request-0", "exactly": {
            "deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1}},
        {"name": "container-1-request-2", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}}]
    # the init container's partition and the two GPUs are devices of one claim: no overlap
    allocator = Allocator(h100_node("node-0", 3), [gpu_class, CLASSES[1]])
    explanation = explain(subject, allocator, ["node-0"])
    assert explanation.ok
    assert explanation.verdict == (
        "ALLOCATABLE on node node-0: container-0-request-0 -> gpu-0-mig-1g10gb-19-6, "
        "container-1-request-2 -> gpu-1, container-1-request-2 -> gpu-2")


def test_an_extended_resource_no_class_provides_is_not_allocatable():
    (subject,), _ = subjects([_pod({"nvidia.com/gpu": 1})], CLASSES)
    assert subject.claims == [] and subject.unavailable == ["nvidia.com/gpu"]
    explanation = explain(subject, Allocator(h100_node("node-0", 1), CLASSES), ["node-0"])
    assert not explanation.allocatable
    assert explanation.verdict == ("NOT ALLOCATABLE: no DeviceClass provides nvidia.com/gpu "
                                   "(extendedResourceName); only a device plugin could")


def test_the_newest_class_provides_a_shared_extended_resource():
    from gpudra.scheduling.explain_subjects import extended_resource_classes

    def named(name: str, created: str) -> dict:
        return {"metadata": {"name": name, "creationTimestamp": created},
                "spec": {"extendedResourceName": "example.com/gpu"}}

    mapping = extended_resource_classes([named("b", "2026-01-01T00:00:00Z"),
                                         named("a", "2026-01-01T00:00:00Z"),
                                         named("old", "2025-01-01T00:00:00Z")])
    assert mapping["example.com/gpu"] == "a"
    assert mapping["deviceclass.resource.kubernetes.io/old"] == "old"
