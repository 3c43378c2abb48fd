"""Devices → ResourceSlice dicts: layout, names, order, encoding and limits."""

from __future__ import annotations

import copy
import json
import re

import pytest

from gpudra.api.name_formats import dns1123_subdomain_errors
from gpudra.controller.pool_validation import validate_pool
from gpudra.controller.slice_validation import ensure_valid, validate_slice
from gpudra.controller.slices import (
    OwnerRef,
    build_slices,
    encode_attribute,
    encode_device,
    slice_list,
    slice_name,
)
from gpudra.driver.devices import (
    CounterConsumption,
    CounterSet,
    Device,
    NodeDevices,
    RequestPolicy,
    Taint,
    Version,
)

DRIVER = "gpu.nvidia.com"
NODE = "node-1"
GIB = 2**30


# --- device helpers -------------------------------------------------------------------------


def plain_gpu(minor: int, *, taints: tuple[Taint, ...] = ()) -> Device:
    return Device(
        name=f"gpu-{minor}",
        group=f"gpu-{minor}",
        attributes={
            "type": "gpu",
            "uuid": f"GPU-{minor:08d}-0000-0000-0000-000000000000",
            "productName": "NVIDIA H100 80GB HBM3",
            "cudaComputeCapability": Version("9.0.0"),
            "numaNode": 0,
            "migEnabled": False,
            "resource.kubernetes.io/pciBusID": f"0000:{minor + 0x18:02x}:00.0",
        },
        capacity={"memory": 80 * GIB, "multiprocessors": 132},
        taints=taints,
    )


# (profile, compute slices, memory slices, start positions) of an A100 40GB: 25 placements.
A100_PLACEMENTS = [
    ("1g5gb", 1, 1, range(7)),
    ("1g5gb-me", 1, 1, range(7)),
    ("1g10gb", 1, 2, (0, 2, 4, 6)),
    ("2g10gb", 2, 2, (0, 2, 4)),
    ("3g20gb", 3, 4, (0, 4)),
    ("4g20gb", 4, 4, (0,)),
    ("7g40gb", 7, 8, (0,)),
]


def partitionable_gpu(minor: int) -> tuple[CounterSet, list[Device]]:
    """A dynamic-MIG GPU: 8 memory-slice counters + capacity counters, 26 devices."""
    counters = {f"memory-slice-{i}": 1 for i in range(8)}
    counters |= {"memory": 40 * GIB, "multiprocessors": 98, "copy-engines": 7}
    counter_set = CounterSet(f"gpu-{minor}-counter-set", counters)
    full = Device(
        name=f"gpu-{minor}",
        group=f"gpu-{minor}",
        attributes={"type": "gpu", "productName": "NVIDIA A100-SXM4-40GB"},
        capacity={"memory": 40 * GIB, "multiprocessors": 98},
        consumes_counters=(CounterConsumption(counter_set.name, dict(counters)),),
    )
    devices = [full]
    for label, compute, size, starts in A100_PLACEMENTS:
        for start in starts:
            used = {f"memory-slice-{i}": 1 for i in range(start, start + size)}
            used |= {"memory": 5 * GIB * size, "multiprocessors": 14 * compute}
            devices.append(Device(
                name=f"gpu-{minor}-mig-{label}-{start}",
                group=f"gpu-{minor}",
                attributes={"type": "mig", "profile": label, "placementStart": start},
                capacity={"memory": 5 * GIB * size},
                consumes_counters=(CounterConsumption(counter_set.name, used),),
            ))
    return counter_set, devices


def node(*devices: Device, counter_sets: tuple[CounterSet, ...] = (),
         groups: tuple[str, ...] | None = None) -> NodeDevices:
    if groups is None:
        groups = tuple(dict.fromkeys(d.group for d in devices))
    return NodeDevices(tuple(devices), counter_sets, groups)


def many(count: int, group: str = "gpu-0", **kwargs: object) -> list[Device]:
    return [
        Device(name=f"{group}-dev-{i}", group=group, attributes={"index": i}, capacity={},
               **kwargs)  # type: ignore[arg-type]
        for i in range(count)
    ]


def build(devices: NodeDevices, **kwargs: object) -> list[dict]:
    options: dict = {"driver": DRIVER, "node_name": NODE} | kwargs
    return build_slices(devices, **options)


def names(slices: list[dict]) -> list[str]:
    return [s["metadata"]["name"] for s in slices]


def device_names(obj: dict) -> list[str]:
    return [d["name"] for d in obj["spec"].get("devices", [])]


# --- layout ---------------------------------------------------------------------------------


def test_plain_gpus_get_one_slice_each_in_group_order():
    slices = build(node(plain_gpu(0), plain_gpu(1), plain_gpu(2)))

    assert names(slices) == [f"node-1-gpu.nvidia.com-gpu-{i}" for i in range(3)]
    assert [device_names(s) for s in slices] == [["gpu-0"], ["gpu-1"], ["gpu-2"]]
    for obj in slices:
        assert obj["apiVersion"] == "resource.k8s.io/v1"
        assert obj["kind"] == "ResourceSlice"
        assert obj["spec"]["driver"] == DRIVER
        assert obj["spec"]["nodeName"] == NODE
        assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 3}
        assert "sharedCounters" not in obj["spec"]
    ensure_valid(slices)


def test_groups_follow_declared_order_not_device_order():
    devices = node(plain_gpu(1), plain_gpu(0), groups=("gpu-0", "gpu-1"))
    assert names(build(devices)) == ["node-1-gpu.nvidia.com-gpu-0", "node-1-gpu.nvidia.com-gpu-1"]


def test_undeclared_and_empty_groups():
    ungrouped = Device(name="spare", group="", attributes={}, capacity={})
    devices = node(plain_gpu(3), plain_gpu(0), ungrouped, groups=("gpu-0", "gpu-7"))
    # gpu-7 has no devices (no slice); gpu-3 was not declared (after the declared ones).
    assert names(build(devices)) == [
        "node-1-gpu.nvidia.com-gpu-0",
        "node-1-gpu.nvidia.com-gpu-3",
        "node-1-gpu.nvidia.com-devices",
    ]


def test_partitionable_gpus_put_counters_first_then_one_slice_per_gpu():
    set0, gpu0 = partitionable_gpu(0)
    set1, gpu1 = partitionable_gpu(1)
    slices = build(node(*gpu0, *gpu1, counter_sets=(set0, set1)))

    assert names(slices) == [
        "node-1-gpu.nvidia.com-counters",
        "node-1-gpu.nvidia.com-gpu-0",
        "node-1-gpu.nvidia.com-gpu-1",
    ]
    counters = slices[0]["spec"]
    assert "devices" not in counters
    assert [cs["name"] for cs in counters["sharedCounters"]] == [
        "gpu-0-counter-set", "gpu-1-counter-set"]
    assert counters["sharedCounters"][0]["counters"]["memory"] == {"value": "40Gi"}
    assert counters["sharedCounters"][0]["counters"]["memory-slice-7"] == {"value": "1"}
    assert counters["sharedCounters"][0]["counters"]["multiprocessors"] == {"value": "98"}
    assert len(counters["sharedCounters"][0]["counters"]) == 11
    assert device_names(slices[1]) == [d.name for d in gpu0]
    assert len(device_names(slices[1])) == 26
    assert device_names(slices[2]) == [d.name for d in gpu1]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    ensure_valid(slices)


def test_consumes_counters_encoding():
    counter_set, devices = partitionable_gpu(0)
    slices = build(node(*devices, counter_sets=(counter_set,)))
    mig = slices[1]["spec"]["devices"][-2]  # 4g20gb at start 0

    assert mig["name"] == "gpu-0-mig-4g20gb-0"
    assert mig["consumesCounters"] == [{
        "counterSet": "gpu-0-counter-set",
        "counters": {
            "memory": {"value": "20Gi"},
            "memory-slice-0": {"value": "1"},
            "memory-slice-1": {"value": "1"},
            "memory-slice-2": {"value": "1"},
            "memory-slice-3": {"value": "1"},
            "multiprocessors": {"value": "56"},
        },
    }]
    assert list(mig["consumesCounters"][0]["counters"]) == sorted(
        mig["consumesCounters"][0]["counters"])


def test_mixed_node_keeps_plain_gpu_after_partitionable_one():
    counter_set, gpu0 = partitionable_gpu(0)
    slices = build(node(*gpu0, plain_gpu(1), counter_sets=(counter_set,)))
    assert names(slices)[1:] == ["node-1-gpu.nvidia.com-gpu-0", "node-1-gpu.nvidia.com-gpu-1"]
    assert "consumesCounters" not in slices[2]["spec"]["devices"][0]
    ensure_valid(slices)


def test_more_than_eight_counter_sets_split_into_numbered_counter_slices():
    sets = tuple(CounterSet(f"gpu-{i}-counter-set", {"memory": GIB}) for i in range(9))
    slices = build(node(counter_sets=sets))
    assert names(slices) == ["node-1-gpu.nvidia.com-counters", "node-1-gpu.nvidia.com-counters-1"]
    assert [len(s["spec"]["sharedCounters"]) for s in slices] == [8, 1]
    ensure_valid(slices)


def test_empty_node_publishes_one_empty_slice():
    for devices in (NodeDevices(()), NodeDevices((), groups=("gpu-0",))):
        slices = build(devices)
        assert len(slices) == 1
        spec = slices[0]["spec"]
        assert slices[0]["metadata"]["name"] == "node-1-gpu.nvidia.com"
        assert spec == {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
        }
        ensure_valid(slices)


# --- splitting ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "kwargs", "sizes"),
    [
        (128, {}, [128]),
        (129, {}, [128, 1]),
        (300, {}, [128, 128, 44]),
        (64, {"taints": (Taint("example.com/t", "", "NoSchedule"),)}, [64]),
        (130, {"taints": (Taint("example.com/t", "", "NoSchedule"),)}, [64, 64, 2]),
        (65, {"consumes_counters": (CounterConsumption("cs", {"c": 1}),)}, [64, 1]),
    ],
    ids=["128-plain", "129-plain", "300-plain", "64-tainted", "130-tainted", "65-counters"],
)
def test_oversized_group_is_split_into_consecutive_chunks(count, kwargs, sizes):
    devices = many(count, **kwargs)
    counter_sets = (CounterSet("cs", {"c": 1}),) if "consumes_counters" in kwargs else ()
    slices = build(node(*devices, counter_sets=counter_sets))
    device_slices = [s for s in slices if "devices" in s["spec"]]

    assert [len(s["spec"]["devices"]) for s in device_slices] == sizes
    expected = ["node-1-gpu.nvidia.com-gpu-0"] + [
        f"node-1-gpu.nvidia.com-gpu-0-{n}" for n in range(1, len(sizes))]
    assert names(device_slices) == expected
    assert [n for s in device_slices for n in device_names(s)] == [d.name for d in devices]
    for obj in slices:
        assert validate_slice(obj) == []


def test_one_tainted_device_limits_only_its_own_chunk():
    devices = many(200)
    devices[10] = Device(name=devices[10].name, group="gpu-0", attributes={}, capacity={},
                         taints=(Taint("example.com/unhealthy", "xid-79", "NoExecute"),))
    slices = build(node(*devices))
    # 0..63 hold the taint (limit 64); 64..191 are plain again (limit 128).
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 128, 8]
    assert [n for s in slices for n in device_names(s)] == [d.name for d in devices]
    ensure_valid(slices)


def test_group_names_that_collide_with_chunk_names_are_refused():
    devices = many(129, group="gpu-0") + many(1, group="gpu-0-1")
    with pytest.raises(ValueError, match="slice names collide"):
        build(node(*devices))


# --- names ----------------------------------------------------------------------------------


def test_long_node_names_are_shortened_with_a_stable_hash():
    long_node = ".".join(["a" * 61] * 4) + "-x"  # 249 characters, a valid node name
    set0, gpu0 = partitionable_gpu(0)
    devices = node(*gpu0, plain_gpu(1), counter_sets=(set0,))
    slices = build(devices, node_name=long_node)
    slice_names = names(slices)

    assert len(set(slice_names)) == 3
    for name, suffix in zip(slice_names, ["counters", "gpu-0", "gpu-1"], strict=True):
        assert len(name) <= 253
        assert dns1123_subdomain_errors(name) == []
        assert re.fullmatch(rf"a{{61}}\..*-{suffix}-[0-9a-f]{{8}}", name), name
    assert slice_names == names(build(devices, node_name=long_node))
    assert {s["spec"]["pool"]["name"] for s in slices} == {long_node}
    ensure_valid(slices)


def test_names_that_fit_are_not_hashed():
    fitting = "n" * (253 - len("-gpu.nvidia.com-gpu-0"))
    assert slice_name(fitting, DRIVER, "gpu-0") == f"{fitting}-gpu.nvidia.com-gpu-0"
    # One byte over: the cut lands after "-gpu." and drops the dot; hash = sha256(full)[:8].
    assert slice_name(fitting + "n", DRIVER, "gpu-0") == "n" * 233 + "-gpu-gpu-0-8927f6a0"
    hashed = slice_name(fitting + "n" * 30, DRIVER, "gpu-0")
    assert len(hashed) == 253
    assert re.fullmatch(r"n{238}-gpu-0-[0-9a-f]{8}", hashed)
    assert hashed != slice_name(fitting + "m" * 30, DRIVER, "gpu-0")


def test_cut_never_leaves_a_separator_before_the_suffix():
    # The cut lands right after "-" or "." for some lengths; strip it to stay a valid name.
    for pad in range(10):
        node_name = "b" * (200 + pad) + ".c-d" * 10
        name = slice_name(node_name, DRIVER, "gpu-0")
        assert len(name) <= 253
        assert dns1123_subdomain_errors(name) == [], name


def test_names_are_lowercase():
    assert slice_name("Node-A", "GPU.nvidia.com", "GPU-0") == "node-a-gpu.nvidia.com-gpu-0"


# --- encoding -------------------------------------------------------------------------------


def test_attribute_encoding_checks_bool_before_int():
    assert encode_attribute(True) == {"bool": True}
    assert encode_attribute(False) == {"bool": False}
    assert encode_attribute(1) == {"int": 1}
    assert encode_attribute(0) == {"int": 0}
    assert encode_attribute("x") == {"string": "x"}
    assert encode_attribute(Version("580.95.5")) == {"version": "580.95.5"}
    assert type(encode_attribute(True)["bool"]) is bool
    assert type(encode_attribute(1)["int"]) is int
    with pytest.raises(TypeError):
        encode_attribute(1.5)  # type: ignore[arg-type]


def test_device_encoding():
    encoded = encode_device(plain_gpu(0))
    assert encoded == {
        "name": "gpu-0",
        "attributes": {
            "cudaComputeCapability": {"version": "9.0.0"},
            "migEnabled": {"bool": False},
            "numaNode": {"int": 0},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
            "type": {"string": "gpu"},
            "uuid": {"string": "GPU-00000000-0000-0000-0000-000000000000"},
        },
        "capacity": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"}},
    }
    assert list(encoded["attributes"]) == sorted(encoded["attributes"])


@pytest.mark.parametrize(
    ("amount", "text"),
    [(81559 * 2**20, "81559Mi"), (132, "132"), (2000, "2k"), (1500, "1500"), (0, "0"),
     (1024, "1Ki"), (7 * 10**9, "7G")],
)
def test_capacity_quantities_are_canonical(amount, text):
    device = Device(name="d", group="g", attributes={}, capacity={"memory": amount})
    assert encode_device(device)["capacity"] == {"memory": {"value": text}}


def test_empty_maps_and_lists_are_omitted():
    device = Device(name="bare", group="gpu-0", attributes={}, capacity={})
    assert encode_device(device) == {"name": "bare"}
    plain = build(node(plain_gpu(0)))[0]["spec"]["devices"][0]
    assert "consumesCounters" not in plain
    assert "taints" not in plain


def test_taint_encoding():
    taints = (
        Taint("gpu.nvidia.com/xid", "79", "NoExecute", time_added="2026-07-01T10:00:00Z"),
        Taint("gpu.nvidia.com/maintenance", "", "NoSchedule"),
    )
    encoded = encode_device(plain_gpu(0, taints=taints))["taints"]
    assert encoded == [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute",
         "timeAdded": "2026-07-01T10:00:00Z"},
        {"key": "gpu.nvidia.com/maintenance", "effect": "NoSchedule"},
    ]
    ensure_valid(build(node(plain_gpu(0, taints=taints))))


# --- metadata, determinism, list ------------------------------------------------------------


def test_owner_and_labels():
    owner = OwnerRef(name=NODE, uid="5d2c7bde-6b53-4b59-9a0e-3f3a4a6f1c11")
    slices = build(node(plain_gpu(0)), owner=owner)
    assert slices[0]["metadata"] == {
        "name": "node-1-gpu.nvidia.com-gpu-0",
        "labels": {"app.kubernetes.io/managed-by": "gpudra"},
        "ownerReferences": [{
            "apiVersion": "v1", "kind": "Node", "name": NODE,
            "uid": "5d2c7bde-6b53-4b59-9a0e-3f3a4a6f1c11", "controller": True,
        }],
    }
    assert "ownerReferences" not in build(node(plain_gpu(0)))[0]["metadata"]


def test_generation_is_the_same_on_every_slice():
    counter_set, gpu0 = partitionable_gpu(0)
    slices = build(node(*gpu0, plain_gpu(1), counter_sets=(counter_set,)), generation=7)
    assert {s["spec"]["pool"]["generation"] for s in slices} == {7}
    assert validate_pool(slices) == []


def test_builds_are_deterministic_regardless_of_mapping_order():
    counter_set, gpu0 = partitionable_gpu(0)
    first = build(node(*gpu0, plain_gpu(1), counter_sets=(counter_set,)))
    reordered = [
        Device(d.name, d.group, dict(reversed(list(d.attributes.items()))),
               dict(reversed(list(d.capacity.items()))), d.consumes_counters, d.taints)
        for d in [*gpu0, plain_gpu(1)]
    ]
    second = build(node(*reordered, counter_sets=(counter_set,)))
    assert first == second
    assert json.dumps(first) == json.dumps(second)


def test_builds_do_not_share_mutable_state():
    devices = node(plain_gpu(0))
    first = build(devices)
    pristine = copy.deepcopy(first)
    first[0]["spec"]["devices"].clear()
    assert build(devices) == pristine


def test_slice_list_is_a_kubectl_list():
    slices = build(node(plain_gpu(0), plain_gpu(1)))
    listed = slice_list(slices)
    assert listed == {"apiVersion": "v1", "kind": "List", "items": slices}
    assert json.loads(json.dumps(listed)) == listed


def test_a_build_shares_equal_leaves_and_keeps_request_policies_apart():
    counter_set, gpu0 = partitionable_gpu(0)
    shared = Device(name="gpu-1-shared", group="gpu-1", attributes={"type": "gpu-share"},
                    capacity={"memory": 80 * GIB, "multiprocessors": 132},
                    allow_multiple_allocations=True,
                    request_policies={"memory": RequestPolicy(GIB, GIB, GIB, 80 * GIB)})
    slices = build(node(*gpu0, plain_gpu(1), shared, counter_sets=(counter_set,)))
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    by_name = {d["name"]: d for d in devices}
    # One dict per distinct leaf: the pool costs a fraction of its size as separate dicts.
    mig_types = {id(d["attributes"]["type"]) for d in devices if d["name"].startswith("gpu-0-")
                 and d["name"] != "gpu-0"}
    assert len(mig_types) == 1
    assert by_name["gpu-1"]["capacity"]["memory"] is not by_name["gpu-1-shared"]["capacity"][
        "memory"]
    # The policy went into a dict of the shared device's own, not into the shared leaf.
    assert by_name["gpu-1"]["capacity"]["memory"] == {"value": "80Gi"}
    assert by_name["gpu-1-shared"]["capacity"]["memory"]["requestPolicy"]["default"] == "1Gi"
    assert json.loads(json.dumps(slices)) == slices
