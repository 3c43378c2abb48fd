"""NVML constants the simulator answers with (values from nvml.h, NVML_API_VERSION 13).

Kept independent of ``pynvml`` so the simulated library is a library, not a pynvml client;
the tests check every value against ``pynvml`` and ``data/gpus.yaml``.
"""

from __future__ import annotations

from enum import IntEnum


class Return(IntEnum):
    """``nvmlReturn_t``."""

    SUCCESS = 0
    ERROR_UNINITIALIZED = 1
    ERROR_INVALID_ARGUMENT = 2
    ERROR_NOT_SUPPORTED = 3
    ERROR_NO_PERMISSION = 4
    ERROR_ALREADY_INITIALIZED = 5
    ERROR_NOT_FOUND = 6
    ERROR_INSUFFICIENT_SIZE = 7
    ERROR_INSUFFICIENT_POWER = 8
    ERROR_DRIVER_NOT_LOADED = 9
    ERROR_TIMEOUT = 10
    ERROR_IRQ_ISSUE = 11
    ERROR_LIBRARY_NOT_FOUND = 12
    ERROR_FUNCTION_NOT_FOUND = 13
    ERROR_CORRUPTED_INFOROM = 14
    ERROR_GPU_IS_LOST = 15
    ERROR_RESET_REQUIRED = 16
    ERROR_OPERATING_SYSTEM = 17
    ERROR_LIB_RM_VERSION_MISMATCH = 18
    ERROR_IN_USE = 19
    ERROR_MEMORY = 20
    ERROR_NO_DATA = 21
    ERROR_VGPU_ECC_NOT_SUPPORTED = 22
    ERROR_INSUFFICIENT_RESOURCES = 23
    ERROR_FREQ_NOT_SUPPORTED = 24
    ERROR_ARGUMENT_VERSION_MISMATCH = 25
    ERROR_DEPRECATED = 26
    ERROR_NOT_READY = 27
    ERROR_GPU_NOT_FOUND = 28
    ERROR_INVALID_STATE = 29
    ERROR_RESET_TYPE_NOT_SUPPORTED = 30
    ERROR_UNKNOWN = 999


# What nvmlErrorString answers; pynvml asks for codes its own table lacks (IN_USE, ...).
ERROR_STRINGS: dict[int, str] = {
    Return.SUCCESS: "Success",
    Return.ERROR_UNINITIALIZED: "Uninitialized",
    Return.ERROR_INVALID_ARGUMENT: "Invalid Argument",
    Return.ERROR_NOT_SUPPORTED: "Not Supported",
    Return.ERROR_NO_PERMISSION: "Insufficient Permissions",
    Return.ERROR_ALREADY_INITIALIZED: "Already Initialized",
    Return.ERROR_NOT_FOUND: "Not Found",
    Return.ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    Return.ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    Return.ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    Return.ERROR_TIMEOUT: "Timeout",
    Return.ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    Return.ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    Return.ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    Return.ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    Return.ERROR_GPU_IS_LOST: "GPU is lost",
    Return.ERROR_RESET_REQUIRED: "GPU requires restart",
    Return.ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
    Return.ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    Return.ERROR_IN_USE: "In use by another client",
    Return.ERROR_MEMORY: "Insufficient Memory",
    Return.ERROR_NO_DATA: "No data",
    Return.ERROR_VGPU_ECC_NOT_SUPPORTED: "vGPU ECC is not supported",
    Return.ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    Return.ERROR_FREQ_NOT_SUPPORTED: "Frequency not supported",
    Return.ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    Return.ERROR_DEPRECATED: "Deprecated",
    Return.ERROR_NOT_READY: "Not ready",
    Return.ERROR_GPU_NOT_FOUND: "GPU not found",
    Return.ERROR_INVALID_STATE: "Invalid state",
    Return.ERROR_RESET_TYPE_NOT_SUPPORTED: "Reset type not supported",
    Return.ERROR_UNKNOWN: "Unknown Error",
}

DEVICE_ARCH = {"TURING": 6, "AMPERE": 7, "ADA": 8, "HOPPER": 9, "BLACKWELL": 10}
BRAND = {"TESLA": 2, "NVIDIA": 14}

MIG_DISABLE = 0
MIG_ENABLE = 1

COMPUTEMODE_DEFAULT = 0
COMPUTEMODE_EXCLUSIVE_THREAD = 1  # "support removed" in nvml.h
COMPUTEMODE_PROHIBITED = 2
COMPUTEMODE_EXCLUSIVE_PROCESS = 3

NVLINK_DEVICE_TYPE_GPU = 0
NVLINK_DEVICE_TYPE_SWITCH = 2
NVLINK_MAX_LINKS = 36

GPU_INSTANCE_PROFILE_COUNT = 18
COMPUTE_INSTANCE_PROFILE_COUNT = 9
COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT = 1
MAX_GPU_INSTANCE_IDS = 15  # gi0..gi14 per GPU (mig-minors)
MAX_COMPUTE_INSTANCE_IDS = 8  # ci0..ci7 per GPU instance

EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_PSTATE = 0x4
EVENT_XID_CRITICAL = 0x8
EVENT_CLOCK = 0x10
SUPPORTED_EVENTS = (
    EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_PSTATE | EVENT_XID_CRITICAL | EVENT_CLOCK
)

VALUE_NOT_AVAILABLE_UINT = 0xFFFFFFFF

# Versioned structs carry (version << 24 | sizeof) in their first field.
STRUCT_VERSION_SHIFT = 24


class NvmlFailure(Exception):
    """Raised inside the simulator to return ``code`` from the current NVML call."""

    def __init__(self, code: Return) -> None:
        super().__init__(ERROR_STRINGS.get(code, f"NVML error {int(code)}"))
        self.code = code
