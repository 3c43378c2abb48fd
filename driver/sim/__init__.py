"""A simulated NVML placed *under* the real ``pynvml``, with its state on disk.

``install(profile, state_dir)`` makes every ``pynvml`` call answer for the simulated node
``profile`` (see :func:`node_profiles`); ``SimControl(state_dir)`` starts processes, raises
XIDs and loses GPUs from any process sharing the state directory.
"""

from __future__ import annotations

from pathlib import Path

import pynvml

from .control import SimControl
from .library import SimulatedNvml
from .profiles import gpu_models, node_profiles

__all__ = ["SimControl", "SimulatedNvml", "gpu_models", "install", "node_profiles", "uninstall"]


def install(profile: str, state_dir: Path) -> SimulatedNvml:
    """Make ``pynvml`` talk to a simulated ``profile`` node whose state lives in ``state_dir``.

    The first install on an empty directory creates the state from the profile (including
    pre-created MIG instances); later installs, in this or any process, continue from it.
    Installing another profile there swaps the node's hardware: its fresh state replaces
    the old one.
    Call again to switch profile or directory; call ``pynvml.nvmlInit()`` afterwards.
    """
    library = SimulatedNvml(profile, Path(state_dir))
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return library


def uninstall() -> None:
    """Detach the simulator: ``pynvml`` goes back to loading the real library on init."""
    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
