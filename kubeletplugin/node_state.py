"""The node's device state at start-up: inventory, checkpoint, reconciliation.

Blocking work (NVML, files, MIG teardown); the daemon runs it in a thread.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from gpudra.driver.checkpoint_codec import CheckpointCorrupt
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.commands import CommandRunner, HostCommandRunner
from gpudra.driver.device_model import ModelOptions
from gpudra.driver.device_state import DeviceState
from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.faults import delay_point
from gpudra.driver.inventory import read_inventory, simulated_pcie_root, sysfs_pcie_root
from gpudra.driver.mps import MpsManager
from gpudra.driver.nvml import Nvml
from gpudra.driver.prepare_plan import NodeIndex
from gpudra.driver.sim.commands import SimulatedCommandRunner
from gpudra.kubeletplugin.node_config import NodeConfig

log = structlog.get_logger("gpudra.node")


def open_checkpoint(data_dir: Path) -> CheckpointStore:
    """Load the checkpoint; a corrupt one is moved aside and the node starts empty."""
    store = CheckpointStore(data_dir)
    try:
        store.load()
    except CheckpointCorrupt as exc:
        # Refusing to start would leave every GPU on the node unusable; an empty checkpoint
        # plus start-up reconciliation is the safe recovery. Loud, and the file is kept.
        moved = store.quarantine()
        log.error("checkpoint is corrupt; moved aside and starting empty", error=str(exc),
                  moved_to=str(moved))
    return store


def build_device_state(config: NodeConfig, nvml: Nvml) -> DeviceState:
    """Read the inventory, reconcile the checkpoint with the hardware, and index the
    devices to publish (leaked MIG devices destroyed, our own kept dynamic)."""
    log.info("discovering devices", simulate=config.simulate)
    delay_point("start:discovery")
    paths, gates = config.paths, config.gates
    resolver = simulated_pcie_root if config.simulate else sysfs_pcie_root
    inventory = read_inventory(nvml, pcie_root=resolver)
    if config.simulate:
        from gpudra.driver.sim.driver_root import populate_driver_root

        populate_driver_root(paths.driver_root, [g.probe.minor for g in inventory.gpus])
    store = open_checkpoint(paths.data_dir)
    options = ModelOptions(dynamic_mig=gates.enabled("DynamicMIG"))
    commands: CommandRunner
    if paths.sim_state is not None:
        commands = SimulatedCommandRunner(paths.sim_state)
    else:
        commands = HostCommandRunner(paths.driver_root)
    mps = MpsManager(commands, paths.data_dir / "mps") if gates.enabled("MPSSupport") else None
    state = DeviceState(
        driver=config.driver_name, nvml=nvml,
        commands=commands if gates.enabled("TimeSlicingSettings") else None, mps=mps,
        compute_modes=gates.enabled("ComputeModeSettings"),
        index=NodeIndex.build(config.node_name, inventory, options),
        store=store, cdi_root=config.cdi_root,
        driver_root=DriverRoot(paths.host_driver_root, container_root=paths.driver_root),
    )
    report = state.reconcile()
    log.info("reconciled node state", rolled_back=report.rolled_back_claims,
             destroyed_mig_devices=report.destroyed_mig_devices,
             removed_cdi_specs=report.removed_cdi_specs, reset=report.checkpoint_reset)
    # Re-read: reconciliation may have destroyed leaked MIG devices; our own stay dynamic.
    inventory = read_inventory(nvml, pcie_root=resolver)
    state.index = NodeIndex.build(config.node_name, inventory, ModelOptions(
        dynamic_mig=options.dynamic_mig, owned_mig_uuids=state.owned_mig_uuids()))
    return state


def watched_gpus(state: DeviceState) -> list[str]:
    """Every physical GPU, including those that publish only (static) MIG devices."""
    uuids = set()
    for device in state.index.devices.devices:
        key = "uuid" if device.type == "gpu" else "parentUUID"
        uuids.add(str(device.attributes[key]))
    return sorted(uuids)
