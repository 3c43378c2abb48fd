"""Where a prepare's time goes inside the daemon: DeviceState and the Preparer, in-process.

    python -m bench.device_profile [--claims 200] [--profile prepare|unprepare|mig|batch8|batch64] \
        2>/dev/null

No API server and no gRPC: the Preparer's claim fetcher is replaced by one that answers
from memory, on an event loop in a thread of its own, as in the daemon (this measures our
own process, the part issue 14 is about); the calls run in the main thread, as a gRPC call
thread runs them, so cProfile sees all of the device work. Prints wall
clock and CPU per claim for single and batched calls; with ``--profile`` prints the top
of a cProfile of that phase.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.node_daemon import pct
from gpudra.api.claims import ClaimRef
from gpudra.cli.logs import configure_logging
from gpudra.driver import sim
from gpudra.driver.claims import ClaimError
from gpudra.kubeletplugin.claims.preparer import Preparer
from tests.driver.node_fixture import POOL, start_node
from tests.integration.daemon import claim_object


class MemoryFetcher:
    """Answers GETs from a dict, as fast as a cache (the API server is not measured here)."""

    timeout = 10.0

    def __init__(self) -> None:
        self.claims: dict[str, Mapping[str, Any]] = {}

    def add(self, devices: Sequence[str], *, admin: bool = False) -> ClaimRef:
        uid = str(uuid.uuid4())
        name = f"c-{uid[:8]}"
        obj = claim_object(name, devices=devices, node=POOL, admin_access=admin)
        obj["metadata"]["uid"] = uid
        self.claims[uid] = obj
        return ClaimRef(namespace="default", name=name, uid=uid)

    async def fetch_all(
        self, refs: Sequence[tuple[str, str, str]]
    ) -> list[Mapping[str, Any] | ClaimError]:
        return [self.claims[uid] for _, _, uid in refs]


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def line(name: str, samples: Sequence[tuple[float, float]]) -> str:
    wall = [w * 1000 for w, _ in samples]
    cpu = [c * 1000 for _, c in samples]
    return (f"{name:<34} n={len(wall):<4} p50={pct(wall, 50):6.2f} ms  p95={pct(wall, 95):6.2f}"
            f" ms  cpu p50={pct(cpu, 50):6.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--profile", choices=("prepare", "unprepare", "mig", "batch8", "batch64"))
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    configure_logging(fmt="json")  # as in the daemon; run with 2>/dev/null
    with tempfile.TemporaryDirectory(prefix="gd-prof-", dir="/tmp") as tmp:
        node = start_node(Path(tmp))
        try:
            run(node.state, args)
        finally:
            node.close()
            sim.uninstall()


def run(state: Any, args: argparse.Namespace) -> None:
    fetcher = MemoryFetcher()
    loop = asyncio.new_event_loop()
    looping = threading.Thread(target=loop.run_forever, name="loop", daemon=True)
    looping.start()
    preparer = Preparer(driver="gpu.nvidia.com", fetcher=fetcher,  # type: ignore[arg-type]
                        state=state, loop=loop)
    profiler = cProfile.Profile()

    def call(phase: str, method: Callable[[list[ClaimRef]], object],
             refs: list[ClaimRef]) -> Callable[[], object]:
        def go() -> object:
            if args.profile == phase:
                profiler.enable()
            try:
                return method(refs)
            finally:
                if args.profile == phase:
                    profiler.disable()
        return go

    prep: list[tuple[float, float]] = []
    unprep: list[tuple[float, float]] = []
    for i in range(args.claims):
        ref = fetcher.add([f"gpu-{i % 8}"])
        prep.append(timed(call("prepare", preparer.prepare, [ref])))
        unprep.append(timed(call("unprepare", preparer.unprepare, [ref])))
    print(line("prepare, 1 claim per call", prep))
    print(line("unprepare, 1 claim per call", unprep))
    mig: list[tuple[float, float]] = []
    for i in range(args.claims // 4):
        ref = fetcher.add([f"gpu-{i % 8}-mig-1g10gb-19-{i % 7}"])
        mig.append(timed(call("mig", preparer.prepare, [ref])))
        preparer.unprepare([ref])
    print(line("prepare, 1 dynamic-MIG claim", mig))
    for size, admin in ((8, False), (64, True)):
        p, u = [], []
        for _ in range(max(3, args.claims // 20)):
            refs = [fetcher.add([f"gpu-{i % 8}"], admin=admin) for i in range(size)]
            p.append(timed(call(f"batch{size}", preparer.prepare, refs)))
            u.append(timed(call(f"batch{size}", preparer.unprepare, refs)))
        print(line(f"prepare, one call with {size} claims", p))
        print(line(f"unprepare, one call with {size} claims", u))
    loop.call_soon_threadsafe(loop.stop)
    looping.join()
    loop.close()
    if args.profile:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue())


if __name__ == "__main__":
    main()
