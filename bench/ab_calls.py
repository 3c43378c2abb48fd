"""Two builds' node daemons side by side, their calls interleaved: an A/B free of drift.

    PYTHONPATH=. .venv/bin/python -m bench.ab_calls --base /path/to/other/checkout
        [--pairs 300] [--rounds 3]

``bench.node_daemon`` run for one build and then for the other compares two moments of
this VM, whose speed drifts by more than the difference sought within minutes. Here both
daemons run at once (this checkout's and ``--base``'s, each with its own interpreter from
``<checkout>/.venv``), on two simulated nodes of one API-server stand-in (its own
process), and each round alternates them call by call: a full-GPU claim is created, then
prepared and unprepared, then a claim never held is unprepared (the call floor), on one
daemon and then on the other, the order swapped every pair; then calls of eight claims
(one per GPU), alike. Each side's p50 and CPU, and
the differences, are printed per round. The other checkout must have a ``.venv`` and the
same ``gpudra node`` flags as this one's ``tests.integration.daemon.Daemon`` passes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.node_daemon import Pairs, cdi_on_tmpfs, pct, until_published
from bench.preamble import preamble
from bench.remote_api import RemoteApi
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import ROOT, Daemon, create_claim

BATCHES = 20
"""Calls of eight claims per side and round, after the single-claim pairs."""


@dataclass
class Side:
    """One build's daemon, its node and its round's pairs."""

    name: str
    node: str
    daemon: Daemon
    kubelet: KubeletEmulator | None = None
    pairs: Pairs = field(default_factory=Pairs)
    batches: list[float] = field(default_factory=list)
    """Seconds of each prepare of eight claims in one call."""

    async def pair(self, api: RemoteApi, n: int) -> None:
        assert self.kubelet is not None and self.daemon.process is not None
        ref = create_claim(api, f"{self.node}-{n}", devices=[f"gpu-{n % 8}"], node=self.node)
        await self.pairs.run(self.kubelet, self.daemon.process.pid, ref)

    async def batch(self, api: RemoteApi, n: int) -> None:
        """Eight claims, one per GPU, prepared in one call, then unprepared in one."""
        assert self.kubelet is not None
        refs = [create_claim(api, f"{self.node}-{n}-{gpu}", devices=[f"gpu-{gpu}"],
                             node=self.node) for gpu in range(8)]
        started = time.perf_counter()
        answer = await self.kubelet.prepare(refs)
        self.batches.append(time.perf_counter() - started)
        assert all(v["error"] == "" for v in answer.values()), answer
        await self.kubelet.unprepare(refs)


def _row(side: Side) -> list[float]:
    p = side.pairs
    count = len(p.prepare)
    return [pct(p.prepare, 50) * 1000, pct(p.unprepare, 50) * 1000, pct(p.absent, 50) * 1000,
            p.cpu_prepare / count * 1000, p.cpu_unprepare / count * 1000,
            pct(side.batches, 50) * 1000]


async def run(base: Path, pairs: int, rounds: int) -> None:
    columns = ("prepare p50", "unprepare p50", "floor p50", "CPU/prepare", "CPU/unprepare",
               "8 claims p50")
    with RemoteApi() as api, contextlib.ExitStack() as stack:
        sides = []
        for name, node, root in (("this", "node-a", ROOT), ("base", "node-b", base)):
            api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
            daemon = Daemon(api.url, node=node, root=root,
                            python=str(root / ".venv" / "bin" / "python"),
                            dynamic_mig_flag=root == ROOT,
                            extra_args=stack.enter_context(cdi_on_tmpfs()))
            stack.callback(shutil.rmtree, daemon.base, True)
            stack.callback(daemon.stop)
            daemon.start()
            side = Side(name, node, daemon)
            side.kubelet = await KubeletEmulator.discover(daemon.registrar)
            sides.append(side)
        try:
            for side in sides:
                await until_published(api, side.node)
            n = 0
            for round_no in range(1, rounds + 1):
                for side in sides:
                    side.pairs, side.batches = Pairs(), []
                for i in range(pairs):
                    for side in (sides if i % 2 == 0 else sides[::-1]):
                        await side.pair(api, n)
                        n += 1
                for i in range(BATCHES):
                    for side in (sides if i % 2 == 0 else sides[::-1]):
                        await side.batch(api, n)
                        n += 1
                rows = {side.name: _row(side) for side in sides}
                print(f"round {round_no}, {pairs} pairs per side (ms):")
                print("  " + " " * 18 + "".join(f"{c:>15}" for c in columns))
                for name, row in rows.items():
                    print(f"  {name:<18}" + "".join(f"{v:>15.2f}" for v in row))
                print(f"  {'this - base':<18}" + "".join(
                    f"{a - b:>+15.2f}" for a, b in zip(rows["this"], rows["base"], strict=True)))
        finally:
            for side in sides:
                if side.kubelet is not None:
                    await side.kubelet.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True,
                        help="the other checkout (with its .venv) to compare with")
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    preamble()
    asyncio.run(run(args.base.resolve(), args.pairs, args.rounds))


if __name__ == "__main__":
    main()
