"""MIG naming, placements and shared-counter math against the real profile tables."""

from __future__ import annotations

import itertools

import pytest

from gpudra.driver.mig import (
    Placement,
    consumption,
    device_name,
    fits,
    gpu_counters,
    memory_size_gb,
    packings,
    parse_device_name,
    placement_order,
)
from tests.driver import mig_tables


@pytest.mark.parametrize(
    ("table", "names"),
    [
        (mig_tables.h100, ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                           "7g.80gb"]),
        (mig_tables.a100_40, ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb",
                              "7g.40gb"]),
        (mig_tables.a30, ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]),
    ],
)
def test_profile_names_follow_nvidia_rounding(table, names):
    assert [p.name for p in table()] == names


def test_memory_rounding_uses_eighths_of_whole_gib():
    # H200: 143771 MiB total, 3g at 71168 MiB -> 3g.71gb (README of the GPU profiles)
    assert memory_size_gb(71168, 143771 << 20) == 71


def test_device_names_encode_parent_profile_and_placement():
    profiles = {p.profile_id: p for p in mig_tables.a100_40()}
    assert device_name(0, profiles[15], Placement(2, 2)) == "gpu-0-mig-1g10gb-15-2"
    assert device_name(3, profiles[20], Placement(6, 1)) == "gpu-3-mig-1g5gb-me-20-6"
    ref = parse_device_name("gpu-3-mig-1g5gb-me-20-6")
    assert ref is not None
    assert (ref.parent_minor, ref.profile_id, ref.start) == (3, 20, 6)
    assert parse_device_name("gpu-3") is None


@pytest.mark.parametrize("table", [mig_tables.h100, mig_tables.a100_40, mig_tables.a30])
def test_counters_accept_exactly_the_packings_the_hardware_accepts(table):
    profiles = table()
    counters = gpu_counters(0, profiles)
    valid = {frozenset((p.profile_id, pl) for p, pl in packing) for packing in packings(profiles)}
    options = [(p, pl) for p in profiles for pl in p.placements]
    # Every pair and triple of devices: counters allow it iff NVML would.
    for size in (1, 2, 3):
        for combo in itertools.combinations(options, size):
            key = frozenset((p.profile_id, pl) for p, pl in combo)
            assert fits(combo, counters) == (key in valid), combo
    # Every valid packing (up to 7 GPU instances) fits.
    for packing in packings(profiles):
        assert fits(packing, counters)


@pytest.mark.parametrize("table", [mig_tables.h100, mig_tables.a100_40, mig_tables.a30])
def test_full_gpu_excludes_every_partition(table):
    profiles = table()
    counters = gpu_counters(0, profiles)
    full = counters.full_gpu_consumption()
    for prof in profiles:
        for pl in prof.placements:
            used = consumption(prof, pl, counters)
            assert any(full[name] + used[name] > counters.counters[name] for name in used)


def test_h100_counter_set_shape():
    counters = gpu_counters(2, mig_tables.h100())
    assert counters.name == "gpu-2-counter-set"
    assert {f"memory-slice-{i}" for i in range(8)} <= set(counters.counters)
    # only the +me profile is capped below its placement count
    assert counters.counters["profile-20-instances"] == 1
    assert not any(k.startswith("profile-19") for k in counters.counters)
    assert len(counters.counters) <= 32


def test_seven_1g_fill_an_h100_and_block_the_rest():
    profiles = {p.profile_id: p for p in mig_tables.h100()}
    counters = gpu_counters(0, list(profiles.values()))
    seven = [(profiles[19], pl) for pl in profiles[19].placements]
    assert fits(seven, counters)
    for other in (15, 14, 9, 5, 0, 20):
        for pl in profiles[other].placements:
            assert not fits([*seven, (profiles[other], pl)], counters)


def test_small_profiles_are_published_top_down():
    profiles = {p.profile_id: p for p in mig_tables.h100()}
    assert [p.start for p in placement_order(profiles[19])] == [6, 5, 4, 3, 2, 1, 0]
    assert [p.start for p in placement_order(profiles[9])] == [4, 0]
