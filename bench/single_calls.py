"""Single-claim prepare/unprepare pairs only: a quick A/B of two trees on the hot path.

    PYTHONPATH=. .venv/bin/python -m bench.single_calls [--pairs 200] [--cdi-tmpfs]

The claims are created before timing starts, so the API server is idle during the calls
(``bench.node_daemon`` creates each claim just before its prepare, as a scheduler would).
Run it alternately in two checkouts (each with its own ``./dev`` venv) to compare them under
the same machine state: the VM's speed drifts by 2x within an hour.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil

from bench.node_daemon import (
    Pairs,
    _prepare_ok,
    _unprepare,
    cdi_on_tmpfs,
    make_claim,
    pct,
)
from bench.preamble import preamble
from bench.remote_api import RemoteApi
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon

WARM_UP = 20


def handler_seconds(daemon: Daemon, method: str, *, absent: bool = False) -> list[float]:
    """Each ``method`` call's time in the daemon's handler, in call order: the
    ``duration_s`` of its "call done" log line, from the decoded request to that line (the
    answer's message is built and encoded after it). ``absent``: only the unprepares of
    claims never held (:func:`absent_claim`), else only the others."""
    return [float(e["duration_s"]) for e in daemon.events()
            if e.get("event") == "call done" and e.get("method") == method
            and absent == any("/absent-" in c for c in e.get("unprepared", ()))]


async def main_async(args: argparse.Namespace) -> None:
    with RemoteApi() as api, contextlib.ExitStack() as stack:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
        cdi = stack.enter_context(cdi_on_tmpfs()) if args.cdi_tmpfs else []
        daemon = Daemon(api.url, extra_args=[*cdi, *args.extra])
        try:
            daemon.start()
            assert daemon.process is not None
            async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
                refs = [make_claim(api, f"c-{i}", [f"gpu-{i % 8}"])
                        for i in range(args.pairs + WARM_UP)]
                for ref in refs[:WARM_UP]:
                    await _prepare_ok(kubelet, [ref])
                    await _unprepare(kubelet, [ref])
                pairs = Pairs()
                for ref in refs[WARM_UP:]:
                    await pairs.run(kubelet, daemon.process.pid, ref, gap=args.gap_ms / 1000)
            pairs.print_latencies("prepare, 1 claim per call")
            cpu = pairs.cpu_prepare + pairs.cpu_unprepare
            print(f"daemon CPU per pair: {cpu / args.pairs * 1000:.2f} ms; per prepare "
                  f"{pairs.cpu_prepare / args.pairs * 1000:.2f} ms, per unprepare "
                  f"{pairs.cpu_unprepare / args.pairs * 1000:.2f} ms")
            for method, took, of_absent in (
                    ("v1.NodePrepareResources", pairs.prepare, False),
                    ("v1.NodeUnprepareResources", pairs.unprepare, False),
                    ("v1.NodeUnprepareResources", pairs.absent, True)):
                inside = handler_seconds(daemon, method, absent=of_absent)[-args.pairs:]
                if inside:
                    print(f"{method}{' (never held)' if of_absent else ''}: in the daemon's "
                          f"handler p50 {pct(inside, 50) * 1000:.2f} ms of "
                          f"{pct(took, 50) * 1000:.2f} ms (the rest: gRPC, both sides)")
        finally:
            daemon.stop()
            shutil.rmtree(daemon.base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--cdi-tmpfs", action="store_true",
                        help="CDI specs on tmpfs, as /var/run/cdi is on a node")
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="wait this long between a prepare's answer and its unprepare, "
                             "as a kubelet's calls are apart (on this VM a call after idle "
                             "time costs about twice as much, whatever serves it)")
    parser.add_argument("extra", nargs="*", metavar="DAEMON-ARG",
                        help="more arguments for the daemon (after --), e.g. --log-level warning")
    args = parser.parse_args()
    preamble()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
