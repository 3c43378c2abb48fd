"""The node's device state at start-up: inventory, checkpoint, reconciliation; later,
GPUs that did not answer at start-up and answer now.

Blocking work (NVML, files, MIG teardown); the daemon runs it in a thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import structlog

from gpudra.driver import recovery_step
from gpudra.driver.checkpoint_codec import CheckpointError
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.commands import CommandRunner, HostCommandRunner
from gpudra.driver.device_model import ModelOptions
from gpudra.driver.device_state import DeviceState
from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.faults import delay_point, fail_point
from gpudra.driver.gpu_locks import GpuLockTimeout
from gpudra.driver.gpu_shares import ShareableGpus, keeping
from gpudra.driver.held import held_mig_uuids
from gpudra.driver.inventory import (
    NodeInventory,
    read_inventory,
    simulated_pcie_root,
    sysfs_pcie_root,
    with_answering_gpus,
)
from gpudra.driver.mps import MpsManager
from gpudra.driver.nvml import Nvml, NvmlError
from gpudra.driver.prepare_plan import NodeIndex
from gpudra.driver.recovery_step import AskApi
from gpudra.driver.shares import shared_gpus
from gpudra.kubeletplugin.node_config import NodeConfig

log = structlog.get_logger("gpudra.node")


def build_device_state(config: NodeConfig, nvml: Nvml, ask_api: AskApi | None = None,
                       ) -> DeviceState:
    """Read the inventory, reconcile the checkpoint with the hardware, and index the
    devices to publish (leaked MIG devices destroyed, our own kept dynamic).

    A checkpoint that cannot be read is rebuilt from what survives, asking the API server
    through ``ask_api`` (:mod:`gpudra.driver.recovery_step`); what nobody explains is held.
    """
    log.info("discovering devices", simulate=config.simulate)
    delay_point("start:discovery")
    fail_point("start:discovery")
    paths, gates = config.paths, config.gates
    resolver = simulated_pcie_root if config.simulate else sysfs_pcie_root
    inventory = read_inventory(nvml, pcie_root=resolver)
    if config.simulate:
        from gpudra.driver.sim.driver_root import populate_device_root, populate_driver_root

        # Generated roots are filled in; a root given by flag is the caller's (a layout).
        if config.dev_root is None:
            populate_device_root(paths.dev_root, _minors(inventory))
        if config.driver_root is None:
            populate_driver_root(paths.driver_root, _minors(inventory), layout="host",
                                 devices=False)
    store = CheckpointStore(paths.data_dir)
    held = recovery_step.open_checkpoint(store, facts=recovery_step.NodeFacts(
        driver=config.driver_name, pool=config.node_name, node=config.node_name,
        cdi_root=config.cdi_root, dynamic_mig=gates.enabled("DynamicMIG"),
        mps_dir=paths.data_dir / "mps" if gates.enabled("MPSSupport") else None,
    ), nvml=nvml, inventory=inventory, ask_api=ask_api)
    options = ModelOptions(dynamic_mig=gates.enabled("DynamicMIG"),
                           shareable=_shareable(config, store, inventory))
    commands: CommandRunner
    if paths.sim_state is not None:
        # Imported here: a real node never loads the simulator (~0.5 MiB of modules).
        from gpudra.driver.sim.commands import SimulatedCommandRunner

        commands = SimulatedCommandRunner(paths.sim_state)
    else:
        commands = HostCommandRunner(paths.driver_root)
    # A real node gives each MPS claim a tmpfs for its containers' /dev/shm.
    mps = (MpsManager(commands, paths.data_dir / "mps", tmpfs_shm=config.simulate is None)
           if gates.enabled("MPSSupport") else None)
    state = DeviceState(
        driver=config.driver_name, nvml=nvml,
        commands=commands if gates.enabled("TimeSlicingSettings") else None, mps=mps,
        compute_modes=gates.enabled("ComputeModeSettings"),
        index=NodeIndex.build(config.node_name, inventory, options),
        store=store, cdi_root=config.cdi_root,
        driver_root=DriverRoot(paths.host_driver_root, container_root=paths.driver_root,
                               dev_root=paths.host_dev_root, dev_container_root=paths.dev_root,
                               hook_path=config.cdi_hook_path),
    )
    state.held = held
    report = state.reconcile()
    log.info("reconciled node state", rolled_back=report.rolled_back_claims,
             destroyed_mig_devices=report.destroyed_mig_devices,
             removed_cdi_specs=report.removed_cdi_specs, reset=report.checkpoint_reset)
    # Re-read: reconciliation may have destroyed leaked MIG devices; our own stay dynamic.
    inventory = read_inventory(nvml, pcie_root=resolver)
    state.model_options = ModelOptions(dynamic_mig=options.dynamic_mig,
                                       owned_mig_uuids=state.owned_mig_uuids()
                                       | held_mig_uuids(held),
                                       shareable=options.shareable)
    state.index = NodeIndex.build(config.node_name, inventory, state.model_options)
    state.inventory = inventory
    _warn_unavailable(inventory, report.unavailable_gpus, state)
    return state


def _shareable(config: NodeConfig, store: CheckpointStore,
               inventory: NodeInventory) -> ShareableGpus:
    """``--shareable-gpus``, plus every GPU that still holds prepared shares (its shared
    device stays published until they are gone and the daemon restarts: see
    :func:`gpudra.driver.gpu_shares.keeping`)."""
    in_use = shared_gpus(store.load())  # this boot's claims only
    if not config.gates.enabled("ConsumableCapacity"):
        for gpu, count in in_use.items():  # publishing it could get the slices refused
            log.warning("GPU holds prepared shares but the ConsumableCapacity gate is off: "
                        "its shared device is not published, and the scheduler does not "
                        "count these shares", gpu=gpu, shares=count)
        return config.shareable
    minors = {g.probe.uuid: g.probe.minor for g in inventory.gpus}
    for gpu, count in in_use.items():
        if not config.shareable.covers(minors.get(gpu, -1), gpu):
            log.warning("GPU is not in --shareable-gpus but holds prepared shares: its shared "
                        "device stays published until they are gone", gpu=gpu, shares=count)
    return keeping(config.shareable, in_use)


def _minors(inventory: NodeInventory) -> list[int]:
    """Minor numbers of every GPU, also those that cannot be read now (they may answer)."""
    return sorted([g.probe.minor for g in inventory.gpus]
                  + [g.minor for g in inventory.unavailable if g.minor is not None])


def _warn_unavailable(
    inventory: NodeInventory, named: Mapping[str, str], state: DeviceState,
) -> None:
    """One warning per GPU that is missing or does not answer, never an error: the node
    serves and publishes its other GPUs, and checkpoint records of the missing one stay."""
    claims: dict[str, list[str]] = {}
    for record in state.store.load().claims.values():
        for gpu in {str(d.parent_uuid or d.uuid) for d in record.devices}:
            claims.setdefault(gpu, []).append(record.ref)
    for unread in inventory.unavailable:
        log.warning("GPU does not answer NVML; its devices are published once it does",
                    gpu=unread.uuid, index=unread.index, minor=unread.minor,
                    reason=unread.reason, claims=claims.get(unread.uuid or "", []))
    enumerated = {g.uuid for g in inventory.unavailable}
    for uuid, reason in named.items():
        if uuid not in enumerated:
            log.warning("GPU named in the checkpoint is not usable; its records are kept",
                        gpu=uuid, reason=reason, claims=claims.get(uuid, []))


def pick_up_answering_gpus(config: NodeConfig, state: DeviceState, nvml: Nvml) -> bool:
    """Publish GPUs that could not be read at start-up once they answer; True when the
    devices changed. Blocking NVML reads of those GPUs only: call it off the event loop,
    e.g. from the health watcher's thread when a lost GPU answers again."""
    inventory = state.inventory
    if inventory is None or not inventory.unavailable:
        return False
    answering = [g.uuid for g in inventory.unavailable
                 if g.uuid is not None and nvml.why_unavailable(g.uuid) is None]
    if not answering:
        return False
    resolver = simulated_pcie_root if config.simulate else sysfs_pcie_root
    try:
        # Claims on it may have been unprepared while it was gone: clean up first, so what
        # they left is not published as an admin's MIG layout.
        destroyed = state.clean_up_gpus(answering)
        updated = with_answering_gpus(nvml, inventory, pcie_root=resolver)
    except (NvmlError, GpuLockTimeout, CheckpointError, OSError) as exc:
        log.warning("cannot add GPUs that answer again; trying on the next change",
                    gpus=answering, error=str(exc))
        return False
    if destroyed:
        log.info("destroyed MIG devices no prepared claim owns", uuids=destroyed)
    if updated is inventory:
        return False
    # The GPUs already published are built exactly as before; MIG devices prepared since
    # start-up count as ours on the new ones.
    options = replace(state.model_options, owned_mig_uuids=frozenset(
        state.model_options.owned_mig_uuids) | state.owned_mig_uuids())
    state.index = NodeIndex.build(state.index.pool, updated, options)
    state.inventory, state.model_options = updated, options
    back = {g.probe.uuid for g in updated.gpus} - {g.probe.uuid for g in inventory.gpus}
    for uuid in sorted(back):
        log.info("GPU answers NVML again; publishing its devices", gpu=uuid)
    return True


def watched_gpus(state: DeviceState) -> list[str]:
    """Every physical GPU, including those that publish only (static) MIG devices and
    those that do not answer yet."""
    uuids = set()
    for device in state.index.devices.devices:
        key = "uuid" if device.type in ("gpu", "gpu-share") else "parentUUID"
        uuids.add(str(device.attributes[key]))
    if state.inventory is not None:
        uuids.update(g.uuid for g in state.inventory.unavailable if g.uuid is not None)
    return sorted(uuids)
