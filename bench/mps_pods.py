"""A GPU's first share (its MPS control daemon starts) and last share (it stops), with the
daemon in the plugin's container and in a pod of its own, through the real node daemon.

    python -m bench.mps_pods [--rounds 8]

Starts the API-server stand-in in its own process (``bench.remote_api``), and for each mode
runs ``gpudra node --simulate dgx-h100 --shareable-gpus all`` (``--mps-daemons pod``: with
``gpudra.testing.pod_runner`` as the node's kubelet for ordinary pods) driven by the kubelet
emulator: per round, on the next of the 8 GPUs, prepare one share, then unprepare it. In pod
mode the figures include what the pod runner costs (the watch event, its shim, the
``gpudra mps-control-daemon`` command's start), which stands in for a real kubelet's pod
start: on a node that is the kubelet's and the runtime's time, not this one's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal

from bench.node_daemon import _prepare_ok, _unprepare, cdi_on_tmpfs, summary
from bench.preamble import preamble
from bench.remote_api import RemoteApi
from bench.share_prepare import GPUS, share_claim
from gpudra.testing.kubelet_emulator import KubeletEmulator
from gpudra.testing.pod_runner import PodRunner
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import Daemon

POD_ARGS = ["--mps-daemons", "pod", "--mps-image", "gpudra:bench", "--namespace", "gpudra"]


async def rounds(api: RemoteApi, kubelet: KubeletEmulator, count: int,
                 tag: str) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"first": [], "last": []}
    for i in range(count):
        share = share_claim(api, f"{tag}-{i}", i % GPUS)
        times["first"].append(await _prepare_ok(kubelet, [share]))
        times["last"].append(await _unprepare(kubelet, [share]))
    return times


async def mode(api: RemoteApi, pods: bool, count: int) -> dict[str, list[float]]:
    with contextlib.ExitStack() as stack:
        daemon = Daemon(api.url, extra_args=["--shareable-gpus", "all",
                                             *stack.enter_context(cdi_on_tmpfs()),
                                             *(POD_ARGS if pods else [])])
        if pods:
            stack.enter_context(PodRunner(api.url, daemon.node))
        daemon.start()
        try:
            async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
                tag = "pod" if pods else "container"
                await rounds(api, kubelet, 1, f"{tag}-warm")  # imports, first files
                return await rounds(api, kubelet, count, tag)
        finally:
            daemon.stop()
            for pid in sim_daemons(daemon.plugins):  # a failed run leaves none
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(daemon.base, ignore_errors=True)


async def main_async(args: argparse.Namespace) -> None:
    with RemoteApi() as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
        for pods in (False, True):
            times = await mode(api, pods, args.rounds)
            where = "own pod" if pods else "plugin container"
            print(summary(f"first share, daemon in {where}", times["first"]))
            print(summary(f"last share, daemon in {where}", times["last"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    preamble()
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
