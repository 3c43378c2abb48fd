"""Prepare and unprepare of VFIO passthrough claims against whole-GPU claims, through the
real node daemon.

    python -m bench.vfio_prepare [--runs 3] [--rounds 16]

Starts the API-server stand-in in its own process (``bench.remote_api``), runs
``gpudra node --simulate dgx-h100 --feature-gates PassthroughSupport=true`` and drives it
with the kubelet emulator. Each round, on the next of the 8 GPUs: prepare and unprepare a
whole-GPU claim, then a vfio claim (record, unbind from nvidia, bind vfio-pci, CDI; then
rebind and wait for NVML). One claim per call; CDI specs on tmpfs (bench.node_daemon). The
simulated sysfs plays the kernel in-process, so this measures the daemon's own work (three
durable checkpoint commits instead of the whole GPU's one), not a real driver rebind, which
takes seconds on real hardware.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil

from bench.node_daemon import _prepare_ok, _unprepare, cdi_on_tmpfs, make_claim, summary
from bench.preamble import preamble
from bench.remote_api import RemoteApi
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon

GPUS = 8


async def rounds(api: RemoteApi, kubelet: KubeletEmulator, count: int,
                 run: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in (
        "full", "full-unprepare", "vfio", "vfio-unprepare")}
    for i in range(count):
        gpu = i % GPUS
        full = make_claim(api, f"r{run}-full-{i}", [f"gpu-{gpu}"])
        times["full"].append(await _prepare_ok(kubelet, [full]))
        times["full-unprepare"].append(await _unprepare(kubelet, [full]))
        vm = make_claim(api, f"r{run}-vfio-{i}", [f"gpu-vfio-{gpu}"])
        times["vfio"].append(await _prepare_ok(kubelet, [vm]))
        times["vfio-unprepare"].append(await _unprepare(kubelet, [vm]))
    return times


def report(times: dict[str, list[float]]) -> None:
    labels = {"full": "prepare, whole GPU", "full-unprepare": "unprepare, whole GPU",
              "vfio": "prepare, GPU to vfio-pci", "vfio-unprepare": "unprepare, back to nvidia"}
    for key, label in labels.items():
        print(summary(label, times[key]))


async def main_async(args: argparse.Namespace) -> None:
    merged: dict[str, list[float]] = {}
    for run in range(args.runs):
        print(f"--- run {run + 1}/{args.runs}")
        with RemoteApi() as api:
            api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
            cdi = contextlib.ExitStack()
            daemon = Daemon(api.url, extra_args=[
                "--feature-gates", "PassthroughSupport=true", "--dynamic-mig-gpus", "none",
                *cdi.enter_context(cdi_on_tmpfs())])
            daemon.start()
            try:
                async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
                    await rounds(api, kubelet, 1, -1 - run)  # warm-up
                    times = await rounds(api, kubelet, args.rounds, run)
                report(times)
                for key, values in times.items():
                    merged.setdefault(key, []).extend(values)
            finally:
                daemon.stop()
                shutil.rmtree(daemon.base, ignore_errors=True)
                cdi.close()
    if args.runs > 1:
        print(f"--- all {args.runs} runs")
        report(merged)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=16)
    preamble()
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
