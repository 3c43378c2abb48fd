"""A CEL environment that behaves like the one Kubernetes uses for DRA device selectors."""

from gpudra.scheduling.cel.environment import Selector, compile_selector
from gpudra.scheduling.cel.errors import CelCompileError, CelEvalError
from gpudra.scheduling.cel.values import DeviceView, device_view

__all__ = [
    "CelCompileError",
    "CelEvalError",
    "DeviceView",
    "Selector",
    "compile_selector",
    "device_view",
]
