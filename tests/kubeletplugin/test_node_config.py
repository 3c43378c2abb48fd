"""NodeConfig: the daemon's defaults for paths it was not given."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpudra.kubeletplugin.node.node_config import NodeConfig, NodePaths


def test_real_hardware_defaults():
    config = NodeConfig(node_name="n", plugins_dir=Path("/plugins"))
    assert config.paths == NodePaths(data_dir=Path("/plugins/gpu.nvidia.com"), sim_state=None,
                                     driver_root=Path("/"), host_driver_root=Path("/"))


def test_simulated_node_keeps_everything_in_its_data_dir():
    config = NodeConfig(node_name="n", plugins_dir=Path("/p"), driver_name="x.example.com",
                        simulate="dgx-h100")
    assert config.paths == NodePaths(
        data_dir=Path("/p/x.example.com"), sim_state=Path("/p/x.example.com/sim"),
        driver_root=Path("/p/x.example.com/sim-driver-root"),
        host_driver_root=Path("/p/x.example.com/sim-driver-root"),
        dev_root=Path("/p/x.example.com/sim-dev-root"),
        host_dev_root=Path("/p/x.example.com/sim-dev-root"))


def test_given_paths_win():
    config = NodeConfig(node_name="n", simulate="dgx-h100", sim_state=Path("/state"),
                        driver_root=Path("/driver-root"), host_driver_root=Path("/run/nvidia"),
                        dev_root=Path("/dev-root"), host_dev_root=Path("/"))
    paths = config.paths
    assert (paths.sim_state, paths.driver_root, paths.host_driver_root) == (
        Path("/state"), Path("/driver-root"), Path("/run/nvidia"))
    assert (paths.dev_root, paths.host_dev_root) == (Path("/dev-root"), Path("/"))


def test_sim_state_without_simulate_is_ignored():
    assert NodeConfig(node_name="n", sim_state=Path("/state")).paths.sim_state is None


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        NodeConfig(node_name="n").node_name = "m"  # type: ignore[misc]
