"""Kubernetes' standard device attributes (``resource.kubernetes.io/pcieRoot``, a string
``pci<domain>:<bus>``, and ``resource.kubernetes.io/numaNode``, an int) are published beside
ours on every GPU and MIG device, in the slices the API server receives, so a claim can line
a GPU up with another driver's NIC or CPUs by ``matchAttribute``."""

from __future__ import annotations

import re

import pytest

from gpudra.controller.slice_validation import ensure_valid
from gpudra.controller.slices import build_slices
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.inventory import read_inventory, simulated_pcie_root
from gpudra.driver.mig_offer import EVERY
from gpudra.driver.nvml import Nvml

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-a100-static-mig", "l4-x4"])
def test_every_gpu_and_mig_device_publishes_both(profile, simulate):
    simulate(profile)
    inventory = read_inventory(Nvml(), pcie_root=simulated_pcie_root)
    slices = build_slices(build_devices(inventory, ModelOptions(mig=EVERY)),
                          driver="gpu.nvidia.com", node_name="node-a")
    ensure_valid(slices)  # the API server's validation, limits per device included
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert devices
    for device in devices:
        attributes = device["attributes"]
        assert re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", attributes[PCIE_ROOT]["string"])
        assert attributes[NUMA_NODE] == {"int": attributes["numaNode"]["int"]}
    # the two sockets of a DGX H100 are told apart
    if profile == "dgx-h100":
        assert {d["attributes"][NUMA_NODE]["int"] for d in devices} == {0, 1}
