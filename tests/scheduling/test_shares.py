"""Fractional GPUs in the reference allocator: capacity requests, request policies, shares of
one multi-allocatable device, and the proof that full GPU, MIG and shares never overlap."""

from __future__ import annotations

import copy
import itertools
import uuid
from collections import Counter
from fractions import Fraction
from typing import Any

import pytest

from gpudra.api.quantity import parse_quantity
from gpudra.controller.slice_validation import ensure_valid
from gpudra.controller.slices import build_slices
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.gpu_shares import (
    ALL,
    GIB,
    SHARES_PER_GPU,
    ShareableError,
    parse_shareable,
    thread_percentage,
)
from gpudra.driver.inventory import GpuRecord, NodeInventory
from gpudra.driver.mig import packings
from gpudra.driver.nvml import GpuProbe, MigMode
from gpudra.scheduling.allocator import Allocator
from gpudra.testing.fakeapi.slice_validation import validate_resource_slice
from tests.driver import mig_tables
from tests.scheduling.test_allocator import CLASSES, DRIVER, PROFILE, claim, exactly

H100_MEMORY = mig_tables.H100_TOTAL_MIB << 20
SMS = 132
SHARED = "gpu-0-shared"


def node(*, mig_capable: bool = True, dynamic_mig: bool = True, shareable: Any = ALL,
         gpus: int = 1) -> list[dict]:
    records = tuple(
        GpuRecord(
            probe=GpuProbe(index=i, minor=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3",
                           brand=14, architecture=9, cuda_compute_capability=(9, 0),
                           memory_bytes=H100_MEMORY, multiprocessors=SMS,
                           pci_bus_id=f"0000:{0x18 + i:02x}:00.0", numa_node=0),
            pcie_root="pci0000:10", nvlink_domain="nvl-1",
            mig_mode=MigMode(False, False) if mig_capable else None,
            mig_profiles=tuple(mig_tables.h100()) if mig_capable else ())
        for i in range(gpus))
    inventory = NodeInventory(driver_version="580.95.05", cuda_driver_version=13000,
                              gpus=records)
    options = ModelOptions(dynamic_mig=dynamic_mig, shareable=shareable)
    return build_slices(build_devices(inventory, options), driver=DRIVER, node_name="node-a")


def share(name: str = "gpu", **amounts: str) -> dict:
    extra: dict[str, Any] = {"capacity": {"requests": amounts}} if amounts else {}
    return exactly(name, "gpu-share.nvidia.com", 1, **extra)


def whole(name: str = "gpu") -> dict:
    return exactly(name, "gpu.nvidia.com")


def results(allocation) -> list[dict]:
    return [r for claim_result in allocation.results for r in claim_result["devices"]["results"]]


# --- publishing ---------------------------------------------------------------------------

@pytest.mark.parametrize("mig_capable,dynamic_mig", [(True, True), (True, False), (False, True)])
def test_shared_slices_pass_both_validators(mig_capable, dynamic_mig):
    slices = node(mig_capable=mig_capable, dynamic_mig=dynamic_mig, gpus=2)
    ensure_valid(slices)
    for obj in slices:
        assert validate_resource_slice(obj) == []
    names = [d["name"] for obj in slices for d in obj["spec"].get("devices") or []]
    assert "gpu-0-shared" in names and "gpu-1-shared" in names


def test_the_shared_device_publishes_three_range_policies():
    shared = next(d for obj in node() for d in obj["spec"].get("devices") or []
                  if d["name"] == SHARED)
    assert shared["allowMultipleAllocations"] is True
    assert shared["attributes"]["type"] == {"string": "gpu-share"}
    assert shared["capacity"]["memory"]["requestPolicy"] == {
        "default": "9Gi", "validRange": {"min": "1Gi", "step": "1Gi", "max": "79Gi"}}
    assert shared["capacity"]["multiprocessors"]["requestPolicy"] == {
        "default": "16", "validRange": {"min": "1", "step": "1", "max": "132"}}
    assert shared["capacity"]["shares"] == {"value": "16", "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "step": "1", "max": "16"}}}
    assert shared["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set"


def test_gpus_not_named_shareable_publish_as_before():
    assert node(shareable=parse_shareable("none")) == node(shareable=parse_shareable(""))
    slices = node(shareable=parse_shareable("1"), gpus=2)
    names = [d["name"] for obj in slices for d in obj["spec"].get("devices") or []]
    assert "gpu-1-shared" in names and "gpu-0-shared" not in names
    slices = node(shareable=parse_shareable("GPU-0"), gpus=2, mig_capable=False)
    names = [d["name"] for obj in slices for d in obj["spec"].get("devices") or []]
    assert names == ["gpu-0", "gpu-0-shared", "gpu-1"]


def test_shareable_flag_errors_name_the_bad_item():
    with pytest.raises(ShareableError, match="'gpu0'"):
        parse_shareable("0,gpu0")


def test_policy_rules_of_both_validators_agree():
    """Each apiserver rule of requestPolicy, once per validator, same paths."""
    def device(policy: dict, value: str = "10Gi", multi: bool = True) -> dict:
        dev: dict[str, Any] = {"name": "d", "capacity": {"memory": {"value": value,
                                                                    "requestPolicy": policy}}}
        if multi:
            dev["allowMultipleAllocations"] = True
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": "s"},
                "spec": {"driver": DRIVER, "nodeName": "n",
                         "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                         "devices": [dev]}}

    from gpudra.controller.slice_validation import validate_slice

    base = "spec.devices[0].capacity[memory].requestPolicy"
    cases = [
        ({"validRange": {"step": "1Gi"}}, f"{base}.validRange.min"),
        ({"validRange": {"min": "11Gi"}}, f"{base}.validRange.min"),
        ({"default": "1Gi", "validRange": {"min": "2Gi"}}, f"{base}.default"),
        ({"validRange": {"min": "1Gi", "max": "20Gi"}}, f"{base}.validRange.max"),
        ({"validRange": {"min": "1Gi", "step": "0"}}, f"{base}.validRange.step"),
        ({"validRange": {"min": "1Gi", "step": "10Gi"}}, f"{base}.validRange.step"),
        ({"default": "1536Mi", "validRange": {"min": "1Gi", "step": "1Gi"}}, f"{base}.default"),
        ({"validRange": {"min": "1Gi", "step": "2Gi", "max": "4Gi"}}, f"{base}.validRange.max"),
        ({"validValues": ["2Gi", "1Gi"]}, f"{base}.validValues[1]"),
        ({"validValues": ["1Gi", "20Gi"]}, f"{base}.validValues[1]"),
        ({"default": "3Gi", "validValues": ["1Gi", "2Gi"]}, f"{base}.default"),
        ({"validValues": ["1Gi"], "validRange": {"min": "1Gi"}}, base),
    ]
    for policy, path in cases:
        for errors in (validate_slice(device(policy)), validate_resource_slice(device(policy))):
            assert [e.field for e in errors] == [path], (policy, errors)
    good = {"default": "2Gi", "validRange": {"min": "1Gi", "step": "1Gi", "max": "10Gi"}}
    assert validate_slice(device(good)) == validate_resource_slice(device(good)) == []
    forbidden = validate_slice(device(good, multi=False))
    assert [e.field for e in forbidden] == [base]
    assert [e.field for e in validate_resource_slice(device(good, multi=False))] == [base]


def test_thread_percentage_rounds_up():
    assert thread_percentage(33, 132) == 25
    assert thread_percentage(34, 132) == 26
    assert thread_percentage(1, 132) == 1
    assert thread_percentage(132, 132) == 100


# --- the allocator: capacity requests and policies ----------------------------------------

def test_a_request_is_rounded_up_to_the_policy_and_gets_a_share_id():
    allocation = Allocator(node(), CLASSES).allocate(
        claim(share(memory="20000Mi", multiprocessors="33")), "node-a")
    (result,) = results(allocation)
    assert result["device"] == SHARED
    assert result["consumedCapacity"] == {"memory": "20Gi", "multiprocessors": "33",
                                          "shares": "1"}
    assert str(uuid.UUID(result["shareID"])) == result["shareID"]


def test_a_request_without_capacity_gets_the_defaults():
    (result,) = results(Allocator(node(), CLASSES).allocate(claim(share()), "node-a"))
    assert result["consumedCapacity"] == {"memory": "9Gi", "multiprocessors": "16",
                                          "shares": "1"}


def test_a_request_past_the_policy_max_or_for_an_unknown_capacity_does_not_fit():
    allocator = Allocator(node(), CLASSES)
    too_big = allocator.allocate(claim(share(memory="80Gi")), "node-a")
    assert not too_big.allocatable
    assert "memory 80Gi is more than the policy's max 79Gi" in too_big.blocking
    unknown = allocator.allocate(claim(share(bandwidth="1")), "node-a")
    assert not unknown.allocatable and "has no capacity bandwidth" in unknown.blocking


def test_a_capacity_request_on_a_whole_gpu_class_checks_the_value():
    allocator = Allocator(node(), CLASSES)
    fits = allocator.allocate(claim(exactly("gpu", "gpu.nvidia.com", 1,
                                            capacity={"requests": {"memory": "70Gi"}})),
                              "node-a")
    assert [r["device"] for r in results(fits)] == ["gpu-0"]
    assert "shareID" not in results(fits)[0]
    more = allocator.allocate(claim(exactly("gpu", "gpu.nvidia.com", 1,
                                            capacity={"requests": {"memory": "90Gi"}})), "node-a")
    assert not more.allocatable


def test_shares_add_up_and_explain_says_what_is_left():
    slices = node()
    taken: list[dict] = []
    for _ in range(3):
        allocation = Allocator(slices, CLASSES, taken).allocate(
            claim(share(memory="20Gi")), "node-a")
        assert allocation.allocatable
        taken += allocation.results
    refused = Allocator(slices, CLASSES, taken).allocate(claim(share(memory="20Gi")), "node-a")
    assert not refused.allocatable
    # 81559Mi of memory, 60Gi taken: the device's own value bounds the sum, not the max.
    assert refused.blocking.endswith("gpu-0-shared has 20119Mi of memory left; you asked for "
                                     "20Gi)")


def test_two_shares_of_one_gpu_in_one_claim_and_the_pods_other_claim():
    allocation = Allocator(node(), CLASSES).allocate(
        [claim(share("a", memory="40Gi"), share("b", memory="30Gi"), name="one"),
         claim(share(memory="9Gi"), name="two")], "node-a")
    ids = [r["shareID"] for r in results(allocation)]
    assert [r["device"] for r in results(allocation)] == [SHARED] * 3
    assert len(set(ids)) == 3
    short = Allocator(node(), CLASSES).allocate(
        claim(share("a", memory="40Gi"), share("b", memory="40Gi")), "node-a")
    assert not short.allocatable
    assert "after this pod's other shares" in short.blocking


def test_time_slicing_by_share_count():
    slices = node()
    taken: list[dict] = []
    for _ in range(SHARES_PER_GPU // 4):
        allocation = Allocator(slices, CLASSES, taken).allocate(
            claim(share(shares="4", memory="1Gi", multiprocessors="1")), "node-a")
        assert allocation.allocatable
        taken += allocation.results
    assert not Allocator(slices, CLASSES, taken).allocate(
        claim(share(shares="1", memory="1Gi", multiprocessors="1")), "node-a").allocatable


# --- the proof: no overlap, exhaustively ----------------------------------------------------

MIG_PROFILES = sorted(p.name for p in mig_tables.h100())
FEASIBLE_MIG = {tuple(sorted(p.name for p, _ in packing))
                for packing in packings(mig_tables.h100())}
SHARE_SIZES: list[dict[str, str]] = [
    {}, {"memory": "10Gi"}, {"memory": "40Gi", "multiprocessors": "66"},
    {"memory": "79Gi"}, {"multiprocessors": "132"}, {"shares": "16"},
]
MOVES: list[tuple[str, Any]] = (
    [("full", None)] + [("mig", name) for name in MIG_PROFILES]
    + [("share", size) for size in SHARE_SIZES])


def _claim_for(move: tuple[str, Any], n: int) -> dict:
    kind, arg = move
    if kind == "full":
        return claim(whole(), name=f"c{n}")
    if kind == "mig":
        return claim(exactly("mig", "mig.nvidia.com", 1, PROFILE.format(arg)), name=f"c{n}")
    return claim(share(**arg), name=f"c{n}")


def _consumed(amounts: dict[str, str], policy_default: dict[str, Fraction]) -> dict[str, Fraction]:
    """What the hardware must set aside for a share: the policy's rounding, done by hand."""
    out = dict(policy_default)
    for name, raw in amounts.items():
        value = parse_quantity(raw)
        out[name] = Fraction(-(-value // GIB) * GIB) if name == "memory" else value
    return out


DEFAULTS = {"memory": Fraction(9 * GIB), "multiprocessors": Fraction(16), "shares": Fraction(1)}


def _physically_possible(state: list[tuple[str, Any]]) -> bool:
    """What one GPU can hold: one whole-GPU owner; or MIG instances some packing realises;
    or shares whose memory, SMs and count fit the device. Never two kinds at once."""
    kinds = {kind for kind, _ in state}
    if len(kinds) > 1:
        return False
    if kinds == {"full"}:
        return len(state) == 1
    if kinds == {"mig"}:
        return tuple(sorted(arg for _, arg in state)) in FEASIBLE_MIG
    total: Counter[str] = Counter()
    for _, amounts in state:
        total.update(_consumed(amounts, DEFAULTS))
    return (total["memory"] <= H100_MEMORY and total["multiprocessors"] <= SMS
            and total["shares"] <= SHARES_PER_GPU and len(state) <= SHARES_PER_GPU)


@pytest.mark.parametrize("mig_capable", [True, False])
def test_full_gpu_mig_and_shares_never_overlap(mig_capable):
    """Every sequence of up to four allocations on one GPU, each allocated against the
    ones before it (as the scheduler sees them): whatever the allocator accepts the GPU can
    physically hold, and it refuses only what the GPU cannot hold (but for a MIG placed
    after MIG, where first fit may fragment); every accepted share consumes what the policy
    rounds to. Without MIG, the same over full GPU and shares."""
    slices = node(mig_capable=mig_capable)
    moves = MOVES if mig_capable else [m for m in MOVES if m[0] != "mig"]
    checked = 0

    def walk(state: list[tuple[str, Any]], taken: list[dict], depth: int) -> None:
        nonlocal checked
        if depth == 0:
            return
        for move in moves:
            allocation = Allocator(slices, CLASSES, taken).allocate(
                _claim_for(move, len(state)), "node-a")
            possible = _physically_possible([*state, move])
            if allocation.allocatable:  # soundness: whatever is accepted can exist
                assert possible, [*state, move]
            elif not (move[0] == "mig" and any(kind == "mig" for kind, _ in state)):
                # completeness, except MIG after MIG: first-fit placements may fragment
                # the GPU (the MIG-only proof in test_allocator covers whole layouts)
                assert not possible, ([*state, move], allocation.blocking)
            checked += 1
            if not allocation.allocatable:
                continue
            (result,) = results(allocation)
            if move[0] == "share":
                consumed = {k: parse_quantity(v) for k, v in result["consumedCapacity"].items()}
                assert consumed == _consumed(move[1], DEFAULTS)
            walk([*state, move], taken + allocation.results, depth - 1)

    walk([], [], 4)
    assert checked > (400 if mig_capable else 40)


def test_within_one_pod_the_counters_of_a_shared_gpu_count_once():
    """Two shares in one pod's claims plus a MIG request: the MIG never fits beside them."""
    allocation = Allocator(node(), CLASSES).allocate(
        [claim(share("a"), share("b"), name="shares"),
         claim(exactly("mig", "mig.nvidia.com", 1, PROFILE.format("1g.10gb")), name="m")],
        "node-a")
    assert not allocation.allocatable
    both = Allocator(node(), CLASSES).allocate(claim(share("a"), share("b")), "node-a")
    assert [r["device"] for r in results(both)] == [SHARED, SHARED]


def test_combinations_of_shares_fit_iff_their_sums_do():
    sizes = ["10Gi", "20Gi", "30Gi", "40Gi"]
    for combo in itertools.combinations_with_replacement(sizes, 3):
        requests = [share(f"r{i}", memory=m) for i, m in enumerate(combo)]
        fits = Allocator(node(), CLASSES).allocate(claim(*requests), "node-a").allocatable
        assert fits is (sum(int(m[:-2]) for m in combo) <= 79), combo


def test_share_results_pass_the_fake_api_servers_claim_status_rules():
    from gpudra.testing.fakeapi.claim_validation import validate_claim_status

    allocation = Allocator(node(), CLASSES).allocate(claim(share(memory="20Gi")), "node-a")
    (result,) = allocation.results
    obj = {"status": {"allocation": result}}
    assert validate_claim_status(obj, {}) == []
    bad = copy.deepcopy(obj)
    bad["status"]["allocation"]["devices"]["results"][0]["shareID"] = "NOT-A-UUID"
    assert [e.field for e in validate_claim_status(bad, {})] == [
        "status.allocation.devices.results[0].shareID"]
