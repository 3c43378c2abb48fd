"""The node daemon's configuration as the driver's :class:`~gpudra.driver.node_factory.NodeSetup`:
the one place ``gpudra.kubeletplugin`` builds the node's device state."""

from __future__ import annotations

from gpudra.driver.device_state import DeviceState
from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.node_factory import NodeSetup
from gpudra.driver.node_factory import build_device_state as build
from gpudra.driver.nvml import Nvml
from gpudra.driver.recovery_step import AskApi
from gpudra.kubeletplugin.node.node_config import NodeConfig


def node_setup(config: NodeConfig) -> NodeSetup:
    paths = config.paths
    return NodeSetup(
        driver=config.driver_name, pool=config.node_name, data_dir=paths.data_dir,
        cdi_root=config.cdi_root,
        driver_root=DriverRoot(paths.host_driver_root, container_root=paths.driver_root,
                               dev_root=paths.host_dev_root, dev_container_root=paths.dev_root,
                               hook_path=config.cdi_hook_path),
        commands_root=paths.driver_root, gates=config.gates, shareable=config.shareable,
        mig=config.mig, simulate=config.simulate is not None, sim_state=paths.sim_state,
        # Generated roots are filled in; a root given by flag is the caller's (a layout).
        fill_roots=(paths.dev_root if config.simulate and config.dev_root is None else None,
                    paths.driver_root if config.simulate and config.driver_root is None
                    else None),
    )


def build_device_state(config: NodeConfig, nvml: Nvml, ask_api: AskApi | None = None,
                       ) -> DeviceState:
    """:func:`gpudra.driver.node_factory.build_device_state` for this configuration."""
    return build(node_setup(config), nvml, ask_api)
