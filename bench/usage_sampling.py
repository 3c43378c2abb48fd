"""Does usage sampling slow prepare down? The same prepare loop with sampling off and on.

    python -m bench.usage_sampling [--claims 200] [--interval 100ms] [--runs 3]

Each run starts ``gpudra node --simulate dgx-h100`` twice, once with ``--usage-interval 0``
and once with ``--interval`` (default 100 ms, 100 times the default rate). Claims that stay
prepared hold a MIG device on each of GPUs 0-3 under simulated load (each pass samples
four GPUs with GPM); the measured claims prepare and unprepare full GPUs 4-7. Prints
prepare latency, the daemon's CPU time and the sampler's own time per pass.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time

from bench.node_daemon import _prepare_ok, _unprepare, cpu_seconds, make_claim, summary
from bench.remote_api import RemoteApi
from gpudra.driver.sim import SimControl
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon, free_port, http_get


def sampler_seconds(port: int) -> tuple[float, int]:
    """(total seconds, passes) from the daemon's ``gpudra_usage_sample_seconds``."""
    _, text = http_get(port, "/metrics")
    total, count = 0.0, 0
    for line in text.splitlines():
        if line.startswith("gpudra_usage_sample_seconds_sum "):
            total = float(line.split()[1])
        elif line.startswith("gpudra_usage_sample_seconds_count "):
            count = int(float(line.split()[1]))
    return total, count


async def one(api: RemoteApi, interval: str, claims: int, tag: str) -> None:
    port = free_port()
    daemon = Daemon(api.url, extra_args=["--http-address", f"127.0.0.1:{port}",
                                         "--usage-interval", interval])
    daemon.start()
    try:
        assert daemon.process is not None
        async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
            held = [make_claim(api, f"{tag}-held-{g}", [f"gpu-{g}-mig-3g40gb-9-0"])
                    for g in range(4)]
            await _prepare_ok(kubelet, held)
            sim = SimControl(daemon.sim_state)
            for g, gpu in enumerate(sim.snapshot()["gpus"][:4]):
                mig_uuid = gpu["gpu_instances"][0]["compute_instances"][0]["uuid"]
                sim.set_load(g, mig_uuid=mig_uuid, sm_percent=60, memory_bytes=2**33)
            await asyncio.sleep(0.5)
            cpu0 = cpu_seconds(daemon.process.pid)
            passes0 = sampler_seconds(port)
            started = time.monotonic()
            prepare = []
            for i in range(claims):
                ref = make_claim(api, f"{tag}-{i}", [f"gpu-{4 + i % 4}"])
                prepare.append(await _prepare_ok(kubelet, [ref]))
                await _unprepare(kubelet, [ref])
            wall = time.monotonic() - started
            cpu = cpu_seconds(daemon.process.pid) - cpu0
            spent, passes = (a - b for a, b in zip(sampler_seconds(port), passes0, strict=True))
            print(summary(f"prepare, usage interval {interval}", prepare))
            per_pass = f"{spent / passes * 1000:.2f} ms per pass" if passes else "no passes"
            print(f"    daemon CPU {cpu / wall * 100:.1f} % of {wall:.1f} s; sampler: "
                  f"{int(passes)} passes, {per_pass}")
    finally:
        daemon.stop()
        shutil.rmtree(daemon.base, ignore_errors=True)


async def main_async(args: argparse.Namespace) -> None:
    for run in range(args.runs):
        print(f"--- run {run + 1}/{args.runs}")
        with RemoteApi() as api:
            api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
            await one(api, "0", args.claims, f"off{run}")
            await one(api, args.interval, args.claims, f"on{run}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--interval", default="100ms")
    parser.add_argument("--runs", type=int, default=3)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
