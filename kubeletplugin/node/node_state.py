"""The node daemon's configuration as the driver's :class:`~gpudra.driver.node_factory.NodeSetup`:
the one place ``gpudra.kubeletplugin`` builds the node's device state."""

from __future__ import annotations

from gpudra.driver.device_state import DeviceState
from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.mps_pods import MpsPods, MpsPodSettings, PodApi
from gpudra.driver.node_factory import NodeSetup
from gpudra.driver.node_factory import build_device_state as build
from gpudra.driver.nvml import Nvml
from gpudra.driver.recovery_step import AskApi
from gpudra.kubeletplugin.node.node_config import NodeConfig


def node_setup(config: NodeConfig, pod_api: PodApi | None = None) -> NodeSetup:
    """``pod_api``: the driver namespace's pods, for MPS control daemons in pods of their own
    (``--mps-daemons pod``)."""
    paths = config.paths
    mps_pods = None
    if config.mps_daemons == "pod" and pod_api is not None and config.mps_image:
        mps_pods = MpsPods(pod_api, MpsPodSettings(
            driver=config.driver_name, node=config.node_name, image=config.mps_image,
            host_driver_root=None if config.simulate else paths.host_driver_root))
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
        mps_pods=mps_pods,
    )


def build_device_state(config: NodeConfig, nvml: Nvml, ask_api: AskApi | None = None,
                       pod_api: PodApi | None = None) -> DeviceState:
    """:func:`gpudra.driver.node_factory.build_device_state` for this configuration."""
    return build(node_setup(config, pod_api), nvml, ask_api)
