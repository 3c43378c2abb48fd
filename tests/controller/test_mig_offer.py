"""The published set an admin chooses (``--dynamic-mig-*``): the default publishes no counter
set, a profile subset keeps the counters exact, and ``disjoint`` needs none."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudra.cli.main import main
from gpudra.controller.slices import build_slices
from gpudra.driver import sim
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.inventory import NodeInventory, read_inventory, simulated_pcie_root
from gpudra.driver.mig import fits, gpu_counters, packings
from gpudra.driver.mig_offer import (
    EVERY,
    NOTHING,
    MigOffer,
    MigOfferError,
    disjoint_set,
    parse_offer,
)
from gpudra.driver.nvml import open_nvml
from gpudra.scheduling.allocator import Allocator
from tests.driver import mig_tables

ROOT = Path(__file__).resolve().parents[2]
CLASSES = sorted((ROOT / "deploy" / "deviceclasses").glob("*.yaml"))
TABLES = [mig_tables.h100, mig_tables.a100_40, mig_tables.a30]


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> NodeInventory:
    """Read once; the simulator is gone again before any test runs the CLI."""
    nvml = open_nvml(simulate="dgx-h100", sim_state=tmp_path_factory.mktemp("sim"))
    try:
        return read_inventory(nvml, pcie_root=simulated_pcie_root)
    finally:
        nvml.shutdown()
        sim.uninstall()


@pytest.fixture(autouse=True)
def _detach() -> Iterator[None]:
    yield
    sim.uninstall()


def _slices(inventory: NodeInventory, offer: MigOffer, node: str = "n") -> list[dict[str, Any]]:
    devices = build_devices(inventory, ModelOptions(mig=offer))
    return json.loads(json.dumps(build_slices(devices, driver="gpu.nvidia.com",
                                              node_name=node)))


def test_the_default_offer_publishes_full_gpus_and_no_counter_set(h100):
    slices = _slices(h100, NOTHING)
    assert not any("sharedCounters" in s["spec"] for s in slices)
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert names == [f"gpu-{i}" for i in range(8)]


def test_an_offer_covers_only_its_gpus(h100):
    slices = _slices(h100, parse_offer("1", "1g.10gb", "all"))
    (counters,) = [s for s in slices if "sharedCounters" in s["spec"]]
    assert [c["name"] for c in counters["spec"]["sharedCounters"]] == ["gpu-1-counter-set"]
    migs = [d["name"] for s in slices for d in s["spec"].get("devices", [])
            if d["attributes"]["type"]["string"] == "mig"]
    assert len(migs) == 7 and all(m.startswith("gpu-1-mig-1g10gb-") for m in migs)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("size", [1, 2, 3])
def test_counters_of_a_profile_subset_accept_exactly_its_packings(table, size):
    """Any subset of profiles: its counters allow a combination iff NVML would."""
    every = table()
    for subset in itertools.combinations(every, size):
        counters = gpu_counters(0, subset)
        valid = {frozenset((p.profile_id, pl) for p, pl in packing)
                 for packing in packings(subset)}
        options = [(p, pl) for p in subset for pl in p.placements]
        for n in (1, 2, 3):
            for combo in itertools.combinations(options, n):
                key = frozenset((p.profile_id, pl) for p, pl in combo)
                assert fits(combo, counters) == (key in valid), (subset, combo)


@pytest.mark.parametrize("table", TABLES)
def test_every_subset_of_a_disjoint_set_is_a_packing_the_hardware_accepts(table):
    """``disjoint`` publishes no counters: whatever the scheduler picks of it must fit."""
    every = table()
    valid = {frozenset((p.profile_id, pl) for p, pl in packing) for packing in packings(every)}
    orders = [list(order) for size in (1, 2) for order in itertools.permutations(every, size)]
    orders.append(sorted(every, key=lambda p: (p.slice_count, p.memory_mib)))
    for order in orders:
        chosen = disjoint_set(order)
        assert chosen, order
        for n in range(1, len(chosen) + 1):
            for combo in itertools.combinations(chosen, n):
                assert frozenset((p.profile_id, pl) for p, pl in combo) in valid, combo


def test_disjoint_publishes_no_counters_and_no_full_gpu_where_it_offers_mig(h100):
    slices = _slices(h100, parse_offer("0", "2g.20gb,1g.10gb", "disjoint"))
    assert not any("sharedCounters" in s["spec"] for s in slices)
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert "gpu-0" not in names and "gpu-1" in names
    assert [n for n in names if n.startswith("gpu-0-")] == [
        "gpu-0-mig-2g20gb-14-0", "gpu-0-mig-2g20gb-14-2", "gpu-0-mig-2g20gb-14-4",
        "gpu-0-mig-1g10gb-19-6"]


def _claim(count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"migs-{count}", "namespace": "default",
                         "uid": "00000000-0000-0000-0000-000000000001"},
            "spec": {"devices": {
                "requests": [{"name": "mig", "exactly": {
                    "deviceClassName": "mig.nvidia.com", "count": count}}],
                "constraints": [{"requests": ["mig"],
                                 "matchAttribute": "gpu.nvidia.com/parentUUID"}]}}}


def _classes() -> list[dict[str, Any]]:
    import yaml

    return [yaml.safe_load(path.read_text()) for path in CLASSES]


@pytest.mark.parametrize(("count", "fits_one_gpu"), [(7, True), (8, False)])
def test_disjoint_1g_fills_one_gpu_with_seven_and_no_more(h100, count, fits_one_gpu):
    slices = _slices(h100, parse_offer("all", "1g.10gb", "disjoint"))
    outcome = Allocator(slices, _classes(), []).allocate(_claim(count), "n")
    assert outcome.allocatable is fits_one_gpu


def _dra_allocate() -> str:
    given = os.environ.get("DRA_ALLOCATE")
    path = Path(given) if given else ROOT.parent / "shared" / "tools" / "dra-allocate" / \
        "dra-allocate"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"dra-allocate not found at {path} (set $DRA_ALLOCATE to the binary)")
    return str(path)


@pytest.mark.parametrize(("offer", "count", "expected"), [
    (parse_offer("all", "1g.10gb", "disjoint"), 7, "allocated"),
    (parse_offer("all", "1g.10gb", "disjoint"), 8, "unschedulable"),
    (EVERY, 7, "allocated"),
    (NOTHING, 1, "unschedulable"),
])
def test_the_real_allocator_agrees(h100, tmp_path, offer, count, expected):
    binary = _dra_allocate()
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                   "items": [*_slices(h100, offer), _claim(count)]}))
    done = subprocess.run([binary, "-node", "n", *map(str, CLASSES), str(cluster)],
                          capture_output=True, text=True, check=False, timeout=60)
    report = json.loads(done.stdout)
    assert report["outcome"] == expected, report
    ours = Allocator(_slices(h100, offer), _classes(), []).allocate(_claim(count), "n")
    assert ours.allocatable is (expected == "allocated")


def test_bad_flag_values_name_the_flag_and_its_environment_variable(capsys):
    for flags, named in [
        (["--dynamic-mig-gpus", "first"], "--dynamic-mig-gpus: 'first'"),
        (["--dynamic-mig-profiles", "small"], "--dynamic-mig-profiles: 'small'"),
        (["--dynamic-mig-placements", "packed"], "--dynamic-mig-placements: 'packed'"),
    ]:
        assert main(["inventory", "--simulate", "dgx-h100", *flags]) == 2
        err = capsys.readouterr().err
        assert named in err and "(env DYNAMIC_MIG_" in err
    with pytest.raises(MigOfferError):
        parse_offer("0", "all", "some")


def test_the_environment_chooses_when_no_flag_does(monkeypatch, capsys):
    monkeypatch.setenv("DYNAMIC_MIG_GPUS", "3")
    monkeypatch.setenv("DYNAMIC_MIG_PROFILES", "7g.80gb")
    assert main(["inventory", "--simulate", "dgx-h100", "-o", "json"]) == 0
    slices = json.loads(capsys.readouterr().out)["items"]
    migs = [d["name"] for s in slices for d in s["spec"].get("devices", [])
            if d["attributes"]["type"]["string"] == "mig"]
    assert migs == ["gpu-3-mig-7g80gb-0-0"]


def _published(node: Any, options: ModelOptions) -> list[str]:
    """What the daemon republishes after a prepare: the index rebuilt with its own MIG."""
    from dataclasses import replace

    from gpudra.driver.prepare_plan import NodeIndex
    from tests.driver.node_fixture import POOL

    inventory = read_inventory(node.nvml, pcie_root=simulated_pcie_root)
    owned = replace(options, owned_mig_uuids=node.state.owned_mig_uuids())
    index = NodeIndex.build(POOL, inventory, owned)
    return [d.name for d in index.devices.devices if d.name.startswith("gpu-0")]


def test_a_disjoint_device_is_made_when_prepared_and_stays_published(tmp_path):
    """The node side: a ``disjoint`` device is a MIG device made on demand like any other;
    while it is held the GPU publishes the same set (the held one included), and a GPU
    taken out of the offer lists it as static, under its name, until it is gone."""
    from tests.driver.node_fixture import claim, start_node

    options = ModelOptions(mig=parse_offer("0", "1g.10gb", "disjoint"))
    node = start_node(tmp_path, options=options)
    try:
        offered = [f"gpu-0-mig-1g10gb-19-{start}" for start in range(7)]
        assert _published(node, options) == offered
        uid = "11111111-1111-4111-8111-111111111111"
        node.state.prepare(claim(uid, offered[3]))
        assert _published(node, options) == offered
        assert _published(node, ModelOptions(mig=NOTHING)) == [offered[3]]
        node.state.unprepare(uid)
        assert node.control.snapshot()["gpus"][0]["gpu_instances"] == []
        assert _published(node, ModelOptions(mig=NOTHING)) == ["gpu-0"]
    finally:
        node.close()


@pytest.mark.parametrize(("flags", "mig_devices"), [
    ([], 0),
    (["--feature-gates", "DynamicMIG=true"], 200),  # NVIDIA's chart's way to ask for it
    (["--feature-gates", "DynamicMIG=true", "--dynamic-mig-gpus", "none"], 0),
    (["--feature-gates", "DynamicMIG=false", "--dynamic-mig-gpus", "all"], 0),
])
def test_dynamic_mig_asked_for_by_gate_name_offers_every_gpu(monkeypatch, capsys, flags,
                                                             mig_devices):
    monkeypatch.delenv("DYNAMIC_MIG_GPUS", raising=False)
    assert main(["inventory", "--simulate", "dgx-h100", "-o", "json", *flags]) == 0
    slices = json.loads(capsys.readouterr().out)["items"]
    migs = [d for s in slices for d in s["spec"].get("devices", [])
            if d["attributes"]["type"]["string"] == "mig"]
    assert len(migs) == mig_devices


def test_preparing_a_mig_device_the_node_does_not_offer_names_the_flags(tmp_path):
    from gpudra.driver.claims import ClaimError
    from tests.driver.node_fixture import claim, start_node

    node = start_node(tmp_path, options=ModelOptions(mig=NOTHING))
    try:
        with pytest.raises(ClaimError, match=r"'gpu-0-mig-1g10gb-19-6' is a MIG device this "
                                             r"node does not offer \(--dynamic-mig-gpus"):
            node.state.prepare(claim("11111111-1111-4111-8111-111111111111",
                                     "gpu-0-mig-1g10gb-19-6"))
        assert node.control.snapshot()["gpus"][0]["gpu_instances"] == []
    finally:
        node.close()
