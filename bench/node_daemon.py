"""Benchmarks of the node daemon through its real paths.

    python -m bench.node_daemon [--runs 3] [--claims 100] [--cycles 10000] [--steady 60]

Starts the API-server stand-in in **its own process** (``bench.remote_api``), runs
``gpudra node --simulate dgx-h100`` as a separate process, drives it with the kubelet
emulator over its unix sockets, and prints one line per measurement and run. Numbers go
into bench/RESULTS.md by hand, with the machine and commit.

Directories are laid out as on a node: the checkpoint on disk, the CDI specs on tmpfs
(``/var/run/cdi`` is under ``/run``, a tmpfs, on every distribution a kubelet runs on), here
``/dev/shm``. On this VM's disk a file create costs ~90 µs and a directory fsync ~45 µs;
on tmpfs both are near zero, as on a node.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.preamble import preamble
from bench.remote_api import RemoteApi
from gpudra.api.claims import ClaimRef
from gpudra.kubeletplugin.serving.grpc_probe import answers_get_info
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon, claim_object, free_port, http_get

_TICKS = os.sysconf("SC_CLK_TCK")


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(name: str, seconds: Sequence[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (f"{name:<48} n={len(ms):<5} p50={pct(ms, 50):7.2f} ms  p95={pct(ms, 95):7.2f} ms  "
            f"p99={pct(ms, 99):7.2f} ms  max={max(ms):7.2f} ms")


def make_claim(api: RemoteApi, name: str, devices: list[str], *,
               admin: bool = False) -> ClaimRef:
    meta = api.put(claim_object(name, devices=devices, admin_access=admin))["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def absent_claim(i: int) -> ClaimRef:
    """A claim the daemon never held: its unprepare is the call's floor in the daemon (gRPC
    on both sides, the checkpoint lookup, a CDI unlink that finds nothing, the log line),
    timed beside the real calls so that both see the same machine state."""
    return ClaimRef(namespace="default", name=f"absent-{i}", uid=f"absent-uid-{i}")


@contextlib.contextmanager
def cdi_on_tmpfs() -> Iterator[list[str]]:
    """``--cdi-root`` on tmpfs, as ``/var/run/cdi`` is on a node; removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="gd-cdi-", dir="/dev/shm"))
    try:
        yield ["--cdi-root", str(base / "cdi")]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def metric_samples(port: int, name: str) -> list[tuple[str, int]]:
    """(labels, value) of each sample of the daemon's metric ``name``, from ``/metrics``."""
    _, text = http_get(port, "/metrics")
    samples = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            samples.append((labels, int(float(value))))
    return samples


def status_writes(port: int) -> int:
    """Successful claim status writes so far, from the daemon's own metric."""
    return sum(count for labels, count in
               metric_samples(port, "gpudra_claim_status_writes_total")
               if labels == '{outcome="ok"}')


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far, every thread included, ended ones too (start-up's
    threads end): the kernel's per-process CPU clock, in
    nanoseconds (what ``clock_getcpuclockid`` gives: ``~pid << 3 | CPUCLOCK_SCHED``); where
    that fails, user + system time in clock ticks from /proc."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS


async def _prepare_ok(kubelet: KubeletEmulator, refs: list[ClaimRef]) -> float:
    started = time.perf_counter()
    answer = await kubelet.prepare(refs)
    elapsed = time.perf_counter() - started
    assert all(v["error"] == "" for v in answer.values()), answer
    return elapsed


async def _unprepare(kubelet: KubeletEmulator, refs: list[ClaimRef]) -> float:
    started = time.perf_counter()
    await kubelet.unprepare(refs)
    return time.perf_counter() - started


@dataclass
class Pairs:
    """Single-claim prepare/unprepare pairs, each followed by the unprepare of a claim
    never held (:func:`absent_claim`): each call's time and the daemon's CPU during each
    kind, in seconds."""

    prepare: list[float] = field(default_factory=list)
    unprepare: list[float] = field(default_factory=list)
    absent: list[float] = field(default_factory=list)
    cpu_prepare: float = 0.0
    cpu_unprepare: float = 0.0
    cpu_absent: float = 0.0

    async def run(self, kubelet: KubeletEmulator, pid: int, ref: ClaimRef, *,
                  gap: float = 0.0) -> None:
        """Time one pair, waiting ``gap`` seconds between the prepare and the unprepare
        (not counted as the daemon's CPU of either)."""
        before = cpu_seconds(pid)
        self.prepare.append(await _prepare_ok(kubelet, [ref]))
        middle = cpu_seconds(pid)
        if gap:
            await asyncio.sleep(gap)
            middle = cpu_seconds(pid)
        self.unprepare.append(await _unprepare(kubelet, [ref]))
        after = cpu_seconds(pid)
        self.absent.append(await _unprepare(kubelet, [absent_claim(len(self.absent))]))
        self.cpu_prepare += middle - before
        self.cpu_unprepare += after - middle
        self.cpu_absent += cpu_seconds(pid) - after

    def print_latencies(self, prepare: str) -> None:
        print(summary(prepare, self.prepare))
        print(summary("unprepare, 1 claim per call", self.unprepare))
        print(summary("unprepare, a claim never held (call floor)", self.absent))


async def latency(api: RemoteApi, kubelet: KubeletEmulator, daemon: Daemon,
                  args: argparse.Namespace) -> None:
    assert daemon.process is not None
    pid = daemon.process.pid
    pairs = Pairs()
    cpu_before = cpu_seconds(pid)
    for i in range(args.claims):
        await pairs.run(kubelet, pid, make_claim(api, f"full-{i}", [f"gpu-{i % 8}"]))
    cpu = cpu_seconds(pid) - cpu_before - pairs.cpu_absent
    pairs.print_latencies("prepare, 1 full-GPU claim per call")
    print(f"daemon CPU per prepare+unprepare pair: {cpu / args.claims * 1000:.2f} ms "
          f"({args.claims} pairs); during the prepare calls "
          f"{pairs.cpu_prepare / args.claims * 1000:.2f} ms, during the unprepare calls "
          f"{pairs.cpu_unprepare / args.claims * 1000:.2f} ms, during those of a claim never "
          f"held {pairs.cpu_absent / args.claims * 1000:.2f} ms")
    await held_claims(api, kubelet, daemon, args.port)
    mig = []
    for i in range(args.claims):
        ref = make_claim(api, f"mig-{i}", [f"gpu-{i % 8}-mig-1g10gb-19-{i % 7}"])
        mig.append(await _prepare_ok(kubelet, [ref]))
        await kubelet.unprepare([ref])
    print(summary("prepare, 1 dynamic-MIG claim (create GI+CI)", mig))
    batches: dict[str, list[float]] = {"p8": [], "u8": [], "p64": [], "u64": [], "m56": []}
    for run in range(5):
        refs = [make_claim(api, f"e{run}-{i}", [f"gpu-{i}"]) for i in range(8)]
        batches["p8"].append(await _prepare_ok(kubelet, refs))
        batches["u8"].append(await _unprepare(kubelet, refs))
        # 64 claims in one call, full GPUs with admin access (8 claims per GPU may share)
        refs = [make_claim(api, f"a{run}-{i}", [f"gpu-{i % 8}"], admin=True) for i in range(64)]
        batches["p64"].append(await _prepare_ok(kubelet, refs))
        batches["u64"].append(await _unprepare(kubelet, refs))
        # 56 claims in one call: every 1g placement of all 8 GPUs (56 MIG devices created)
        refs = [make_claim(api, f"b{run}-{i}", [f"gpu-{i // 7}-mig-1g10gb-19-{i % 7}"])
                for i in range(56)]
        batches["m56"].append(await _prepare_ok(kubelet, refs))
        await kubelet.unprepare(refs)
    print(summary("prepare, one call with 8 full-GPU claims", batches["p8"]))
    print(summary("unprepare, one call with 8 claims", batches["u8"]))
    print(summary("prepare, one call with 64 full-GPU claims", batches["p64"]))
    print(summary("unprepare, one call with 64 claims", batches["u64"]))
    print(summary("prepare, one call with 56 dynamic-MIG claims", batches["m56"]))


async def held_claims(api: RemoteApi, kubelet: KubeletEmulator, daemon: Daemon,
                      port: int, count: int = 40) -> None:
    """Claims held past the status delay, as a pod's are: each also costs two status writes
    (entries added, then removed). Daemon CPU per claim, all of it included."""
    assert daemon.process is not None
    refs = [make_claim(api, f"held-{i}", [f"gpu-{i % 8}"]) for i in range(count)]
    pid = daemon.process.pid
    idle_before, t = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(3.0)  # the idle rate (usage sampling, XID watcher), subtracted below
    idle_rate = (cpu_seconds(pid) - idle_before) / (time.monotonic() - t)
    writes = status_writes(port)
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    for i in range(0, count, 8):
        for ref in refs[i:i + 8]:
            await _prepare_ok(kubelet, [ref])
        await asyncio.sleep(1.0)  # status written
        for ref in refs[i:i + 8]:
            await _unprepare(kubelet, [ref])
        await asyncio.sleep(1.0)  # entries removed
    cpu = cpu_seconds(pid) - cpu_before - idle_rate * (time.monotonic() - started)
    print(f"daemon CPU per claim held past the status delay (prepare, unprepare, "
          f"{(status_writes(port) - writes) / count:.1f} status writes): "
          f"{cpu / count * 1000:.2f} ms ({count} claims; idle rate "
          f"{idle_rate * 1000:.1f} ms/s subtracted)")


async def cycles(api: RemoteApi, kubelet: KubeletEmulator, daemon: Daemon,
                 count: int) -> None:
    assert daemon.process is not None
    samples = [(0, rss_mib(daemon.process.pid))]
    for i in range(1, count + 1):
        ref = make_claim(api, f"cycle-{i}", [f"gpu-{i % 8}-mig-2g20gb-14-{(i % 3) * 2}"])
        await _prepare_ok(kubelet, [ref])
        await kubelet.unprepare([ref])
        api.delete("ResourceClaim", f"cycle-{i}", "default")
        if i % (count // 5 or 1) == 0:
            samples.append((i, rss_mib(daemon.process.pid)))
    print("resident memory (MiB) by prepare/unprepare cycle: "
          + ", ".join(f"{n}: {m:.1f}" for n, m in samples))


def _published(api: RemoteApi, node: str) -> int:
    slices = api.list("ResourceSlice", field_selector=f"spec.nodeName={node}")
    if slices and len(slices) == slices[0]["spec"]["pool"]["resourceSliceCount"]:
        return len(slices)
    return 0


async def until_published(api: RemoteApi, node: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not _published(api, node):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the slices of {node} were not published in {seconds:.0f} s")
        await asyncio.sleep(0.01)


async def timing_start(api: RemoteApi) -> None:
    """exec → GetInfo, exec → all slices published (the emulator registers like a
    kubelet), slice wipe → re-published, SIGTERM → exit with sockets removed."""
    node = "node-start"
    api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    with cdi_on_tmpfs() as cdi:
        await _timing_start(api, node, Daemon(api.url, node=node, extra_args=cdi))


async def _timing_start(api: RemoteApi, node: str, d: Daemon) -> None:
    try:
        started = time.monotonic()
        d.start(wait=False)
        sock = d.registrar / "gpu.nvidia.com-reg.sock"
        while not (sock.exists() and answers_get_info(sock, timeout=0.5)):
            await asyncio.sleep(0.002)
        reg = time.monotonic() - started
        async with await KubeletEmulator.discover(d.registrar):
            while not (count := _published(api, node)):
                await asyncio.sleep(0.005)
            pub = time.monotonic() - started
            print(f"exec -> registration answering GetInfo: {reg * 1000:.0f} ms; exec -> all "
                  f"{count} slices published: {pub * 1000:.0f} ms")
            repairs = []
            for _ in range(5):
                await asyncio.sleep(0.5)
                t = time.monotonic()
                api.delete_collection("ResourceSlice", field_selector=f"spec.nodeName={node}")
                while not _published(api, node):
                    await asyncio.sleep(0.005)
                repairs.append(time.monotonic() - t)
            print(summary("slices wiped -> re-published", repairs))
            assert d.process is not None
            print(f"daemon RSS idle after start: {rss_mib(d.process.pid):.1f} MiB")
        t = time.monotonic()
        code = d.stop(signal.SIGTERM)
        while d.sockets():
            time.sleep(0.001)
        print(f"SIGTERM -> exit {code} with sockets removed: "
              f"{(time.monotonic() - t) * 1000:.0f} ms")
    finally:
        if d.process is not None and d.process.poll() is None:
            d.kill()
        shutil.rmtree(d.base, ignore_errors=True)


def _api_writes(port: int) -> tuple[int, int]:
    """(writes, all calls) the daemon made, from its own ``gpudra_api_calls`` metric."""
    writes = total = 0
    for labels, count in metric_samples(port, "gpudra_api_calls_total"):
        total += count
        if not any(f'verb="{v}"' in labels for v in ("get", "list", "watch")):
            writes += count
    return writes, total


def steady(port: int, seconds: float) -> None:
    time.sleep(1.0)
    writes0, calls0 = _api_writes(port)
    time.sleep(seconds)
    writes1, calls1 = _api_writes(port)
    print(f"writes to the API server during {seconds:.0f} s of steady state: "
          f"{writes1 - writes0} (all calls: {calls1 - calls0})")


async def main_async(args: argparse.Namespace) -> None:
    for run in range(args.runs):
        print(f"--- run {run + 1}/{args.runs}")
        with RemoteApi() as api:
            await timing_start(api)
            api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
            args.port = port = free_port()
            cdi = contextlib.ExitStack()
            daemon = Daemon(api.url, extra_args=["--http-address", f"127.0.0.1:{port}",
                                                 *cdi.enter_context(cdi_on_tmpfs())])
            daemon.start()
            try:
                async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
                    # A scheduler allocates a node's devices only from its published
                    # slices, so no kubelet call overlaps start-up's publishing: the
                    # calls are timed from then on (before the fifth session's end they
                    # overlapped it, and its CPU counted as the prepares').
                    await until_published(api, "node-a")
                    await latency(api, kubelet, daemon, args)
                    if run == 0:
                        steady(port, args.steady)
                        await cycles(api, kubelet, daemon, args.cycles)
            finally:
                daemon.stop()
                shutil.rmtree(daemon.base, ignore_errors=True)
                cdi.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--cycles", type=int, default=10000)
    parser.add_argument("--steady", type=float, default=60.0)
    preamble()
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
