"""How soon the kubelet's health stream says Unhealthy after an XID that needs a GPU reset,
and Healthy after the reset, through the real paths.

    python -m bench.health_stream [--runs 3] [--events 10]

Starts the API-server stand-in in its own process (``bench.remote_api``) and
``gpudra node --simulate l4-x4``; the kubelet emulator opens ``NodeWatchResources`` on the
plugin's socket (v1, as a 1.37 kubelet). Each event: ``gpudra sim xid --xid 48
--recovery-action gpu-reset`` on GPU 1, timed until the stream reports it Unhealthy; then
``gpudra sim reset-gpu``, timed until it reports Healthy. The tests only check that both
come (tests/integration/test_health_stream_kubelet.py); how fast is measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import shutil
import time

from bench.node_daemon import summary
from bench.preamble import preamble
from bench.remote_api import RemoteApi
from gpudra.cli.main import main as gpudra
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon

NODE = "node-a"


def sim(daemon: Daemon, *args: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert gpudra(["sim", *args, "--sim-state", str(daemon.sim_state)]) == 0


async def run(events: int) -> tuple[list[float], list[float]]:
    with RemoteApi() as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        daemon = Daemon(api.url, profile="l4-x4").start()
        kubelet = await KubeletEmulator.discover(daemon.registrar)
        try:
            watch = kubelet.watch_health()
            await watch.wait_for(lambda s: len(s) == 4, 30)
            unhealthy, healthy = [], []
            for _ in range(events):
                started = time.monotonic()
                sim(daemon, "xid", "--gpu", "1", "--xid", "48", "--recovery-action", "gpu-reset")
                await watch.wait_for(lambda s: s["gpu-1"].health == "Unhealthy")
                unhealthy.append(time.monotonic() - started)
                started = time.monotonic()
                sim(daemon, "reset-gpu", "--gpu", "1")
                await watch.wait_for(lambda s: s["gpu-1"].health == "Healthy")
                healthy.append(time.monotonic() - started)
            watch.close()
            return unhealthy, healthy
        finally:
            await kubelet.close()
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
        unhealthy, healthy = asyncio.run(run(args.events))
        print(summary("XID 48 (gpu-reset) -> Unhealthy on the stream", unhealthy))
        print(summary("sim reset-gpu -> Healthy on the stream", healthy))


if __name__ == "__main__":
    main()
