"""``nvmlDeviceGetFieldValues``: the GPU recovery action field; every other field id is
answered NOT_SUPPORTED in its own entry, as a driver answers fields it does not know."""

from __future__ import annotations

import time

from .cabi import as_int, target
from .codes import NvmlFailure, Return
from .core import LibraryCore, symbol
from .recovery import FIELD_GPU_RECOVERY_ACTION

_VALUE_TYPE_UNSIGNED_INT = 1  # nvmlValueType_t


class FieldApi(LibraryCore):
    @symbol
    def nvmlDeviceGetFieldValues(self, device: object, count: object, values: object) -> None:
        _, gpu = self.full_gpu(device)
        n = as_int(count)
        entries = target(values)
        if n < 0 or n > len(entries):
            raise NvmlFailure(Return.ERROR_INVALID_ARGUMENT)
        now_us = int(time.time() * 1_000_000)
        for i in range(n):
            entry = entries[i]  # a view into the caller's array
            if entry.fieldId == FIELD_GPU_RECOVERY_ACTION and gpu.recovery_action is not None:
                entry.valueType = _VALUE_TYPE_UNSIGNED_INT
                entry.value.uiVal = gpu.recovery_action
                entry.timestamp = now_us
                entry.latencyUsec = 0
                entry.nvmlReturn = int(Return.SUCCESS)
            else:
                entry.nvmlReturn = int(Return.ERROR_NOT_SUPPORTED)
