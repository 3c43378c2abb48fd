"""The reference allocator finds what the scheduler's structured allocator would.

Nodes are built the real way (inventory → device model → ``build_slices``), from the
hand-written H100 MIG table, so the counters are the ones the driver publishes.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpudra.api.api_limits import ALLOCATION_RESULTS_MAX_SIZE
from gpudra.controller.slices import build_slices
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.inventory import GpuRecord, NodeInventory
from gpudra.driver.nvml import GpuProbe, MigMode
from gpudra.scheduling.allocator import Allocator, allocate
from gpudra.scheduling.explain import default_device_classes
from tests.driver import mig_tables

DRIVER = "gpu.nvidia.com"
CLASSES = default_device_classes(DRIVER)
PROFILE = "device.attributes['gpu.nvidia.com'].profile == '{}'"
PARENT = "device.attributes['gpu.nvidia.com'].parentUUID"


def h100_node(node: str = "node-a", gpus: int = 1, *, dynamic_mig: bool = True) -> list[dict]:
    records = tuple(
        GpuRecord(
            probe=GpuProbe(index=i, minor=i, uuid=f"GPU-{node}-{i}", name="NVIDIA H100 80GB HBM3",
                           brand=14, architecture=9, cuda_compute_capability=(9, 0),
                           memory_bytes=mig_tables.H100_TOTAL_MIB << 20, multiprocessors=132,
                           pci_bus_id=f"0000:{0x18 + i:02x}:00.0", numa_node=i // 4),
            pcie_root="pci0000:10", nvlink_domain="nvl-1", mig_mode=MigMode(False, False),
            mig_profiles=tuple(mig_tables.h100()))
        for i in range(gpus))
    inventory = NodeInventory(driver_version="580.95.05", cuda_driver_version=13000,
                              gpus=records)
    devices = build_devices(inventory, ModelOptions(dynamic_mig=dynamic_mig))
    return build_slices(devices, driver=DRIVER, node_name=node)


def exactly(name: str, device_class: str = "mig.nvidia.com", count: int = 1,
            *selectors: str, **extra: Any) -> dict:
    spec: dict[str, Any] = {"deviceClassName": device_class, "count": count,
                            "selectors": [{"cel": {"expression": s}} for s in selectors]}
    spec.update(extra)
    return {"name": name, "exactly": spec}


def mig(name: str, profile: str, count: int = 1) -> dict:
    return exactly(name, "mig.nvidia.com", count, PROFILE.format(profile))


def claim(*requests: dict, constraints: list | None = None, config: list | None = None,
          name: str = "c") -> dict:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": list(requests), "constraints": constraints or [],
                                 "config": config or []}}}


def devices(allocation) -> list[str]:
    return [r["device"] for r in allocation.result["devices"]["results"]]


def by_request(allocation) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in allocation.result["devices"]["results"]:
        out.setdefault(r["request"], []).append(r["device"])
    return out


def attr(allocation_slices: list[dict], device: str, name: str) -> Any:
    for obj in allocation_slices:
        for d in obj["spec"].get("devices") or []:
            if d["name"] == device:
                return next(iter(d["attributes"][name].values()))
    raise KeyError(device)


# --- partitionable devices: counters ----------------------------------------------------

def test_seven_1g_partitions_fill_an_h100_from_the_top():
    slices = h100_node()
    allocation = allocate(slices, CLASSES, [], claim(mig("m", "1g.10gb", 7)), "node-a")
    assert allocation.allocatable, allocation.blocking
    assert devices(allocation) == [f"gpu-0-mig-1g10gb-19-{s}" for s in (6, 5, 4, 3, 2, 1, 0)]
    assert allocation.result["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}


def test_a_full_h100_refuses_the_whole_gpu_and_any_further_partition():
    slices = h100_node()
    taken = allocate(slices, CLASSES, [], claim(mig("m", "1g.10gb", 7)), "node-a").result
    allocator = Allocator(slices, CLASSES, [taken])

    gpu = allocator.allocate(claim(exactly("gpu", "gpu.nvidia.com")), "node-a")
    assert not gpu.allocatable and gpu.error is None
    # The partitions already allocated hold the counters: the GPU is not usable (it used to
    # be counted as usable and as rejected at once).
    assert "0 of 26 devices usable" in gpu.blocking
    assert "is held by allocated devices" in gpu.blocking
    (trace,) = gpu.requests
    (outcome,) = [o for o in trace.outcomes if o.device[2] == "gpu-0"]
    assert outcome.code == "allocated"

    for profile in ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb"):
        further = allocator.allocate(claim(mig("m", profile)), "node-a")
        assert not further.allocatable, profile
        assert {o.code for o in further.requests[0].outcomes} <= {
            "allocated", "counters", "class-selector", "request-selector"}


def test_the_full_gpu_and_a_partition_exclude_each_other_within_one_claim():
    slices = h100_node()
    both = allocate(slices, CLASSES, [],
                    claim(exactly("gpu", "gpu.nvidia.com"), mig("m", "1g.10gb")), "node-a")
    assert not both.allocatable
    assert "counter" in both.blocking


def test_placements_that_overlap_are_never_allocated_together():
    slices = h100_node()
    allocation = allocate(slices, CLASSES, [],
                          claim(mig("big", "4g.40gb"), mig("small", "3g.40gb"),
                                mig("tiny", "1g.10gb")), "node-a")
    assert not allocation.allocatable
    two = allocate(slices, CLASSES, [], claim(mig("big", "4g.40gb"), mig("small", "3g.40gb")),
                   "node-a")
    assert by_request(two) == {"big": ["gpu-0-mig-4g40gb-5-0"],
                               "small": ["gpu-0-mig-3g40gb-9-4"]}


def test_a_device_turned_down_by_a_constraint_keeps_its_counters_as_upstream():
    """The 1.36 allocator checks (and takes) a device's counters before its constraints,
    and does not give them back when a constraint turns the device down: a later choice
    finds them short. Checked against dra-allocate (the 1.36 allocator): not allocatable."""
    slices = h100_node(gpus=2)
    # gpu-0 already runs a 4g: a 1g still fits at the top, but no 3g beside it.
    busy = allocate(slices, CLASSES, [], claim(mig("big", "4g.40gb")), "node-a").result
    allocator = Allocator(slices, CLASSES, [busy])
    loose = allocator.allocate(claim(mig("a", "1g.10gb"), mig("b", "3g.40gb")), "node-a")
    assert by_request(loose) == {"a": ["gpu-0-mig-1g10gb-19-6"], "b": ["gpu-1-mig-3g40gb-9-4"]}

    # Both on gpu-1 would do, but the 3g partitions of gpu-1 that the constraint turned down
    # (while a was on gpu-0) still hold gpu-1's memory slices when a moves there.
    tied = allocator.allocate(claim(mig("a", "1g.10gb"), mig("b", "3g.40gb"),
                                    constraints=[{"matchAttribute": "gpu.nvidia.com/parentUUID"}]),
                              "node-a")
    assert not tied.allocatable and tied.error is None
    # The trace says so: b's last try on gpu-1 found the counters short.
    assert "counters" in {o.code for o in tied.requests[1].outcomes}

    # Without the 4g, the first choice of a (gpu-0) leaves room for b beside it.
    fresh = allocate(slices, CLASSES, [], claim(
        mig("a", "1g.10gb"), mig("b", "3g.40gb"),
        constraints=[{"matchAttribute": "gpu.nvidia.com/parentUUID"}]), "node-a")
    chosen = by_request(fresh)
    parents = {attr(slices, d, "parentUUID") for names in chosen.values() for d in names}
    assert parents == {"GPU-node-a-0"}


def test_match_attribute_with_a_constraint_that_cannot_hold():
    slices = h100_node(gpus=2, dynamic_mig=False)
    allocation = allocate(slices, CLASSES, [], claim(
        exactly("a", "gpu.nvidia.com", 1, "device.attributes['gpu.nvidia.com'].uuid.endsWith('0')"),
        exactly("b", "gpu.nvidia.com", 1, "device.attributes['gpu.nvidia.com'].uuid.endsWith('1')"),
        constraints=[{"matchAttribute": "gpu.nvidia.com/uuid"}]), "node-a")
    assert not allocation.allocatable
    assert "constraint #0 matchAttribute gpu.nvidia.com/uuid" in allocation.blocking


def test_distinct_attribute():
    slices = h100_node(gpus=8, dynamic_mig=False)
    allocation = allocate(slices, CLASSES, [], claim(
        exactly("gpu", "gpu.nvidia.com", 2),
        constraints=[{"distinctAttribute": "gpu.nvidia.com/numaNode"}]), "node-a")
    assert devices(allocation) == ["gpu-0", "gpu-4"]


def test_match_attribute_looks_up_the_bare_name_for_the_drivers_domain():
    slices = h100_node(gpus=8, dynamic_mig=False)
    allocation = allocate(slices, CLASSES, [], claim(
        exactly("a", "gpu.nvidia.com"), exactly("b", "gpu.nvidia.com"),
        constraints=[{"requests": ["a", "b"],
                      "matchAttribute": "resource.kubernetes.io/pcieRoot"}]), "node-a")
    assert devices(allocation) == ["gpu-0", "gpu-1"]


# --- requests -------------------------------------------------------------------------

def test_first_available_falls_through_to_the_next_subrequest():
    slices = h100_node()
    request = {"name": "gpu", "firstAvailable": [
        {"name": "huge", "deviceClassName": "gpu.nvidia.com",
         "selectors": [{"cel": {"expression":
                                "device.capacity['gpu.nvidia.com'].memory.isGreaterThan("
                                "quantity('100Gi'))"}}]},
        {"name": "two-small", "deviceClassName": "mig.nvidia.com", "count": 2,
         "selectors": [{"cel": {"expression": PROFILE.format("2g.20gb")}}]},
    ]}
    config = [{"requests": ["gpu/two-small"], "opaque": {"driver": DRIVER, "parameters": {}}},
              {"requests": ["gpu/huge"], "opaque": {"driver": DRIVER, "parameters": {"x": 1}}}]
    allocation = allocate(slices, CLASSES, [], claim(request, config=config), "node-a")
    assert by_request(allocation) == {"gpu/two-small": ["gpu-0-mig-2g20gb-14-4",
                                                        "gpu-0-mig-2g20gb-14-2"]}
    assert allocation.result["devices"]["config"] == [
        {"source": "FromClaim", "requests": ["gpu/two-small"],
         "opaque": {"driver": DRIVER, "parameters": {}}}]
    huge, small = allocation.requests
    assert huge.tried and not huge.selected and small.selected


def test_first_available_prefers_the_first_subrequest_that_fits():
    slices = h100_node(dynamic_mig=False)
    request = {"name": "gpu", "firstAvailable": [
        {"name": "full", "deviceClassName": "gpu.nvidia.com"},
        {"name": "part", "deviceClassName": "mig.nvidia.com"}]}
    allocation = allocate(slices, CLASSES, [], claim(request), "node-a")
    assert by_request(allocation) == {"gpu/full": ["gpu-0"]}
    assert not allocation.requests[1].tried


def test_admin_access_may_take_an_allocated_device():
    slices = h100_node(gpus=2, dynamic_mig=False)
    taken = allocate(slices, CLASSES, [], claim(exactly("gpu", "gpu.nvidia.com")), "node-a")
    allocator = Allocator(slices, CLASSES, [{"status": {"allocation": taken.result}}])

    plain = allocator.allocate(claim(exactly("gpu", "gpu.nvidia.com")), "node-a")
    assert devices(plain) == ["gpu-1"]
    admin = allocator.allocate(claim(exactly("gpu", "gpu.nvidia.com", adminAccess=True)),
                               "node-a")
    assert admin.result["devices"]["results"] == [
        {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0",
         "adminAccess": True}]
    # ... but never the same device twice in one claim
    twice = allocator.allocate(claim(exactly("a", "gpu.nvidia.com", adminAccess=True),
                                     exactly("b", "gpu.nvidia.com", adminAccess=True)), "node-a")
    assert devices(twice) == ["gpu-0", "gpu-1"]


def test_admin_access_results_do_not_make_devices_busy():
    slices = h100_node(dynamic_mig=False)
    admin = allocate(slices, CLASSES, [],
                     claim(exactly("gpu", "gpu.nvidia.com", adminAccess=True)), "node-a")
    again = allocate(slices, CLASSES, [admin.result], claim(exactly("gpu", "gpu.nvidia.com")),
                     "node-a")
    assert devices(again) == ["gpu-0"]


def test_all_mode_takes_every_matching_device():
    slices = h100_node(gpus=4, dynamic_mig=False)
    request = exactly("gpu", "gpu.nvidia.com", 0, allocationMode="All")
    del request["exactly"]["count"]
    allocation = allocate(slices, CLASSES, [], claim(request), "node-a")
    assert devices(allocation) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]

    one = allocate(slices, CLASSES, [], claim(exactly("x", "gpu.nvidia.com")), "node-a")
    blocked = allocate(slices, CLASSES, [one.result], claim(request), "node-a")
    assert not blocked.allocatable
    assert "wants all matching devices" in blocked.blocking

    none = copy.deepcopy(request)
    none["exactly"]["selectors"] = [{"cel": {"expression": "device.driver == 'x'"}}]
    assert not allocate(slices, CLASSES, [], claim(none), "node-a").allocatable


def test_all_mode_fails_with_an_error_on_an_incomplete_pool():
    slices = h100_node(gpus=2, dynamic_mig=False)[:1]
    request = exactly("gpu", "gpu.nvidia.com", 0, allocationMode="All")
    allocation = allocate(slices, CLASSES, [], claim(request), "node-a")
    assert allocation.error == ("claim default/c, request gpu: asks for all devices, but "
                                "resource pool gpu.nvidia.com/node-a is currently being updated")


def test_at_most_32_devices_per_claim():
    slices = h100_node(gpus=8)
    request = exactly("m", count=ALLOCATION_RESULTS_MAX_SIZE + 1)
    too_many = allocate(slices, CLASSES, [], claim(request), "node-a")
    assert too_many.error == "claim default/c: number of requested devices 33 exceeds the claim " \
                             "limit of 32"
    # with subrequests only the search finds out; a smaller alternative still works
    request = {"name": "m", "firstAvailable": [
        {"name": "many", "deviceClassName": "mig.nvidia.com", "count": 20},
        {"name": "few", "deviceClassName": "mig.nvidia.com", "count": 2}]}
    allocation = allocate(slices, CLASSES, [],
                          claim(exactly("first", "mig.nvidia.com", 20), request), "node-a")
    assert allocation.allocatable
    assert list(by_request(allocation)) == ["first", "m/few"]


# --- taints ---------------------------------------------------------------------------

def tainted(effect: str) -> list[dict]:
    slices = h100_node(gpus=1, dynamic_mig=False)
    for obj in slices:
        for device in obj["spec"].get("devices") or []:
            device["taints"] = [{"key": "gpu.nvidia.com/health", "value": "xid-79",
                                 "effect": effect}]
    return slices


@pytest.mark.parametrize(("effect", "tolerations", "allocatable"), [
    ("NoSchedule", [], False),
    ("NoExecute", [], False),
    ("None", [], True),
    ("NoSchedule", [{"key": "gpu.nvidia.com/health", "operator": "Exists"}], True),
    ("NoSchedule", [{"operator": "Exists"}], True),
    ("NoSchedule", [{"key": "gpu.nvidia.com/health", "value": "xid-79"}], True),
    ("NoSchedule", [{"key": "gpu.nvidia.com/health", "operator": "Equal", "value": "xid-48"}],
     False),
    ("NoSchedule", [{"key": "gpu.nvidia.com/health", "operator": "Exists",
                     "effect": "NoExecute"}], False),
    ("NoExecute", [{"key": "gpu.nvidia.com/health", "operator": "Exists",
                    "effect": "NoExecute"}], True),
    ("NoSchedule", [{"key": "other", "operator": "Exists"}], False),
])
def test_taints_must_be_tolerated(effect, tolerations, allocatable):
    request = exactly("gpu", "gpu.nvidia.com", 1, tolerations=tolerations)
    allocation = allocate(tainted(effect), CLASSES, [], claim(request), "node-a")
    assert allocation.allocatable is allocatable
    if allocatable and tolerations:
        assert allocation.result["devices"]["results"][0]["tolerations"] == tolerations
    if not allocatable:
        assert "not tolerated" in allocation.blocking


# --- CEL errors ------------------------------------------------------------------------

def test_a_cel_runtime_error_fails_the_allocation_like_the_scheduler():
    slices = h100_node(gpus=2, dynamic_mig=False)
    allocation = allocate(slices, CLASSES, [], claim(exactly(
        "gpu", "gpu.nvidia.com", 1, "device.attributes['gpu.nvidia.com'].productNmae == 'x'")),
        "node-a")
    assert not allocation.allocatable
    assert allocation.error == ("claim default/c: selector #0: CEL runtime error: "
                                "no such key: productNmae")


def test_errors_only_count_on_devices_the_search_reaches():
    # gpu-0 fits before the search gets to gpu-1, which lacks the attribute
    slices = h100_node(gpus=2, dynamic_mig=False)
    del slices[-1]["spec"]["devices"][0]["attributes"]["numaNode"]
    selector = "device.attributes['gpu.nvidia.com'].numaNode == 0"
    ok = allocate(slices, CLASSES, [], claim(exactly("gpu", "gpu.nvidia.com", 1, selector)),
                  "node-a")
    assert devices(ok) == ["gpu-0"]
    # devices already allocated are skipped before any CEL runs
    taken = [{"devices": {"results": [{"request": "x", "driver": DRIVER, "pool": "node-a",
                                       "device": "gpu-1"}]}}]
    ok = allocate(slices, CLASSES, taken, claim(exactly("gpu", "gpu.nvidia.com", 2, selector)),
                  "node-a")
    assert not ok.allocatable and ok.error is None
    # asking for both reaches gpu-1: error
    failed = allocate(slices, CLASSES, [], claim(exactly("gpu", "gpu.nvidia.com", 2, selector)),
                      "node-a")
    assert "CEL runtime error: no such key: numaNode" in failed.error


def test_class_selector_errors_name_the_class():
    classes = [{"metadata": {"name": "broken"},
                "spec": {"selectors": [{"cel": {"expression": "device.attributes["
                                                              "'gpu.nvidia.com'].nope"}}]}}]
    allocation = allocate(h100_node(dynamic_mig=False), classes, [],
                          claim(exactly("gpu", "broken")), "node-a")
    assert allocation.error == "class broken: selector #0: CEL runtime error: no such key: nope"


def test_unknown_device_class_is_an_error():
    allocation = allocate(h100_node(), CLASSES, [], claim(exactly("gpu", "nope")), "node-a")
    assert "could not retrieve device class nope" in allocation.error


# --- pools and result ---------------------------------------------------------------------

def test_only_the_newest_generation_and_complete_pools_count():
    old = h100_node(gpus=2, dynamic_mig=False)
    new = copy.deepcopy(old)
    for obj in new:
        obj["spec"]["pool"]["generation"] = 2
    new[0]["spec"]["devices"][0]["attributes"]["productName"] = {"string": "renamed"}
    selector = "device.attributes['gpu.nvidia.com'].productName == 'renamed'"
    allocation = allocate(old + new, CLASSES, [],
                          claim(exactly("gpu", "gpu.nvidia.com", 1, selector)), "node-a")
    assert devices(allocation) == ["gpu-0"]

    incomplete = allocate(new[:1], CLASSES, [], claim(exactly("gpu", "gpu.nvidia.com")),
                          "node-a")
    assert not incomplete.allocatable
    assert [p.kind for p in incomplete.pools] == ["incomplete"]


def test_pools_are_ordered_by_driver_then_name_and_other_nodes_are_ignored():
    a = h100_node("node-a", dynamic_mig=False)
    shared = h100_node("zzz-pool", dynamic_mig=False)
    for obj in shared:
        del obj["spec"]["nodeName"]
        obj["spec"]["allNodes"] = True
    other = h100_node("node-b", dynamic_mig=False)
    allocation = allocate(other + shared + a, CLASSES, [],
                          claim(exactly("gpu", "gpu.nvidia.com", 2)), "node-a")
    assert [(r["pool"], r["device"]) for r in allocation.result["devices"]["results"]] == [
        ("node-a", "gpu-0"), ("zzz-pool", "gpu-0")]


def test_node_selector_pools_match_node_labels():
    shared = h100_node("rack-pool", dynamic_mig=False)
    for obj in shared:
        del obj["spec"]["nodeName"]
        obj["spec"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "rack", "operator": "In", "values": ["r1"]}]}]}
    allocator = Allocator(shared, CLASSES)
    request = claim(exactly("gpu", "gpu.nvidia.com"))
    assert allocator.allocate(request, "n1", {"rack": "r1"}).allocatable
    assert not allocator.allocate(request, "n2", {"rack": "r2"}).allocatable


def test_configs_from_the_class_then_the_claim():
    classes = copy.deepcopy(CLASSES)
    classes[0]["spec"]["config"] = [{"opaque": {"driver": DRIVER, "parameters": {"c": 1}}}]
    slices = h100_node(gpus=2, dynamic_mig=False)
    config = [{"opaque": {"driver": DRIVER, "parameters": {"all": True}}},
              {"requests": ["a", "b"], "opaque": {"driver": DRIVER, "parameters": {"ab": 1}}}]
    allocation = allocate(slices, classes, [], claim(
        exactly("a", "gpu.nvidia.com"), exactly("b", "gpu.nvidia.com"), config=config), "node-a")
    assert allocation.result["devices"]["config"] == [
        {"source": "FromClass", "requests": ["a", "b"],
         "opaque": {"driver": DRIVER, "parameters": {"c": 1}}},
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"all": True}}},
        # the scheduler appends a config once per request it names
        {"source": "FromClaim", "requests": ["a", "b"],
         "opaque": {"driver": DRIVER, "parameters": {"ab": 1}}},
        {"source": "FromClaim", "requests": ["a", "b"],
         "opaque": {"driver": DRIVER, "parameters": {"ab": 1}}},
    ]


def test_a_pods_claims_are_allocated_together():
    slices = h100_node(gpus=8, dynamic_mig=False)
    allocator = Allocator(slices, CLASSES)
    five = claim(exactly("gpu", "gpu.nvidia.com", 5), name="one")
    assert allocator.allocate(five, "node-a").allocatable
    together = allocator.allocate([five, {**five, "metadata": {"name": "two"}}], "node-a")
    assert not together.allocatable
    assert together.blocking.startswith("request gpu: no combination of devices fits; most "
                                        "often: already chosen for this pod's claims")
    pair = allocator.allocate([claim(exactly("g", "gpu.nvidia.com", 4), name="x"),
                               claim(exactly("g", "gpu.nvidia.com", 4), name="y")], "node-a")
    assert [[r["device"] for r in res["devices"]["results"]] for res in pair.results] == [
        ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]]


def test_the_trace_says_why_for_every_device():
    slices = h100_node(gpus=2)
    allocation = allocate(slices, CLASSES, [], claim(mig("m", "3g.40gb")), "node-a")
    (trace,) = allocation.requests
    assert len(trace.outcomes) == 52
    statuses = {(o.status, o.code) for o in trace.outcomes}
    assert statuses == {("chosen", ""), ("matches", ""), ("rejected", "class-selector"),
                        ("rejected", "request-selector")}
    assert trace.chosen == [(DRIVER, "node-a", "gpu-0-mig-3g40gb-9-4")]


def test_counters_admit_exactly_the_mig_layouts_the_hardware_accepts():
    """Every multiset of up to three profiles fits iff some valid packing realises it."""
    import itertools

    from gpudra.driver.mig import packings

    profiles = mig_tables.h100()
    feasible = {tuple(sorted(p.name for p, _ in packing)) for packing in packings(profiles)}
    allocator = Allocator(h100_node(), CLASSES)
    names = sorted(p.name for p in profiles)
    for size in (2, 3):
        for combo in itertools.combinations_with_replacement(names, size):
            requests = [mig(f"r{i}", name) for i, name in enumerate(combo)]
            allocation = allocator.allocate(claim(*requests), "node-a")
            assert allocation.allocatable is (combo in feasible), combo
