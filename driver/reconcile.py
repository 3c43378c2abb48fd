"""Start-up reconciliation: make the node agree with its checkpoint after a crash."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpudra.driver import cdi
from gpudra.driver.checkpoint_model import Checkpoint, ClaimRecord, without_claim
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.claim_hardware import ClaimHardware


@dataclass
class ReconcileReport:
    """What start-up reconciliation found and fixed."""

    rolled_back_claims: list[str] = field(default_factory=list)
    destroyed_mig_devices: list[str] = field(default_factory=list)
    removed_cdi_specs: list[str] = field(default_factory=list)
    checkpoint_reset: str | None = None


def reconcile(
    store: CheckpointStore,
    hardware: ClaimHardware,
    *,
    undo: Callable[[ClaimRecord, Checkpoint], None],
    cdi_root: Path,
    driver: str,
) -> ReconcileReport:
    """Roll back half-prepared claims, destroy MIG devices no completed claim owns on GPUs
    gpudra partitioned, and remove CDI specs no completed claim owns.

    The caller holds every GPU's lock and the checkpoint's; ``undo`` rolls one claim back
    (hardware and CDI spec).
    """
    report = ReconcileReport()
    result = store.load_result()
    report.checkpoint_reset = result.reset_reason
    cp = result.checkpoint
    for record in list(cp.started().values()):
        undo(record, cp)
        cp = without_claim(cp, record.uid)
        report.rolled_back_claims.append(record.ref)
    store.save(cp)
    keep = {
        (d.mig.parent_uuid, d.mig.gpu_instance_id)
        for r in cp.completed().values() for d in r.devices
        if d.mig is not None and d.mig.created
    }
    for parent in cp.mig_mode_baseline:
        for instance in hardware.safe_instances(parent):
            if (parent, instance.gpu_instance_id) in keep:
                continue
            hardware.nvml.destroy_mig_device(parent, instance.gpu_instance_id,
                                             instance.compute_instance_id)
            report.destroyed_mig_devices.append(instance.uuid)
        hardware.restore_mig_mode(parent, cp)
    for uid, path in cdi.list_claim_specs(cdi_root, driver).items():
        if uid not in cp.completed():
            path.unlink(missing_ok=True)
            report.removed_cdi_specs.append(path.name)
    return report
