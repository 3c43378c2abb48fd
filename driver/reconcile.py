"""Start-up reconciliation: make the node agree with its checkpoint after a crash."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from gpudra.driver import cdi
from gpudra.driver.checkpoint_model import Checkpoint, ClaimRecord, without_claim
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.claim_hardware import ClaimHardware
from gpudra.driver.mps import MpsReconcileReport

log = structlog.get_logger(__name__)


@dataclass
class ReconcileReport:
    """What start-up reconciliation found and fixed."""

    rolled_back_claims: list[str] = field(default_factory=list)
    destroyed_mig_devices: list[str] = field(default_factory=list)
    removed_cdi_specs: list[str] = field(default_factory=list)
    checkpoint_reset: str | None = None
    unavailable_gpus: dict[str, str] = field(default_factory=dict)
    """GPUs the checkpoint names that are not there or do not answer → why. Their records
    are kept (the GPU may come back) and nothing is done on them."""
    mps: MpsReconcileReport = field(default_factory=MpsReconcileReport)


def reconcile(
    store: CheckpointStore,
    hardware: ClaimHardware,
    *,
    undo: Callable[[ClaimRecord, Checkpoint], None],
    cdi_root: Path,
    driver: str,
    held: Collection[tuple[str, int]] = (),
) -> ReconcileReport:
    """Roll back half-prepared claims, adopt or restart prepared claims' MPS daemons and stop
    the others, destroy MIG devices no completed claim owns on GPUs gpudra partitioned, and
    remove CDI specs no completed claim owns.

    The caller holds every GPU's lock and the checkpoint's; ``undo`` rolls one claim back
    (hardware and CDI spec). ``held``: (GPU, GPU instance id) of MIG devices held for claims
    the node cannot name (:mod:`gpudra.driver.held`), never destroyed.
    """
    cdi.check_root(cdi_root)  # before anything changes: an unusable root stops start-up
    report = ReconcileReport()
    result = store.load_result()
    report.checkpoint_reset = result.reset_reason
    cp = result.checkpoint
    for record in list(cp.started().values()):
        undo(record, cp)
        cp = without_claim(cp, record.uid)
        report.rolled_back_claims.append(record.ref)
    store.save(cp)
    if hardware.mps is not None:
        # MPS daemons outlive the node daemon: adopt those of prepared claims, stop others.
        report.mps = hardware.mps.reconcile(hardware.mps_claims(cp))
    hardware.reassert_shares(cp)  # a crash mid-unprepare must not leave a share unlimited
    report.unavailable_gpus = {gpu: reason for gpu in sorted(gpus_named(cp))
                               if (reason := hardware.nvml.why_unavailable(gpu)) is not None}
    for parent in cp.mig_mode_baseline:
        if parent in report.unavailable_gpus:
            continue  # one missing GPU must not stop start-up; its baseline is kept
        report.destroyed_mig_devices.extend(clean_up_gpu(hardware, cp, parent, held))
    for uid, path in cdi.list_claim_specs(cdi_root, driver).items():
        if uid not in cp.completed():
            problem = cdi.remove_stale_spec(path)
            if problem is None:
                report.removed_cdi_specs.append(path.name)
            else:  # a read-only CDI root: said, not a crash loop
                log.warning(problem, spec=str(path))
    return report


def clean_up_gpu(hardware: ClaimHardware, cp: Checkpoint, parent: str,
                 held: Collection[tuple[str, int]] = ()) -> list[str]:
    """On a GPU gpudra partitioned: destroy the MIG devices no completed claim owns and put
    its MIG mode back when none is left; the UUIDs destroyed. Nothing on other GPUs.

    At start-up for every GPU, and later for a GPU that answers again (its claims may have
    been unprepared while it was gone). The caller holds the GPU's lock and the checkpoint's.
    """
    if parent not in cp.mig_mode_baseline:
        return []
    # Every GPU instance a completed claim uses, made by us or not: never destroyed here.
    keep = {
        d.mig.gpu_instance_id
        for r in cp.completed().values() for d in r.devices
        if d.mig is not None and d.mig.parent_uuid == parent and d.mig.gpu_instance_id >= 0
    }
    destroyed = []
    for instance in hardware.safe_instances(parent):
        if instance.gpu_instance_id in keep or (parent, instance.gpu_instance_id) in held:
            continue
        hardware.nvml.destroy_mig_device(parent, instance.gpu_instance_id,
                                         instance.compute_instance_id)
        destroyed.append(instance.uuid)
    # What is left unowned has no MIG device: a GPU instance without a compute instance (a
    # kill between the two creates). The MIG-device listing cannot see it; left there, it
    # keeps MIG mode on and its placement taken for good.
    for gi in hardware.safe_gpu_instances(parent):
        if gi.gpu_instance_id in keep or (parent, gi.gpu_instance_id) in held:
            continue
        if hardware.nvml.destroy_gpu_instance(parent, gi.gpu_instance_id):
            log.info("destroyed a GPU instance without a MIG device", gpu=parent,
                     gpu_instance=gi.gpu_instance_id, profile_id=gi.profile_id,
                     placement=gi.placement.start)
            destroyed.append(f"{parent}/gpu-instance-{gi.gpu_instance_id}")
    hardware.restore_mig_mode(parent, cp)
    return destroyed


def gpus_named(cp: Checkpoint) -> set[str]:
    """Every physical GPU the checkpoint names: MIG-mode baselines and claims' devices."""
    named = set(cp.mig_mode_baseline)
    for record in cp.claims.values():
        named.update(str(d.parent_uuid or d.uuid) for d in record.devices
                     if d.parent_uuid or d.uuid)
    return named
