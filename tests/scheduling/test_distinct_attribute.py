"""``distinctAttribute`` as the 1.36 scheduler applies it, not as its API text reads.

The API (``DeviceConstraint.distinctAttribute``) says the value must be "unique across those
devices". The 1.36 allocator (``structured/internal/incubating``, ``distinctAttributeConstraint``)
keeps one value per request name, overwritten by each device of that request and deleted
when any of them is given back, so a candidate is only compared with the last device each
request took (kubernetes#140438, fixed after 1.36 by #140600). A differential case on a
DGX A100 (two GPUs per NUMA node) showed it: a distinct ``numaNode`` claim got two GPUs of
one node from the scheduler. ``gpudra explain`` predicts the scheduler, so ours does the same.

Each case is checked against the real allocator too when ``dra-allocate`` is at hand.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from gpudra.scheduling.allocator import allocate
from gpudra.scheduling.explain import default_device_classes
from tests.scheduling.test_differential import ORACLE

DRIVER = "gpu.nvidia.com"
NODE = "n1"
CLASSES = default_device_classes(DRIVER)
NUMA = f"{DRIVER}/numaNode"
PAIRS = (0, 0, 1, 1, 2, 2, 3, 3)
"""NUMA nodes of 8 GPUs, two per node (a DGX A100's layout)."""


def node(numa: tuple[int, ...]) -> list[dict[str, Any]]:
    devices = [{"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "numaNode": {"int": n},
        "resource.kubernetes.io/numaNode": {"int": n}}} for i, n in enumerate(numa)]
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{NODE}-gpus"},
             "spec": {"driver": DRIVER, "nodeName": NODE, "devices": devices,
                      "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}}}]


def claim(*counts: int, attribute: str = NUMA) -> dict[str, Any]:
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                              "allocationMode": "ExactCount", "count": c}}
                for i, c in enumerate(counts)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"devices": {"requests": requests,
                                 "constraints": [{"distinctAttribute": attribute}]}}}


def held(*names: str) -> list[dict[str, Any]]:
    results = [{"request": f"h{i}", "driver": DRIVER, "pool": NODE, "device": d}
               for i, d in enumerate(names)]
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "held", "namespace": "default"},
             "spec": {"devices": {"requests": [
                 {"name": r["request"], "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                 for r in results]}},
             "status": {"allocation": {"devices": {"results": results}}}}] if names else []


def chosen(results: dict[str, Any] | None) -> list[tuple[str, str]] | None:
    if results is None:
        return None
    return [(r["request"], r["device"]) for r in results["devices"]["results"]]


def oracle(slices: list[dict[str, Any]], allocated: list[dict[str, Any]],
           pod_claim: dict[str, Any], tmp_path: Any) -> list[tuple[str, str]] | None:
    assert ORACLE is not None
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                  "items": [*CLASSES, *slices, *allocated, pod_claim]}))
    done = subprocess.run([str(ORACLE), "-node", NODE, str(inputs)], capture_output=True,
                          text=True, timeout=60, check=False)
    answer = json.loads(done.stdout)
    assert answer["outcome"] in ("allocated", "unschedulable"), answer
    if answer["outcome"] != "allocated":
        return None
    return chosen(answer["results"]["default/c"])


CASES = [
    pytest.param(PAIRS, (4,), (), [("r0", "gpu-0"), ("r0", "gpu-2"), ("r0", "gpu-4"),
                                   ("r0", "gpu-6")], id="one-request-four-nodes"),
    # r1's candidates are compared with r0's last device (gpu-2, node 1) only: gpu-1
    # shares node 0 with r0's gpu-0 and is taken.
    pytest.param(PAIRS, (2, 2), (), [("r0", "gpu-0"), ("r0", "gpu-2"), ("r1", "gpu-1"),
                                     ("r1", "gpu-4")], id="second-request-repeats-a-node"),
    # Within one request only consecutive picks must differ: gpu-3 (node 0) after gpu-1.
    pytest.param((0, 1, 1, 0), (3,), (), [("r0", "gpu-0"), ("r0", "gpu-1"), ("r0", "gpu-3")],
                 id="count-three-repeats-a-node"),
    pytest.param(PAIRS, (4,), ("gpu-2", "gpu-3"), None, id="three-nodes-left-for-four"),
    pytest.param(PAIRS, (5,), (), None, id="five-of-four-nodes"),
]


@pytest.mark.parametrize(("numa", "counts", "busy", "expected"), CASES)
def test_distinct_attribute_as_the_136_scheduler(numa, counts, busy, expected, tmp_path):
    slices, allocated, pod_claim = node(numa), held(*busy), claim(*counts)
    allocation = allocate(slices, CLASSES, allocated, pod_claim, NODE)
    assert allocation.error is None
    assert chosen(allocation.result) == expected
    if ORACLE is not None:
        assert oracle(slices, allocated, pod_claim, tmp_path) == expected


@pytest.mark.parametrize("attribute", ["numaNode", "resource.kubernetes.io/numaNode",
                                       "gpu.nvidia.com/numaNode", "gpu.nvidia.com/noSuch"])
def test_each_name_of_the_numa_attribute_is_looked_up_like_the_scheduler(attribute, tmp_path):
    """lookupAttribute: the name as written, then the bare name if its domain is the
    driver's; a bare name as written finds our own ``numaNode``; missing means no device."""
    slices, pod_claim = node(PAIRS), claim(2, 2, attribute=attribute)
    allocation = allocate(slices, CLASSES, [], pod_claim, NODE)
    expected = None if attribute.endswith("noSuch") else [
        ("r0", "gpu-0"), ("r0", "gpu-2"), ("r1", "gpu-1"), ("r1", "gpu-4")]
    assert chosen(allocation.result) == expected
    if ORACLE is not None:
        assert oracle(slices, [], pod_claim, tmp_path) == expected
