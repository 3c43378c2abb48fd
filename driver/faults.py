"""Named crash, delay and fail points for crash-safety and supervision tests.

``GPUDRA_CRASH_AT=<point>`` makes the process die at once (``os._exit``: no cleanup, no
``finally``, like SIGKILL or a power cut) when it reaches that point;
``GPUDRA_DELAY_AT=<point>=<seconds>`` makes it slow there; ``GPUDRA_FAIL_AT=<point>[=<n>]``
raises :class:`InjectedFault` there (the first ``n`` times, or every time), like a bug in a
long-running task. Unset in production, where each check is one dictionary lookup.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

ENV = "GPUDRA_CRASH_AT"
CRASH_EXIT_CODE = 86

POINTS = (
    "prepare:after-started",
    "prepare:after-mig-gpu-instance",
    "prepare:after-mig-create",
    "prepare:after-mig-recorded",
    "prepare:after-settings",
    "prepare:after-vfio-unbind",
    "prepare:after-vfio-bind",
    "prepare:after-cdi-write",
    "prepare:after-cdi-sync",
    "unprepare:after-settings-restored",
    "unprepare:after-mig-destroy",
    "unprepare:after-cdi-remove",
    "unprepare:after-vfio-unbind",
    "unprepare:after-vfio-rebind",
)


_KNOWN = frozenset(POINTS)  # a set: crash_point runs several times per prepare

DELAY_ENV = "GPUDRA_DELAY_AT"
DELAY_POINTS = ("start:sockets", "start:discovery", "prepare:hardware")


def delay_point(name: str) -> None:
    """Sleep here when ``GPUDRA_DELAY_AT=<point>=<seconds>`` (slow hardware, in tests)."""
    if name not in DELAY_POINTS:
        raise ValueError(f"unknown delay point {name!r}")
    point, _, seconds = os.environ.get(DELAY_ENV, "").partition("=")
    if point == name and seconds:
        time.sleep(float(seconds))


def crash_point(name: str) -> None:
    """Die here if the environment asks for it."""
    if name not in _KNOWN:  # a typo in a test would otherwise never fire
        raise ValueError(f"unknown crash point {name!r}")
    if os.environ.get(ENV) == name:
        sys.stderr.write(f"gpudra: crashing at {name} ({ENV})\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)


FAIL_ENV = "GPUDRA_FAIL_AT"
FAIL_POINTS = ("publisher:after-round", "start:discovery")

_failures: Counter[str] = Counter()  # per process: how often each fail point has raised


class InjectedFault(RuntimeError):
    """Raised at a fail point named in ``GPUDRA_FAIL_AT``."""


def fail_point(name: str) -> None:
    """Raise here if the environment asks for it (``<point>`` or ``<point>=<times>``)."""
    if name not in FAIL_POINTS:
        raise ValueError(f"unknown fail point {name!r}")
    point, _, times = os.environ.get(FAIL_ENV, "").partition("=")
    if point != name or (times and _failures[name] >= int(times)):
        return
    _failures[name] += 1
    raise InjectedFault(f"injected fault at {name} ({FAIL_ENV})")
