"""Desired vs stored slices: semantic comparison, the write plan and its generation rule,
and the PUT body built from a stored object.

Stored objects are made the way the apiserver makes them: our dict plus server metadata,
canonicalised quantities and server-set taint times.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpudra.controller.slice_diff import (
    plan_sync,
    replacement,
    slice_difference,
    slices_equal,
    vanished,
)
from gpudra.controller.slices import OwnerRef, build_slices
from gpudra.driver.devices import (
    CounterConsumption,
    CounterSet,
    Device,
    NodeDevices,
    Taint,
    Version,
)

DRIVER = "gpu.nvidia.com"
NODE = "node-1"
GIB = 2**30
OWNER = OwnerRef(name=NODE, uid="0b6e6f5c-0000-4000-8000-000000000001")

Obj = dict[str, Any]


def gpu(minor: int, *, taints: tuple[Taint, ...] = (), memory: int = 80 * GIB) -> Device:
    return Device(
        name=f"gpu-{minor}", group=f"gpu-{minor}",
        attributes={"type": "gpu", "productName": "NVIDIA H100 80GB HBM3",
                    "cudaComputeCapability": Version("9.0.0"), "numaNode": 1,
                    "migEnabled": False},
        capacity={"memory": memory, "multiprocessors": 132},
        taints=taints)


def mig(minor: int, start: int) -> Device:
    return Device(
        name=f"gpu-{minor}-mig-1g10gb-{start}", group=f"gpu-{minor}",
        attributes={"type": "mig", "profile": "1g.10gb"},
        capacity={"memory": 10 * GIB},
        consumes_counters=(CounterConsumption(f"gpu-{minor}-counters",
                                              {"memory": 10 * GIB, "compute-slices": 1}),))


def node(*devices: Device, counter_sets: tuple[CounterSet, ...] = ()) -> NodeDevices:
    return NodeDevices(tuple(devices), counter_sets,
                       tuple(dict.fromkeys(d.group for d in devices)))


def pool(devices: NodeDevices, generation: int = 1) -> list[Obj]:
    return build_slices(devices, driver=DRIVER, node_name=NODE, generation=generation,
                        owner=OWNER)


def builder(devices: NodeDevices) -> Callable[[int], list[Obj]]:
    return lambda generation: pool(devices, generation)


def stored(obj: Obj, rv: int = 10) -> Obj:
    """``obj`` as the apiserver returns it: server metadata, and no kind in list items."""
    out = copy.deepcopy(obj)
    out.pop("kind")
    out.pop("apiVersion")
    out["metadata"] |= {"uid": f"uid-{out['metadata']['name']}", "resourceVersion": str(rv),
                        "creationTimestamp": "2026-11-22T04:00:00Z", "generation": 1,
                        "managedFields": [{"manager": "gpudra", "operation": "Update"}]}
    return out


def cache(slices: list[Obj]) -> dict[str, Obj]:
    return {s["metadata"]["name"]: stored(s) for s in slices}


TAINT = Taint("gpu.nvidia.com/xid", "79", "NoSchedule")
BASE = node(gpu(0, taints=(TAINT,)), mig(0, 0), mig(0, 1), gpu(1),
            counter_sets=(CounterSet("gpu-0-counters",
                                     {"memory": 80 * GIB, "compute-slices": 7}),))


def base_slice() -> Obj:
    """The gpu-0 slice: a tainted GPU and two counter-consuming MIG devices."""
    return pool(BASE)[1]


def counters_slice() -> Obj:
    return pool(BASE)[0]


# --- semantic comparison --------------------------------------------------------------------

Mutation = Callable[[Obj], None]


def _set(path: str, value: Any) -> Mutation:
    """Set a dotted path (``[n]`` for list indices)."""

    def apply(obj: Obj) -> None:
        *parents, last = _steps(path)
        node: Any = obj
        for step in parents:
            node = node[step]
        node[last] = value

    return apply


def _del(path: str) -> Mutation:
    def apply(obj: Obj) -> None:
        *parents, last = _steps(path)
        node: Any = obj
        for step in parents:
            node = node[step]
        del node[last]

    return apply


def _steps(path: str) -> list[str | int]:
    steps: list[str | int] = []
    for part in path.split("."):
        name, _, rest = part.partition("[")
        steps.append(name)
        if rest:
            steps.append(int(rest.rstrip("]")))
    return steps


def _reverse_maps(obj: Obj) -> None:
    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(node[k]) for k in reversed(list(node))}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    obj["spec"] = walk(obj["spec"])


def _swap_devices(obj: Obj) -> None:
    devices = obj["spec"]["devices"]
    devices[1], devices[2] = devices[2], devices[1]


def _server_time_added(obj: Obj) -> None:
    obj["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-11-22T04:00:00Z"


def _as_list_item(obj: Obj) -> None:
    del obj["kind"], obj["apiVersion"]


def _extra_owner(obj: Obj) -> None:
    obj["metadata"]["ownerReferences"].append(
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "other"})


EQUAL: list[tuple[str, Mutation]] = [
    ("identical", lambda obj: None),
    ("server metadata", lambda obj: obj.update(stored(obj))),
    ("foreign label and annotation", lambda obj: obj["metadata"].update(
        labels={**obj["metadata"]["labels"], "team": "ml"}, annotations={"a": "b"})),
    ("another owner next to ours", _extra_owner),
    ("no kind or apiVersion (list item)", _as_list_item),
    ("capacity in another unit", _set("spec.devices[0].capacity.memory.value", "81920Mi")),
    ("capacity as plain bytes", _set("spec.devices[0].capacity.memory.value", str(80 * GIB))),
    ("capacity 132 as 132000m", _set("spec.devices[0].capacity.multiprocessors.value",
                                     "132000m")),
    ("consumed counter 10Gi as 10240Mi",
     _set("spec.devices[1].consumesCounters[0].counters.memory.value", "10240Mi")),
    ("consumed counter 1 as 1e0",
     _set("spec.devices[1].consumesCounters[0].counters.compute-slices.value", "1e0")),
    ("map keys in another order", _reverse_maps),
    ("timeAdded set by the server", _server_time_added),
    ("empty list for a missing one", _set("spec.sharedCounters", [])),
    ("null for a missing list", _set("spec.devices[2].taints", None)),
]


def _type_change(obj: Obj) -> None:
    obj["spec"]["devices"][0]["attributes"]["numaNode"] = {"string": "1"}


DIFFERENT: list[tuple[str, Mutation, str]] = [
    ("int attribute stored as a string", _type_change,
     "spec.devices[0].attributes.numaNode.int"),
    ("int attribute stored as a bool",
     _set("spec.devices[0].attributes.numaNode", {"int": True}),
     "spec.devices[0].attributes.numaNode.int"),
    ("bool attribute stored as an int",
     _set("spec.devices[0].attributes.migEnabled", {"bool": 0}),
     "spec.devices[0].attributes.migEnabled.bool"),
    ("version attribute stored as a string",
     _set("spec.devices[0].attributes.cudaComputeCapability", {"string": "9.0.0"}),
     "spec.devices[0].attributes.cudaComputeCapability.string"),
    ("other attribute value", _set("spec.devices[0].attributes.productName.string", "H200"),
     "spec.devices[0].attributes.productName.string"),
    ("smaller capacity", _set("spec.devices[0].capacity.memory.value", "79Gi"),
     "spec.devices[0].capacity.memory.value"),
    ("unparsable quantity", _set("spec.devices[0].capacity.memory.value", "lots"),
     "spec.devices[0].capacity.memory.value"),
    ("devices reordered", _swap_devices, "spec.devices[1].name"),
    ("device dropped", lambda obj: obj["spec"]["devices"].pop(), "spec.devices"),
    ("attribute dropped", _del("spec.devices[0].attributes.numaNode"),
     "spec.devices[0].attributes.numaNode"),
    ("attribute added", _set("spec.devices[0].attributes.extra", {"int": 1}),
     "spec.devices[0].attributes.extra"),
    ("taint dropped", _del("spec.devices[0].taints"), "spec.devices[0].taints"),
    ("taint effect", _set("spec.devices[0].taints[0].effect", "NoExecute"),
     "spec.devices[0].taints[0].effect"),
    ("generation", _set("spec.pool.generation", 2), "spec.pool.generation"),
    ("slice count", _set("spec.pool.resourceSliceCount", 2), "spec.pool.resourceSliceCount"),
    ("unknown spec field the server keeps", _set("spec.perDeviceNodeSelection", True),
     "spec.perDeviceNodeSelection"),
    ("our label missing", _del("metadata.labels"),
     "metadata.labels[app.kubernetes.io/managed-by]"),
    ("owner of another node object", _set("metadata.ownerReferences[0].uid", "old-uid"),
     "metadata.ownerReferences"),
    ("name", _set("metadata.name", "other"), "metadata.name"),
]


@pytest.mark.parametrize(("case", "mutate"), EQUAL, ids=[c for c, _ in EQUAL])
def test_stored_forms_that_say_the_same_are_equal(case: str, mutate: Mutation) -> None:
    desired = base_slice()
    actual = copy.deepcopy(desired)
    mutate(actual)

    assert slice_difference(desired, actual) is None
    assert slices_equal(desired, actual)


@pytest.mark.parametrize(("case", "mutate", "field"), DIFFERENT,
                         ids=[c for c, _, _ in DIFFERENT])
def test_real_differences_are_found_and_named(case: str, mutate: Mutation,
                                              field: str) -> None:
    desired = base_slice()
    actual = copy.deepcopy(desired)
    mutate(actual)

    assert slice_difference(desired, actual) == field
    assert not slices_equal(desired, actual)


def test_shared_counters_compare_by_value() -> None:
    desired = counters_slice()
    actual = stored(desired)
    actual["spec"]["sharedCounters"][0]["counters"]["memory"]["value"] = "81920Mi"
    assert slices_equal(desired, actual)

    actual["spec"]["sharedCounters"][0]["counters"]["memory"]["value"] = "81919Mi"
    assert slice_difference(desired, actual) == \
        "spec.sharedCounters[0].counters.memory.value"


@pytest.mark.parametrize(("stored_time", "equal"), [
    ("2026-11-22T04:00:00Z", True),
    ("2026-11-22T04:00:00+00:00", True),  # same instant, other spelling
    ("2026-11-22T04:00:01Z", True),  # Go tolerates ±1 s too
    ("2026-11-22T04:00:02Z", False),
    (None, False),  # we asked for a time; a stored taint without one differs
])
def test_a_desired_time_added_is_compared_as_a_time(stored_time: str | None,
                                                    equal: bool) -> None:
    timed = Taint(TAINT.key, TAINT.value, TAINT.effect, time_added="2026-11-22T04:00:00Z")
    desired = pool(node(gpu(0, taints=(timed,))))[0]
    actual = stored(desired)
    taint = actual["spec"]["devices"][0]["taints"][0]
    if stored_time is None:
        del taint["timeAdded"]
    else:
        taint["timeAdded"] = stored_time

    assert slices_equal(desired, actual) is equal


def test_a_server_time_added_does_not_hide_other_taint_changes() -> None:
    desired = base_slice()
    actual = stored(desired)
    _server_time_added(actual)
    actual["spec"]["devices"][0]["taints"][0]["value"] = "48"

    assert slice_difference(desired, actual) == "spec.devices[0].taints[0].value"


def test_quantities_outside_quantity_fields_compare_as_text() -> None:
    desired = base_slice()
    actual = copy.deepcopy(desired)
    actual["spec"]["devices"][1]["attributes"]["profile"] = {"string": "1.10gb"}  # not "1g.10gb"

    assert not slices_equal(desired, actual)


# --- the plan -------------------------------------------------------------------------------


def names(objs: Any) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


def generations(objs: Any) -> set[int]:
    return {o["spec"]["pool"]["generation"] for o in objs}


def test_an_empty_server_gets_every_slice_at_generation_one() -> None:
    plan = plan_sync(builder(BASE), {})

    assert plan.generation == 1 and plan.bumped
    assert names(plan.creates) == names(pool(BASE))
    assert not plan.updates and not plan.deletes
    assert plan.writes == 3
    assert plan.devices == 4


def test_a_pool_that_is_already_there_costs_nothing() -> None:
    plan = plan_sync(builder(BASE), cache(pool(BASE, generation=4)))

    assert plan.writes == 0
    assert plan.generation == 4 and not plan.bumped
    assert generations(plan.desired) == {4}


def test_one_changed_slice_is_updated_in_place_at_the_same_generation() -> None:
    changed = node(gpu(0, taints=(TAINT,)), mig(0, 0), mig(0, 1), gpu(1, memory=40 * GIB),
                   counter_sets=BASE.counter_sets)
    plan = plan_sync(builder(changed), cache(pool(BASE, generation=3)))

    assert plan.generation == 3 and not plan.bumped
    assert [u.name for u in plan.updates] == ["node-1-gpu.nvidia.com-gpu-1"]
    assert plan.updates[0].reason == "spec.devices[0].capacity.memory.value"
    assert not plan.creates and not plan.deletes


def test_two_changed_slices_move_the_whole_pool_to_a_new_generation() -> None:
    changed = node(gpu(0), mig(0, 0), mig(0, 1), gpu(1, memory=40 * GIB),
                   counter_sets=BASE.counter_sets)
    plan = plan_sync(builder(changed), cache(pool(BASE, generation=3)))

    assert plan.generation == 4 and plan.bumped
    assert [u.name for u in plan.updates] == names(pool(BASE))  # all three, counters too
    assert generations(u.desired for u in plan.updates) == {4}


def test_a_new_gpu_moves_the_pool_and_rewrites_every_slice() -> None:
    grown = node(*BASE.devices, gpu(2), counter_sets=BASE.counter_sets)
    plan = plan_sync(builder(grown), cache(pool(BASE, generation=2)))

    assert plan.generation == 3 and plan.bumped
    assert names(plan.creates) == ["node-1-gpu.nvidia.com-gpu-2"]
    assert len(plan.updates) == 3
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in plan.desired} == {4}


def test_a_dropped_gpu_deletes_its_slice_and_recounts_the_rest() -> None:
    shrunk = node(*BASE.devices[:3], counter_sets=BASE.counter_sets)
    plan = plan_sync(builder(shrunk), cache(pool(BASE, generation=2)))

    assert names(plan.deletes) == ["node-1-gpu.nvidia.com-gpu-1"]
    assert plan.bumped and plan.generation == 3
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in plan.desired} == {2}
    assert [u.name for u in plan.updates] == names(pool(shrunk))


def test_a_stray_slice_is_deleted_without_moving_the_generation() -> None:
    actual = cache(pool(BASE, generation=2))
    stray = stored(pool(node(gpu(7)))[0])
    stray["metadata"]["name"] = "node-1-gpu.nvidia.com-old-naming"
    actual["node-1-gpu.nvidia.com-old-naming"] = stray

    plan = plan_sync(builder(BASE), actual)

    assert names(plan.deletes) == ["node-1-gpu.nvidia.com-old-naming"]
    assert plan.writes == 1 and plan.generation == 2 and not plan.bumped


def test_the_generation_never_goes_below_the_floor() -> None:
    # After a wipe the server holds nothing; we had written generation 5 before.
    plan = plan_sync(builder(BASE), {}, floor=5)

    assert plan.generation == 6
    assert generations(plan.creates) == {6}


def test_a_cut_short_generation_move_is_resumed_not_restarted() -> None:
    new = pool(BASE, generation=3)
    actual = cache(pool(BASE, generation=2))
    actual[new[0]["metadata"]["name"]] = stored(new[0])  # one of three written before failing

    assert plan_sync(builder(BASE), actual).generation == 4  # without resume: start over
    plan = plan_sync(builder(BASE), actual, resume=3)

    assert plan.generation == 3 and not plan.bumped
    assert [u.name for u in plan.updates] == names(new[1:])


def test_a_resume_for_another_generation_is_ignored() -> None:
    grown = node(*BASE.devices, gpu(2), counter_sets=BASE.counter_sets)
    plan = plan_sync(builder(grown), cache(pool(BASE, generation=2)), resume=7)

    assert plan.generation == 3 and plan.bumped


def test_the_comparison_can_be_replaced() -> None:
    changed = node(gpu(0), mig(0, 0), mig(0, 1), gpu(1, memory=40 * GIB),
                   counter_sets=BASE.counter_sets)
    plan = plan_sync(builder(changed), cache(pool(BASE)), same=lambda desired, actual: True)

    assert plan.writes == 0


def test_vanished_names_the_published_slices_that_must_be_recreated() -> None:
    actual = cache(pool(BASE))
    del actual["node-1-gpu.nvidia.com-gpu-0"]
    plan = plan_sync(builder(BASE), actual)

    assert vanished(plan, names(pool(BASE))) == ["node-1-gpu.nvidia.com-gpu-0"]
    assert vanished(plan, []) == []


# --- the PUT body ---------------------------------------------------------------------------


def test_replacement_keeps_foreign_metadata_and_takes_our_spec() -> None:
    desired = base_slice()
    actual = stored(desired, rv=41)
    actual["metadata"]["labels"]["team"] = "ml"
    actual["metadata"]["annotations"] = {"note": "keep me"}
    actual["metadata"]["finalizers"] = ["example.com/hold"]
    actual["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "old-uid", "controller": True},
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm"}]
    actual["spec"]["devices"].pop()
    actual["futureTopLevelField"] = {"kept": True}

    body = replacement(actual, desired)

    assert body["spec"] == desired["spec"]
    assert body["kind"] == "ResourceSlice" and body["apiVersion"] == "resource.k8s.io/v1"
    meta = body["metadata"]
    assert meta["resourceVersion"] == "41" and meta["uid"] == actual["metadata"]["uid"]
    assert "managedFields" not in meta
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "gpudra", "team": "ml"}
    assert meta["annotations"] == {"note": "keep me"}
    assert meta["finalizers"] == ["example.com/hold"]
    assert [r["uid"] for r in meta["ownerReferences"]] == [OWNER.uid, "cm"]
    assert body["futureTopLevelField"] == {"kept": True}
    assert slices_equal(desired, body)
