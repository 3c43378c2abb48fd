"""One GPU that is gone (removed, replaced, lost) degrades that GPU only: inventory, start-up
reconciliation and unprepare go on for the others, and its checkpoint records are kept."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from gpudra.driver import sim
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.claims import OpaqueConfig
from gpudra.driver.faults import CRASH_EXIT_CODE
from gpudra.driver.inventory import read_inventory, simulated_pcie_root, with_answering_gpus
from gpudra.driver.nvml import open_nvml
from tests.driver.node_fixture import DRIVER, claim, start_node
from tests.driver.test_crash_safety import run_worker

UID = "44444444-4444-4444-8444-444444444444"
GV = "resource.nvidia.com/v1beta1"


@pytest.fixture(autouse=True)
def _detach_simulator() -> Iterator[None]:
    yield
    sim.uninstall()


def test_a_lost_gpu_is_left_out_of_the_inventory_and_added_when_it_answers(sim_state):
    nvml = open_nvml(simulate="h100-nvl-x2", sim_state=sim_state)
    try:
        whole = read_inventory(nvml, pcie_root=simulated_pcie_root)
        control = sim.SimControl(sim_state)
        control.set_gpu_lost(1, True)
        partial = read_inventory(nvml, pcie_root=simulated_pcie_root)
        assert [g.probe.uuid for g in partial.gpus] == [whole.gpus[0].probe.uuid]
        (lost,) = partial.unavailable
        assert (lost.index, lost.uuid, lost.minor, lost.lost) == (
            1, whole.gpus[1].probe.uuid, 1, True)
        assert lost.pci_bus_id == whole.gpus[1].probe.pci_bus_id
        assert "GPU_IS_LOST" in lost.reason
        # its NVLink peer is not readable: no domain of one
        assert partial.gpus[0].nvlink_domain is None
        # still lost: nothing changes
        assert with_answering_gpus(nvml, partial, pcie_root=simulated_pcie_root) is partial
        control.set_gpu_lost(1, False)
        again = with_answering_gpus(nvml, partial, pcie_root=simulated_pcie_root)
        assert again == whole
    finally:
        nvml.shutdown()


def test_a_removed_gpu_is_not_in_the_inventory_at_all(sim_state):
    nvml = open_nvml(simulate="l4-x4", sim_state=sim_state)
    try:
        sim.SimControl(sim_state).remove_gpu(1)
        inventory = read_inventory(nvml, pcie_root=simulated_pcie_root)
        assert [g.probe.minor for g in inventory.gpus] == [0, 2, 3]
        assert inventory.unavailable == ()
    finally:
        nvml.shutdown()


def test_unprepare_skips_a_gpu_that_was_replaced_and_undoes_the_rest(tmp_path):
    node = start_node(tmp_path)
    try:
        configs = (
            OpaqueConfig(requests=("gpu",), parameters={
                "apiVersion": GV, "kind": "GpuConfig", "computeMode": "ExclusiveProcess"}),
            OpaqueConfig(requests=("mig",), parameters={
                "apiVersion": GV, "kind": "MigDeviceConfig", "computeMode": "Prohibited"}))
        full, mig = claim(UID, "gpu-2"), claim(UID, "gpu-3-mig-1g10gb-19-6", request="mig")
        node.state.prepare(replace(full, devices=full.devices + mig.devices, configs=configs))
        assert node.control.snapshot()["gpus"][2]["compute_mode"] == 3
        old = node.control.gpu_uuid(3)
        node.control.replace_gpu(3)
        node.state.unprepare(UID)
        gpus = node.control.snapshot()["gpus"]
        assert gpus[2]["compute_mode"] == 0  # the GPU that is there was put back
        assert (gpus[3]["gpu_instances"], gpus[3]["mig_mode"]["current"]) == ([], 0)  # new
        cp = node.state.store.load()
        assert UID not in cp.claims
        assert old in cp.mig_mode_baseline  # kept: that board may come back
        assert not (node.cdi_root / f"k8s.{DRIVER}-claim_{UID}.json").exists()
    finally:
        node.close()


def test_a_half_prepared_claim_on_a_removed_gpu_is_rolled_back_and_cleaned_up_later(tmp_path):
    devices = ("gpu-0-mig-3g40gb-9-4", "gpu-1-mig-1g10gb-19-6", "gpu-2")
    assert run_worker(tmp_path, "prepare", "prepare:after-mig-recorded",
                      devices) == CRASH_EXIT_CODE
    control = sim.SimControl(tmp_path / "sim")
    gone = control.gpu_uuid(0)
    control.remove_gpu(0)

    node = start_node(tmp_path)  # reconciles: must not stop at the missing GPU
    try:
        cp = CheckpointStore(tmp_path / "plugin", boot_id="boot-1").load()
        assert cp.claims == {}  # rolled back
        assert gone in cp.mig_mode_baseline  # kept for when it comes back
        gpus = node.control.snapshot()["gpus"]
        assert len(gpus[0]["gpu_instances"]) == 1  # left as it was while it was out
        assert gpus[1]["gpu_instances"] == [] and gpus[1]["mig_mode"]["current"] == 0
        assert "gpu-0" not in node.state.index.devices.by_name()
        cdi_root = tmp_path / "cdi"
        assert (list(cdi_root.glob("*")) if cdi_root.exists() else []) == []
    finally:
        node.close()
        sim.uninstall()

    control.insert_gpu(0)
    node = start_node(tmp_path)  # back: what the claim left on it is destroyed
    try:
        gpu = node.control.snapshot()["gpus"][0]
        assert (gpu["gpu_instances"], gpu["mig_mode"]["current"]) == ([], 0)
        assert "gpu-0" in node.state.index.devices.by_name()
    finally:
        node.close()


def test_reconcile_reports_the_gpus_the_checkpoint_names_that_are_gone(tmp_path):
    node = start_node(tmp_path)
    try:
        node.state.prepare(claim(UID, "gpu-5-mig-1g10gb-19-6"))
        gone = node.control.gpu_uuid(5)
    finally:
        node.close()
        sim.uninstall()
    sim.SimControl(tmp_path / "sim").set_gpu_lost(5, True)
    node = start_node(tmp_path)
    try:
        report = node.state.reconcile()
        assert list(report.unavailable_gpus) == [gone]
        assert "GPU_IS_LOST" in report.unavailable_gpus[gone]
        assert UID in node.state.store.load().completed()  # kept until the kubelet says
    finally:
        node.close()
