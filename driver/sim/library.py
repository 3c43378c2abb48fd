"""The simulated ``libnvidia-ml``: one object whose attributes are NVML's C symbols.

``pynvml`` looks every function up with ``getattr(pynvml.nvmlLib, name)`` and calls it with
ctypes arguments, so installing a :class:`SimulatedNvml` as ``pynvml.nvmlLib`` runs the real
wrappers (struct versions, buffer sizes, error mapping) against simulated GPUs. A symbol not
defined here raises AttributeError, which pynvml reports as ``NVMLError_FunctionNotFound``.
"""

from __future__ import annotations

from .api_device import DeviceApi
from .api_events import EventApi
from .api_fabric import FabricApi
from .api_fields import FieldApi
from .api_mig import MigApi
from .api_system import SystemApi
from .api_usage import UsageApi


class SimulatedNvml(SystemApi, DeviceApi, MigApi, EventApi, UsageApi, FabricApi,
                    FieldApi):
    """NVML for one simulated node profile, with its state in a shared state directory."""

    def __repr__(self) -> str:
        return f"<SimulatedNvml {self.node.name} at {self.store.dir}>"


def symbols() -> list[str]:
    """Every NVML C symbol the simulator implements."""
    return sorted(name for name in dir(SimulatedNvml) if name.startswith("nvml"))
