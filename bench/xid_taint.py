"""How soon a critical XID becomes a taint in the published slice, through the real paths.

    python -m bench.xid_taint [--runs 3] [--events 10]

Starts the API-server stand-in in its own process (``bench.remote_api``) and
``gpudra node --simulate l4-x4`` beside a kubelet emulator; raises XID 79 on one GPU with
``gpudra sim xid`` and times until the API server holds the ``gpu.nvidia.com/xid`` taint,
then waits for the quiet period to clear it before the next event. The tests only check
that the taint comes (tests/integration/test_device_health.py); how fast is measured here.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import time
from collections.abc import Callable

from bench.node_daemon import summary
from bench.preamble import preamble
from bench.remote_api import RemoteApi
from gpudra.cli.main import main as gpudra
from tests.integration.daemon import Daemon

NODE = "node-a"
QUIET = 0.5
"""The daemon's --xid-quiet-period: how long before a taint clears."""


def tainted(api: RemoteApi, device: str) -> bool:
    for obj in api.list("ResourceSlice", field_selector=f"spec.nodeName={NODE}"):
        for entry in obj["spec"].get("devices") or []:
            if entry["name"] == device and entry.get("taints"):
                return True
    return False


def until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {seconds:g} s")
        time.sleep(0.002)


def run(events: int) -> list[float]:
    with RemoteApi() as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        daemon = Daemon(api.url, profile="l4-x4",
                        extra_args=["--xid-quiet-period", str(QUIET)]).start()
        try:
            until(lambda: len(api.list("ResourceSlice")) == 4, 30, "published")
            took = []
            for _ in range(events):
                started = time.monotonic()
                with contextlib.redirect_stdout(io.StringIO()):  # its "raised XID" line
                    code = gpudra(["sim", "xid", "--gpu", "0", "--xid", "79",
                                   "--sim-state", str(daemon.sim_state)])
                assert code == 0
                until(lambda: tainted(api, "gpu-0"), 10, "tainted")
                took.append(time.monotonic() - started)
                until(lambda: not tainted(api, "gpu-0"), 10 + QUIET, "cleared")
            return took
        finally:
            daemon.stop()
            shutil.rmtree(daemon.base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--events", type=int, default=10)
    args = parser.parse_args()
    preamble()
    for number in range(args.runs):
        print(f"--- run {number + 1}/{args.runs}")
        print(summary("XID 79 raised -> taint in the API server", run(args.events)))


if __name__ == "__main__":
    main()
