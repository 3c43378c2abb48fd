"""explain: which claims, allocated on which node, and a readable why-not for many nodes."""

from __future__ import annotations

import pytest

from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.explain import (
    ExplainError,
    default_device_classes,
    explain,
    render_table,
    subjects,
    to_json,
)
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
        "(on all 50 nodes)")
    (summary,) = explanation.requests
    assert summary.matching == 100 and summary.nodes_matching == 50
    assert summary.reasons["class mig.nvidia.com selector #0 is false"] == 100
    lines = render_table(explanation)
    assert "      2400 on 50 nodes  request selector #0 is false" in lines
    assert len(lines) < 12
    document = to_json(explanation)
    assert len(document["nodes"]) == 50
    assert document["requests"][0]["rejected"][0] == {
        "reason": "request selector #0 is false", "devices": 2400, "nodes": 50}
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
    (gpu, mig_class) = default_device_classes("gpu.example.com")
    assert gpu["spec"]["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.example.com' && "
        "device.attributes['gpu.example.com'].type == 'gpu'")
    assert mig_class["metadata"]["name"] == "mig.nvidia.com"


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
