"""The checkpoint store alone: a commit (one claim put, then removed) and a read, in-process.

    PYTHONPATH=. .venv/bin/python -m bench.checkpoint_commit [--commits 2000] [--claims 8]
        [--dir /var/lib/...] [--previous]

What one kubelet call of a plain full GPU costs the store: a ``save`` under the lock with
one claim more (prepare) or less (unprepare) than the file holds, ``claims`` other claims
already there; and a ``load`` of an unchanged file. The directory defaults to one under
the current directory (a disk, as ``/var/lib/kubelet/plugins`` is, not tmpfs).
``--previous`` times the previous build's store (snapshot plus journal) from its archive
in ``tests/driver/fixtures``; run both in turns: the disk's sync times drift by 10x.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.node_daemon import pct
from bench.preamble import preamble


def record(model: Any, n: int) -> Any:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    return model.ClaimRecord(
        uid=uid, namespace="default", name=f"claim-{n}", state=model.PREPARE_COMPLETED,
        devices=[model.DeviceRecord(
            request_names=["gpu"], pool="node-a", device=f"gpu-{n % 8}",
            cdi_device_ids=[f"k8s.gpu.nvidia.com/claim={uid}-gpu-{n % 8}"], kind="gpu",
            uuid=f"GPU-{n:08d}")],
        started_at="2026-11-27T20:00:00+00:00")


def modules(directory: Path, previous: bool) -> tuple[Any, Any]:
    """The checkpoint model and store modules: this build's, or the previous build's."""
    if previous:
        from tests.driver.prev_checkpoint import load_previous_build

        loaded = load_previous_build(directory / "archive")
        return loaded["checkpoint_model"], loaded["checkpoint_store"]
    import gpudra.driver.checkpoint_model
    import gpudra.driver.checkpoint_store

    return gpudra.driver.checkpoint_model, gpudra.driver.checkpoint_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--claims", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=Path.cwd())
    parser.add_argument("--previous", action="store_true")
    args = parser.parse_args()
    preamble()
    directory = Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir=args.dir))
    try:
        model, store_module = modules(directory, args.previous)
        store = store_module.CheckpointStore(directory / "plugin", boot_id="bench")
        base = model.Checkpoint(boot_id="bench")
        for n in range(args.claims):
            base = model.with_claim(base, record(model, n))
        store.save(base)
        extra = record(model, args.claims)
        commits: list[float] = []
        loads: list[float] = []
        for i in range(args.commits):
            started = time.perf_counter()
            with store.locked():
                cp = store.load()
                cp = (model.with_claim(cp, extra) if i % 2 == 0
                      else model.without_claim(cp, extra.uid))
                store.save(cp)
            commits.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.load()
            loads.append(time.perf_counter() - started)
        store.close()
        build = "previous build" if args.previous else "this build"
        for name, took in (("commit (lock, load, save)", commits), ("load, unchanged", loads)):
            print(f"{build}: {name:<28} n={len(took)}  p50={pct(took, 50) * 1000:7.3f} ms  "
                  f"p95={pct(took, 95) * 1000:7.3f} ms  p99={pct(took, 99) * 1000:7.3f} ms")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
