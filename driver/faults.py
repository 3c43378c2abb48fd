"""Named crash points for crash-safety tests.

``GPUDRA_CRASH_AT=<point>`` makes the process die at once (``os._exit``: no cleanup, no
``finally``, like SIGKILL or a power cut) when it reaches that point. Unset in production,
where each check is one dictionary lookup.
"""

from __future__ import annotations

import os
import sys
import time

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


DELAY_ENV = "GPUDRA_DELAY_AT"
DELAY_POINTS = ("start:discovery", "prepare:hardware")


def delay_point(name: str) -> None:
    """Sleep here when ``GPUDRA_DELAY_AT=<point>=<seconds>`` (slow hardware, in tests)."""
    if name not in DELAY_POINTS:
        raise ValueError(f"unknown delay point {name!r}")
    point, _, seconds = os.environ.get(DELAY_ENV, "").partition("=")
    if point == name and seconds:
        time.sleep(float(seconds))


def crash_point(name: str) -> None:
    """Die here if the environment asks for it."""
    if name not in POINTS:  # a typo in a test would otherwise never fire
        raise ValueError(f"unknown crash point {name!r}")
    if os.environ.get(ENV) == name:
        sys.stderr.write(f"gpudra: crashing at {name} ({ENV})\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
