"""Named crash points for crash-safety tests.

``GPUDRA_CRASH_AT=<point>`` makes the process die at once (``os._exit``: no cleanup, no
``finally``, like SIGKILL or a power cut) when it reaches that point. Unset in production,
where each check is one dictionary lookup.
"""

from __future__ import annotations

import os
import sys

ENV = "GPUDRA_CRASH_AT"
CRASH_EXIT_CODE = 86

POINTS = (
    "prepare:after-started",
    "prepare:after-mig-create",
    "prepare:after-mig-recorded",
    "prepare:after-settings",
    "prepare:after-cdi-write",
    "unprepare:after-settings-restored",
    "unprepare:after-mig-destroy",
    "unprepare:after-cdi-remove",
)


def crash_point(name: str) -> None:
    """Die here if the environment asks for it."""
    if name not in POINTS:  # a typo in a test would otherwise never fire
        raise ValueError(f"unknown crash point {name!r}")
    if os.environ.get(ENV) == name:
        sys.stderr.write(f"gpudra: crashing at {name} ({ENV})\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
