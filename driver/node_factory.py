"""The node's device state at start-up, built whole: inventory, simulator roots, checkpoint,
reconciliation, then the devices to publish.

Blocking work (NVML, files, MIG teardown); the daemon runs it in a thread. What the daemon
was configured with reaches here as a :class:`NodeSetup` (``gpudra.kubeletplugin`` maps its
flags onto one); tests build one directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from gpudra.driver import recovery_step, vfio_setup
from gpudra.driver.checkpoint_model import ClaimRecord
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.claim_hardware import ClaimHardware
from gpudra.driver.commands import CommandRunner, HostCommandRunner
from gpudra.driver.device_model import ModelOptions
from gpudra.driver.device_state import DeviceState, owned_mig_uuids, reconcile_node
from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.faults import delay_point, fail_point
from gpudra.driver.featuregates import FeatureGates
from gpudra.driver.gpu_locks import GpuLocks
from gpudra.driver.gpu_shares import NONE, ShareableGpus, keeping
from gpudra.driver.held import held_mig_uuids
from gpudra.driver.inventory import (
    NodeInventory,
    read_inventory,
    simulated_pcie_root,
    sysfs_pcie_root,
)
from gpudra.driver.mig_offer import EVERY, MigOffer
from gpudra.driver.mps import MpsManager
from gpudra.driver.mps_pods import MpsPods
from gpudra.driver.node_view import NodeView
from gpudra.driver.nvml import Nvml
from gpudra.driver.recovery_step import AskApi
from gpudra.driver.shares import shared_gpus
from gpudra.driver.vfio import VfioPassthrough

log = structlog.get_logger("gpudra.node")


@dataclass(frozen=True)
class NodeSetup:
    """What a node's device state is built from."""

    driver: str
    pool: str
    """The node's name: its ResourceSlices' pool."""
    data_dir: Path
    """Checkpoint, GPU locks, MPS directories."""
    cdi_root: Path
    driver_root: DriverRoot
    commands_root: Path
    """The driver root the host commands (``nvidia-smi``) run from, as this process sees it."""
    gates: FeatureGates = field(default_factory=lambda: FeatureGates({}))
    shareable: ShareableGpus = NONE
    mig: MigOffer = EVERY
    simulate: bool = False
    """PCIe roots of the simulator; MPS claims without a tmpfs of their own."""
    sim_state: Path | None = None
    """The simulator's state: its host commands instead of the real ones."""
    fill_roots: tuple[Path | None, Path | None] = (None, None)
    """Generated device and driver roots to fill in for the simulated GPUs (simulator only)."""
    commands: CommandRunner | None = None
    """Host commands to use instead (tests)."""
    boot_id: str | None = None
    """The node's boot id; ``None``: the kernel's (tests name one)."""
    lock_timeout: float = 30.0
    mps_pods: MpsPods | None = None
    """MPS control daemons in pods of their own; ``None``: in this process's container."""


def build_device_state(setup: NodeSetup, nvml: Nvml,
                       ask_api: AskApi | None = None) -> DeviceState:
    """Read the inventory, reconcile the checkpoint with the hardware, and index the
    devices to publish (leaked MIG devices destroyed, our own kept dynamic).

    A checkpoint that cannot be read is rebuilt from what survives, asking the API server
    through ``ask_api`` (:mod:`gpudra.driver.recovery_step`); what nobody explains is held.
    """
    log.info("discovering devices", simulate=setup.simulate)
    delay_point("start:discovery")
    fail_point("start:discovery")
    gates = setup.gates
    resolver = simulated_pcie_root if setup.simulate else sysfs_pcie_root
    inventory = read_inventory(nvml, pcie_root=resolver)
    _fill_simulated_roots(setup, inventory)
    store = CheckpointStore(setup.data_dir, boot_id=setup.boot_id)
    held = recovery_step.open_checkpoint(store, facts=recovery_step.NodeFacts(
        driver=setup.driver, pool=setup.pool, node=setup.pool, cdi_root=setup.cdi_root,
        dynamic_mig=gates.enabled("DynamicMIG"),
        mps_dir=setup.data_dir / "mps" if gates.enabled("MPSSupport") else None,
    ), nvml=nvml, inventory=inventory, ask_api=ask_api)
    known_gpus: list[NodeInventory] = [inventory]  # the view's, once built: see below
    passthrough = vfio_setup.passthrough(setup, nvml, lambda: vfio_setup.bus_ids(known_gpus[-1]))
    options = ModelOptions(dynamic_mig=gates.enabled("DynamicMIG"), mig=setup.mig,
                           shareable=_shareable(setup, store, inventory),
                           vfio=vfio_setup.offer(setup, passthrough, inventory))
    hardware = _hardware(setup, nvml, passthrough)
    gpu_locks = GpuLocks(setup.data_dir / "gpu-locks")
    report = reconcile_node(store, hardware, gpu_locks,
                            NodeView.build(setup.pool, inventory, options).gpus,
                            cdi_root=setup.cdi_root, driver=setup.driver, held=held,
                            lock_timeout=setup.lock_timeout)
    log.info("reconciled node state", rolled_back=report.rolled_back_claims,
             destroyed_mig_devices=report.destroyed_mig_devices,
             removed_cdi_specs=report.removed_cdi_specs, reset=report.checkpoint_reset)
    # Re-read: reconciliation may have destroyed leaked MIG devices; our own stay dynamic.
    # Held MIG devices count as ours too: their GPU stays dynamic, the held slices tainted.
    cp = store.load()
    inventory = vfio_setup.with_passed_through(read_inventory(nvml, pcie_root=resolver), cp)
    vfio_setup.warn_unowned(passthrough, cp)
    view = NodeView.build(setup.pool, inventory, replace(
        options, owned_mig_uuids=owned_mig_uuids(cp) | held_mig_uuids(held)))
    _warn_unavailable(inventory, report.unavailable_gpus, cp.claims)
    known_gpus.append(inventory)
    # The driver's files for CDI specs, found once now instead of at the first prepare.
    setup.driver_root.warm()
    return DeviceState(driver=setup.driver, view=view, store=store, hardware=hardware,
                       gpu_locks=gpu_locks, cdi_root=setup.cdi_root,
                       driver_root=setup.driver_root, pcie_root=resolver, held=held,
                       lock_timeout=setup.lock_timeout)


def _hardware(setup: NodeSetup, nvml: Nvml,
              passthrough: VfioPassthrough | None = None) -> ClaimHardware:
    """NVML and the host commands, with the features the gates leave off refused."""
    gates = setup.gates
    commands: CommandRunner
    if setup.commands is not None:
        commands = setup.commands
    elif setup.sim_state is not None:
        # Imported here: a real node never loads the simulator's modules (memory).
        from gpudra.driver.sim.commands import SimulatedCommandRunner

        commands = SimulatedCommandRunner(setup.sim_state)
    else:
        commands = HostCommandRunner(setup.commands_root)
    # A real node gives each MPS claim a tmpfs for its containers' /dev/shm.
    mps = (MpsManager(commands, setup.data_dir / "mps", tmpfs_shm=not setup.simulate,
                      pods=setup.mps_pods)
           if gates.enabled("MPSSupport") else None)
    return ClaimHardware(nvml=nvml,
                         commands=commands if gates.enabled("TimeSlicingSettings") else None,
                         mps=mps, compute_modes=gates.enabled("ComputeModeSettings"),
                         vfio=passthrough)


def _fill_simulated_roots(setup: NodeSetup, inventory: NodeInventory) -> None:
    dev_root, driver_root = setup.fill_roots
    if dev_root is None and driver_root is None:
        return
    from gpudra.driver.sim.driver_root import populate_device_root, populate_driver_root

    if dev_root is not None:
        populate_device_root(dev_root, _minors(inventory))
    if driver_root is not None:
        populate_driver_root(driver_root, _minors(inventory), layout="host", devices=False)


def _shareable(setup: NodeSetup, store: CheckpointStore,
               inventory: NodeInventory) -> ShareableGpus:
    """``--shareable-gpus``, plus every GPU that still holds prepared shares (its shared
    device stays published until they are gone and the daemon restarts: see
    :func:`gpudra.driver.gpu_shares.keeping`)."""
    in_use = shared_gpus(store.load())  # this boot's claims only
    if not setup.gates.enabled("ConsumableCapacity"):
        for gpu, count in in_use.items():  # publishing it could get the slices refused
            log.warning("GPU holds prepared shares but the ConsumableCapacity gate is off: "
                        "its shared device is not published, and the scheduler does not "
                        "count these shares", gpu=gpu, shares=count)
        return setup.shareable
    minors = {g.probe.uuid: g.probe.minor for g in inventory.gpus}
    for gpu, count in in_use.items():
        if not setup.shareable.covers(minors.get(gpu, -1), gpu):
            log.warning("GPU is not in --shareable-gpus but holds prepared shares: its shared "
                        "device stays published until they are gone", gpu=gpu, shares=count)
    return keeping(setup.shareable, in_use)


def _minors(inventory: NodeInventory) -> list[int]:
    """Minor numbers of every GPU, also those that cannot be read now (they may answer)."""
    return sorted([g.probe.minor for g in inventory.gpus]
                  + [g.minor for g in inventory.unavailable if g.minor is not None])


def _warn_unavailable(inventory: NodeInventory, named: Mapping[str, str],
                      records: Mapping[str, ClaimRecord]) -> None:
    """One warning per GPU that is missing or does not answer, never an error: the node
    serves and publishes its other GPUs, and checkpoint records of the missing one stay."""
    claims: dict[str, list[str]] = {}
    for record in records.values():
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
