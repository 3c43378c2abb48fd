"""GPU recovery actions as NVML names them (``nvmlDeviceGpuRecoveryAction_t``), shared by
the simulator and its control side.

Source: ``nvml.h`` as mirrored by nvidia-ml-py 13.615 (``NVML_GPU_RECOVERY_ACTION_*``, read
through the field ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` = 230, an unsigned int). A driver
without the field answers NOT_SUPPORTED for it (``None`` here).
"""

from __future__ import annotations

from typing import Final

FIELD_GPU_RECOVERY_ACTION: Final = 230
"""``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``."""

NONE: Final = 0
GPU_RESET: Final = 1
NODE_REBOOT: Final = 2
DRAIN_P2P: Final = 3
DRAIN_AND_RESET: Final = 4

NAMES: Final = {"none": NONE, "gpu-reset": GPU_RESET, "node-reboot": NODE_REBOOT,
                "drain-p2p": DRAIN_P2P, "drain-and-reset": DRAIN_AND_RESET}
"""The command-line spelling of each action (``gpudra sim ... --recovery-action``)."""


def parse_action(text: str) -> int | None:
    """A name of :data:`NAMES`, or ``unsupported`` (a driver without the field: None)."""
    value = text.strip().lower()
    if value == "unsupported":
        return None
    if value not in NAMES:
        raise ValueError(f"{text!r} is not a recovery action (one of "
                         f"{', '.join(NAMES)}, unsupported)")
    return NAMES[value]
