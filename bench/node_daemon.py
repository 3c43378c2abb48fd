"""Benchmarks of the node daemon through its real paths.

    python -m bench.node_daemon [--runs 3] [--claims 200] [--cycles 1000] [--steady 60]

Starts the test API server (loopback HTTP) and ``gpudra node --simulate dgx-h100`` as a
separate process, drives it with the kubelet emulator over its unix sockets, and prints
p50/p95/p99 per measurement and run. Numbers go into bench/RESULTS.md by hand, with the
machine and commit.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from gpudra.api.claims import ClaimRef
from gpudra.kubeletplugin.grpc_probe import answers_get_info
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon, claim_object


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(name: str, seconds: Sequence[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (f"{name:<44} n={len(ms):<5} p50={pct(ms, 50):7.2f} ms  p95={pct(ms, 95):7.2f} ms  "
            f"p99={pct(ms, 99):7.2f} ms  max={max(ms):7.2f} ms")


def make_claim(api: FakeApiServer, name: str, devices: list[str], *,
               admin: bool = False) -> ClaimRef:
    meta = api.put(claim_object(name, devices=devices, admin_access=admin))["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def latency(api: FakeApiServer, kubelet: KubeletEmulator, args: argparse.Namespace) -> None:
    full, mig, unprep = [], [], []
    for i in range(args.claims):
        ref = make_claim(api, f"full-{i}", [f"gpu-{i % 8}"])
        t = time.perf_counter()
        r = await kubelet.prepare([ref])
        full.append(time.perf_counter() - t)
        assert r[ref.uid]["error"] == "", r
        t = time.perf_counter()
        await kubelet.unprepare([ref])
        unprep.append(time.perf_counter() - t)
    for i in range(args.claims):
        ref = make_claim(api, f"mig-{i}", [f"gpu-{i % 8}-mig-1g10gb-19-{i % 7}"])
        t = time.perf_counter()
        r = await kubelet.prepare([ref])
        mig.append(time.perf_counter() - t)
        assert r[ref.uid]["error"] == "", r
        await kubelet.unprepare([ref])
    print(summary("prepare, one full-GPU claim", full))
    print(summary("prepare, one dynamic-MIG claim (create GI+CI)", mig))
    print(summary("unprepare, one full-GPU claim", unprep))
    mig_batch, admin_batch = [], []
    for run in range(5):
        # 56 claims in one call: every 1g placement of all 8 GPUs (56 MIG devices created)
        refs = [make_claim(api, f"b{run}-{i}", [f"gpu-{i // 7}-mig-1g10gb-19-{i % 7}"])
                for i in range(56)]
        t = time.perf_counter()
        r = await kubelet.prepare(refs)
        mig_batch.append(time.perf_counter() - t)
        assert all(v["error"] == "" for v in r.values()), r
        await kubelet.unprepare(refs)
        # 64 claims in one call, full GPUs with admin access (8 claims per GPU may share)
        refs = [make_claim(api, f"a{run}-{i}", [f"gpu-{i % 8}"], admin=True) for i in range(64)]
        t = time.perf_counter()
        r = await kubelet.prepare(refs)
        admin_batch.append(time.perf_counter() - t)
        assert all(v["error"] == "" for v in r.values()), r
        await kubelet.unprepare(refs)
    print(summary("prepare, one call with 64 full-GPU claims", admin_batch))
    print(summary("prepare, one call with 56 dynamic-MIG claims", mig_batch))


async def cycles(api: FakeApiServer, kubelet: KubeletEmulator, daemon: Daemon,
                 count: int) -> None:
    assert daemon.process is not None
    samples = [(0, rss_mib(daemon.process.pid))]
    for i in range(1, count + 1):
        ref = make_claim(api, f"cycle-{i}", [f"gpu-{i % 8}-mig-2g20gb-14-{(i % 3) * 2}"])
        r = await kubelet.prepare([ref])
        assert r[ref.uid]["error"] == "", r
        await kubelet.unprepare([ref])
        api.delete("ResourceClaim", f"cycle-{i}", "default")
        if i % (count // 5 or 1) == 0:
            samples.append((i, rss_mib(daemon.process.pid)))
    print("resident memory (MiB) by prepare/unprepare cycle: "
          + ", ".join(f"{n}: {m:.1f}" for n, m in samples))


def timing_start(api: FakeApiServer) -> None:
    d = Daemon(api.url, node="node-start")
    api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-start"}})
    try:
        t = time.monotonic()
        d.start(wait=False)
        sock = d.registrar / "gpu.nvidia.com-reg.sock"
        while not (sock.exists() and answers_get_info(sock, timeout=0.5)):
            time.sleep(0.002)
        reg = time.monotonic() - t
        d.wait_registered(30)
        while True:
            slices = [s for s in api.list("ResourceSlice")
                      if s["spec"].get("nodeName") == "node-start"]
            if slices and len(slices) == slices[0]["spec"]["pool"]["resourceSliceCount"]:
                break
            time.sleep(0.005)
        pub = time.monotonic() - t
        print(f"start -> registration answering GetInfo: {reg * 1000:.0f} ms; start -> all "
              f"{len(slices)} "
              f"slices published: {pub * 1000:.0f} ms")
        import kubernetes.client

        client = kubernetes.client.ApiClient(api.configuration())
        resource = kubernetes.client.ResourceV1Api(client)
        repairs = []
        for _ in range(5):
            time.sleep(0.5)
            t = time.monotonic()
            resource.delete_collection_resource_slice(field_selector="spec.nodeName=node-start")
            while True:
                slices = [s for s in api.list("ResourceSlice")
                          if s["spec"].get("nodeName") == "node-start"]
                if slices and len(slices) == slices[0]["spec"]["pool"]["resourceSliceCount"]:
                    break
                time.sleep(0.005)
            repairs.append(time.monotonic() - t)
        client.close()
        print(summary("slices wiped -> re-published", repairs))
    finally:
        d.stop()
        shutil.rmtree(d.base, ignore_errors=True)


def steady(api: FakeApiServer, seconds: float) -> None:
    time.sleep(1.0)
    api.reset_calls()
    time.sleep(seconds)
    print(f"writes to the API server during {seconds:.0f} s of steady state: {api.writes()} "
          f"(all calls: {sum(api.calls.values())})")


async def main_async(args: argparse.Namespace) -> None:
    for run in range(args.runs):
        print(f"--- run {run + 1}/{args.runs}")
        with FakeApiServer() as api:
            timing_start(api)
            api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
            daemon = Daemon(api.url).start()
            try:
                async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
                    await latency(api, kubelet, args)
                    if run == 0:
                        steady(api, args.steady)
                        await cycles(api, kubelet, daemon, args.cycles)
            finally:
                daemon.stop()
                shutil.rmtree(daemon.base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--steady", type=float, default=60.0)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()
    print(f"commit {head}")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
