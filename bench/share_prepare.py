"""Prepare and unprepare of GPU shares against whole GPUs, through the real node daemon.

    python -m bench.share_prepare [--runs 3] [--rounds 24]

Starts the API-server stand-in in its own process (``bench.remote_api``), runs
``gpudra node --simulate dgx-h100 --shareable-gpus all`` and drives it with the kubelet
emulator. Each round, on the next of the 8 GPUs: prepare and unprepare a whole-GPU claim;
prepare a first share (the GPU's MPS control daemon starts), a share joining it under the
daemon's limits (only a CDI spec: the batched path), one raising them (the daemon is told,
the claim recorded as started first), unprepare both joiners, then the last share (the
daemon stops). One claim per call; CDI specs on tmpfs, as on a node (bench.node_daemon).
Issue 15 asks for a share's prepare within 2x a whole GPU's; the ratios are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import uuid

from bench.node_daemon import _prepare_ok, _unprepare, cdi_on_tmpfs, make_claim, pct, summary
from bench.preamble import preamble
from bench.remote_api import RemoteApi
from gpudra.api.claims import ClaimRef
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import Daemon, claim_object

GPUS = 8


def share_claim(api: RemoteApi, name: str, gpu: int, memory: str = "20Gi",
                multiprocessors: str = "33") -> ClaimRef:
    """A claim allocated one share of ``gpu-<gpu>-shared``, as the scheduler writes it."""
    obj = claim_object(name, devices=[f"gpu-{gpu}-shared"])
    result = obj["status"]["allocation"]["devices"]["results"][0]
    result.update(shareID=str(uuid.uuid4()), consumedCapacity={
        "memory": memory, "multiprocessors": multiprocessors, "shares": "1"})
    meta = api.put(obj)["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


async def rounds(api: RemoteApi, kubelet: KubeletEmulator, daemon: Daemon,
                 count: int, run: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in (
        "full", "full-unprepare", "first", "join", "raise", "join-unprepare",
        "last-unprepare")}
    for i in range(count):
        gpu = i % GPUS
        full = make_claim(api, f"r{run}-full-{i}", [f"gpu-{gpu}"])
        times["full"].append(await _prepare_ok(kubelet, [full]))
        times["full-unprepare"].append(await _unprepare(kubelet, [full]))
        first = share_claim(api, f"r{run}-first-{i}", gpu)
        times["first"].append(await _prepare_ok(kubelet, [first]))
        join = share_claim(api, f"r{run}-join-{i}", gpu, "10Gi", "16")
        times["join"].append(await _prepare_ok(kubelet, [join]))
        bigger = share_claim(api, f"r{run}-raise-{i}", gpu, "40Gi", "66")
        times["raise"].append(await _prepare_ok(kubelet, [bigger]))
        times["join-unprepare"].append(await _unprepare(kubelet, [join]))
        times["join-unprepare"].append(await _unprepare(kubelet, [bigger]))
        times["last-unprepare"].append(await _unprepare(kubelet, [first]))
        assert not sim_daemons(daemon.plugins), "the last share left its MPS daemon"
    return times


def report(times: dict[str, list[float]]) -> None:
    labels = {"full": "prepare, whole GPU",
              "full-unprepare": "unprepare, whole GPU",
              "first": "prepare, first share of a GPU (MPS start)",
              "join": "prepare, share joining under the daemon's limits",
              "raise": "prepare, share joining that raises them",
              "join-unprepare": "unprepare, share that is not the last",
              "last-unprepare": "unprepare, last share of a GPU (MPS stop)"}
    for key, label in labels.items():
        print(summary(label, times[key]))
    full = pct(times["full"], 50)
    for key in ("first", "join", "raise"):
        print(f"p50 ratio {key} share / whole GPU: {pct(times[key], 50) / full:.2f}x"
              f"   (p95 {pct(times[key], 95) / pct(times['full'], 95):.2f}x)")


async def main_async(args: argparse.Namespace) -> None:
    merged: dict[str, list[float]] = {}
    for run in range(args.runs):
        print(f"--- run {run + 1}/{args.runs}")
        with RemoteApi() as api:
            api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
            cdi = contextlib.ExitStack()
            daemon = Daemon(api.url, extra_args=["--shareable-gpus", "all",
                                                 *cdi.enter_context(cdi_on_tmpfs())])
            daemon.start()
            try:
                async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
                    # one warm-up round: first imports and file creation are not the path
                    await rounds(api, kubelet, daemon, 1, -1 - run)
                    times = await rounds(api, kubelet, daemon, args.rounds, run)
                report(times)
                for key, values in times.items():
                    merged.setdefault(key, []).extend(values)
            finally:
                daemon.stop()
                for pid in sim_daemons(daemon.plugins):  # a failed run leaves none
                    os.kill(pid, signal.SIGKILL)
                shutil.rmtree(daemon.base, ignore_errors=True)
                cdi.close()
    if args.runs > 1:
        print(f"--- all {args.runs} runs")
        report(merged)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=24)
    preamble()
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
