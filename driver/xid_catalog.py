"""What each XID needs to recover from, when the driver does not say (NVIDIA's XID catalog).

Where the driver offers it, NVML's GPU recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``)
is the authority and this table is not consulted (``gpudra.driver.health``). Older drivers do
not offer the field; for them an XID's recovery comes from this table.

Sources (facts only, one per row's ``source``):

- ``catalog``: NVIDIA, "Analyzing Xid Errors with the Xid Catalog",
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, column "Resolution
  Bucket (Immediate Action)": ``RESTART_APP`` (the program's fault; the GPU is fine),
  ``RESET_GPU``, ``RESTART_BM`` (reboot the node), ``IGNORE``.
- ``mem``: NVIDIA, "A100 GPU memory error management",
  https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/ — XID 48 uncorrectable ECC, 63/64
  row-remapping recorded / failed (a pending remap takes effect at the next GPU reset), 94
  contained and 95 uncontained ECC errors.
- ``dra``: NVIDIA's DRA driver's default ignore list (13, 31, 43, 45, 68, 109), which marks
  these application errors (reference/nvidia-dra-driver-gpu.md §6).

XIDs absent from the table are neither: they taint ``NoSchedule`` and clear after the quiet
period, as every critical XID did before recovery was classified.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Recovery = Literal["restart-app", "gpu-reset", "node-reboot"]


@dataclass(frozen=True)
class XidEntry:
    xid: int
    name: str
    recovery: Recovery
    source: str


_ROWS: Final = (
    XidEntry(8, "GPU stopped processing", "restart-app", "catalog"),
    XidEntry(11, "invalid or corrupted push buffer stream", "restart-app", "catalog"),
    XidEntry(13, "graphics engine exception", "restart-app", "catalog, dra"),
    XidEntry(31, "GPU memory page fault", "restart-app", "catalog, dra"),
    XidEntry(43, "GPU stopped processing (channel reset)", "restart-app", "catalog, dra"),
    XidEntry(45, "preemptive cleanup after an earlier error", "restart-app", "catalog, dra"),
    XidEntry(68, "video decoder exception", "restart-app", "catalog, dra"),
    XidEntry(109, "context switch timeout", "restart-app", "catalog, dra"),
    XidEntry(48, "double-bit (uncorrectable) ECC error", "gpu-reset", "catalog, mem"),
    XidEntry(63, "row remapping recorded; it applies at the next GPU reset", "gpu-reset",
             "mem"),
    XidEntry(64, "row remapping failed to record", "gpu-reset", "mem"),
    XidEntry(74, "NVLink error", "gpu-reset", "catalog"),
    XidEntry(79, "GPU has fallen off the bus", "node-reboot", "catalog"),
    XidEntry(92, "high single-bit ECC error rate", "gpu-reset", "catalog"),
    XidEntry(94, "contained ECC error; the remap applies at the next GPU reset", "gpu-reset",
             "mem"),
    XidEntry(95, "uncontained ECC error", "gpu-reset", "catalog, mem"),
    XidEntry(119, "GSP RPC timeout", "gpu-reset", "catalog"),
    XidEntry(120, "GSP error", "gpu-reset", "catalog"),
    XidEntry(140, "unrecovered ECC error", "gpu-reset", "catalog"),
)

CATALOG: Final = {row.xid: row for row in _ROWS}


def recovery_of(xid: int) -> Recovery | None:
    """The catalog's recovery for ``xid``; None when the catalog does not list it."""
    row = CATALOG.get(xid)
    return row.recovery if row is not None else None


def application_xids() -> frozenset[int]:
    """XIDs the catalog files as the program's fault."""
    return frozenset(row.xid for row in _ROWS if row.recovery == "restart-app")
