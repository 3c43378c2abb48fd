"""gRPC core's settings for the node daemon: read from the environment once, when grpc is
first imported, so they are set around that import.

The daemon turns off gRPC's ``event_engine_listener`` experiment (on by default in grpcio
1.85). With it on, a connection accepted on a listening socket is read and written by
gRPC's event-engine threads, which hand each completed operation to the thread polling
the server's completion queue: several thread wake-ups per call. Off, the thread that polls
the completion queue does the socket's I/O itself, which is what the DRA socket's server
(:mod:`.core_server`) is built for. Measured with a do-nothing unary call between two
processes (``bench.floors``): server CPU 0.29 -> 0.20 ms per call, round trip 0.48 ->
0.40 ms. That gain needs every gRPC server of the process on one completion queue
(:class:`.core_server.CallQueue`): another queue's polling threads take part in the same
polling and pick up the DRA socket's events.

The variable is restored after the import: the processes the daemon starts (MPS control
daemons, CDI hooks) get the environment it was given.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

EXPERIMENTS = "GRPC_EXPERIMENTS"
LISTENER = "event_engine_listener"


def experiments_with_polled_listener(current: str | None) -> str:
    """``GRPC_EXPERIMENTS`` with the listener experiment off, unless ``current`` (an
    operator's setting) already names it either way."""
    if not current:
        return f"-{LISTENER}"
    named = {item.strip().lstrip("-") for item in current.split(",")}
    return current if LISTENER in named else f"{current},-{LISTENER}"


def import_grpc(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Import grpc with the daemon's settings; False if it was imported before (its
    settings are fixed then, and this changes nothing)."""
    if "grpc" in sys.modules:
        return False
    previous = environ.get(EXPERIMENTS)
    environ[EXPERIMENTS] = experiments_with_polled_listener(previous)
    try:
        import grpc  # noqa: F401  (imported for its side effect: gRPC reads its settings)
    finally:
        if previous is None:
            del environ[EXPERIMENTS]
        else:
            environ[EXPERIMENTS] = previous
    return True
