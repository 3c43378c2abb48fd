"""What a server without partitionable devices, taints, consumable capacity or binding
conditions gets: nothing it lacks, and nothing whose meaning would change without it."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpudra.controller.slice_features import NOTHING, describe, supported
from gpudra.controller.slice_validation import ensure_valid
from gpudra.controller.slices import build_slices
from gpudra.driver.devices import CounterConsumption, CounterSet, Device, NodeDevices, Taint
from gpudra.kube.resource_versions import (
    BINDING_CONDITIONS,
    CONSUMABLE_CAPACITY,
    NEWER_FEATURES,
    PARTITIONABLE,
    TAINTS,
)

SET = CounterSet("gpu-0-counters", {"memory-slices": 8, "compute-slices": 7})


def device(name: str, **fields: Any) -> Device:
    return Device(name=name, group="gpu-0", attributes={"type": "gpu"},
                  capacity={"memory": 80 << 30}, **fields)


def whole() -> tuple[CounterConsumption, ...]:
    return (CounterConsumption(SET.name, dict(SET.counters)),)


def partitioned() -> NodeDevices:
    """A MIG placement listed before the full GPU, another after, and the GPU's share."""
    return NodeDevices(devices=(
        device("gpu-0-mig-1g", consumes_counters=(CounterConsumption(
            SET.name, {"memory-slices": 1, "compute-slices": 1}),)),
        device("gpu-0", consumes_counters=whole()),
        device("gpu-0-mig-7g", consumes_counters=whole()),
        device("gpu-0-shared", consumes_counters=whole(), allow_multiple_allocations=True),
    ), counter_sets=(SET,), groups=("gpu-0",))


def test_v1_changes_nothing():
    devices = partitioned()
    assert supported(devices, frozenset()) == (devices, NOTHING)


def test_without_partitionable_devices_the_first_whole_gpu_stays_alone():
    result, left_out = supported(partitioned(), {PARTITIONABLE})
    # The 7g placement takes the whole set too, but the full GPU came first: one device per
    # counter set, or two claims could hold the same GPU.
    assert [d.name for d in result.devices] == ["gpu-0"]
    assert result.devices[0].consumes_counters == ()
    assert result.counter_sets == ()
    assert left_out.devices == {PARTITIONABLE: 3} and left_out.fields == {PARTITIONABLE: 1}
    slices = build_slices(result, driver="gpu.nvidia.com", node_name="n")
    ensure_valid(slices)
    assert not any("sharedCounters" in s["spec"] for s in slices)


def test_without_consumable_capacity_a_share_is_left_out_not_made_exclusive():
    result, left_out = supported(partitioned(), NEWER_FEATURES)
    assert [d.name for d in result.devices] == ["gpu-0"]
    assert left_out.devices[CONSUMABLE_CAPACITY] == 1


def test_taints_that_keep_claims_away_leave_the_device_out():
    devices = NodeDevices(devices=(
        device("gpu-0", taints=(Taint("gpu.nvidia.com/xid", "79", "NoSchedule"),)),
        device("gpu-1", taints=(Taint("gpu.nvidia.com/xid", "48", "NoExecute"),)),
        device("gpu-2", taints=(Taint("gpu.nvidia.com/xid", "13", "None"),)),
        device("gpu-3"),
    ))
    result, left_out = supported(devices, {TAINTS})
    assert [(d.name, d.taints) for d in result.devices] == [("gpu-2", ()), ("gpu-3", ())]
    assert left_out.devices == {TAINTS: 2} and left_out.fields == {TAINTS: 1}


def test_binding_conditions_leave_the_device_out_binds_to_node_is_dropped():
    devices = NodeDevices(devices=(
        device("channel-0", binding_conditions=("Ready",), binds_to_node=True),
        device("channel-1", binding_failure_conditions=("Failed",)),
        device("gpu-0", binds_to_node=True),
    ))
    result, left_out = supported(devices, {BINDING_CONDITIONS})
    assert [(d.name, d.binds_to_node) for d in result.devices] == [("gpu-0", False)]
    assert left_out.devices == {BINDING_CONDITIONS: 2}


def test_plain_gpus_lose_nothing_and_give_no_warning():
    devices = NodeDevices(devices=(device("gpu-0"), device("gpu-1")), groups=("gpu-0",))
    result, left_out = supported(devices, NEWER_FEATURES)
    assert result is devices and not left_out


def test_the_warning_says_what_went_per_feature():
    _, left_out = supported(dataclasses.replace(partitioned()), NEWER_FEATURES)
    assert describe(left_out) == ("consumable capacity: 1 device left out; "
                                  "partitionable devices: 2 devices left out, "
                                  "1 without the field")
