"""NVML's GPU recovery actions (``nvmlDeviceGpuRecoveryAction_t``, read through the field
``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``), by the names taints and messages show.

Source: ``nvml.h`` as mirrored by nvidia-ml-py 13.615 (``NVML_GPU_RECOVERY_ACTION_*``).
"""

from __future__ import annotations

from typing import Final

NONE: Final = 0
NAMES: Final = {
    1: "gpu-reset",
    2: "node-reboot",
    3: "drain-p2p",
    4: "drain-and-reset",
    5: "recover-imex-domain",
    6: "bus-reset",
    7: "system-reboot",
}
"""Every action but NONE, as a taint value (a label value: lowercase, dashes)."""
CATALOG_ACTIONS: Final = {"gpu-reset": 1, "node-reboot": 2}
"""The XID catalog's recoveries (``gpudra.driver.xid_catalog``) as NVML actions."""


def name(action: int) -> str:
    """``gpu-reset`` …; an action this build does not know is ``action-<n>`` (still needed)."""
    return NAMES.get(action, f"action-{action}")
