"""Is the NVIDIA driver ready for the node daemon? What is missing, and where it was looked for.

A driver container (GPU Operator) or a node's driver installer may still be at work when the
daemon's pod starts. Waiting here, with a diagnosis in the log, beats a crash loop whose
only message is that NVML is missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from gpudra.driver.driver_root import (
    BINARY_DIRS,
    LIBRARY_DIRS,
    REQUIRED_CONTROL_NODES,
    REQUIRED_LIBRARIES,
    DriverRoot,
)

log = structlog.get_logger(__name__)

REPEAT_EVERY = 60.0
"""Seconds between repeats of an unchanged diagnosis in the log."""


def diagnose(root: DriverRoot) -> list[str]:
    """What keeps the driver from being usable; empty when it is ready."""
    root.refresh()
    problems = []
    # A root that is not there at all is one line, not one per file under it: the usual cause
    # is a wrong --driver-root/--dev-root (or driverRoot/devRoot), not a driver still at work.
    driver_missing = not root.scan_root.is_dir()
    dev_missing = root.dev.local != root.scan_root and not root.dev.local.is_dir()
    if driver_missing:
        problems.append(f"driver root {root.scan_root} does not exist (wrong --driver-root? "
                        "a driver container may also not have mounted it yet)")
    if dev_missing:
        problems.append(f"device root {root.dev.local} does not exist (wrong --dev-root?)")
    if driver_missing or dev_missing:
        return problems
    for name in REQUIRED_LIBRARIES:
        if root.find_library(name) is None:
            problems.append(f"{name} not found under driver root {root.scan_root} "
                            f"(searched {', '.join(LIBRARY_DIRS)})")
    if root.find_binary("nvidia-smi") is None:
        problems.append(f"nvidia-smi not found under driver root {root.scan_root} "
                        f"(searched {', '.join(BINARY_DIRS)})")
    for name in REQUIRED_CONTROL_NODES:
        if root.device_node(f"/dev/{name}") is None:
            problems.append(f"/dev/{name} not found under device root {root.dev.local}")
    module = root.kernel_module_version()
    libraries = root.driver_version()
    if module is None:
        problems.append("the NVIDIA kernel module is not loaded (no "
                        f"{root.dev.local_path('proc/driver/nvidia/version')})")
    elif libraries is not None and module != libraries:
        problems.append(f"kernel module {module} but libraries {libraries} under driver root "
                        f"{root.scan_root}: an upgrade is in progress")
    return problems


def wait_for_driver(
    root: DriverRoot, *, timeout: float | None, interval: float = 5.0,
    sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Poll until :func:`diagnose` finds nothing (returns ``[]``) or ``timeout`` seconds
    pass (returns what is still missing); ``None`` waits for ever."""
    start = clock()
    said: list[str] | None = None
    said_at = start
    while True:
        problems = diagnose(root)
        now = clock()
        if not problems:
            if said is not None:
                log.info("NVIDIA driver is ready", waited_s=round(now - start, 1),
                         version=root.driver_version())
            return []
        if timeout is not None and now - start >= timeout:
            return problems
        if problems != said or now - said_at >= REPEAT_EVERY:
            log.warning("waiting for the NVIDIA driver", missing=problems,
                        waited_s=round(now - start, 1))
            said, said_at = problems, now
        # Never sleep past the deadline: --timeout 3 with the 5 s interval gives up at 3 s.
        sleep(interval if timeout is None else min(interval, start + timeout - now))
