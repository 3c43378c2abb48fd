"""Claims on different GPUs are prepared in parallel; claims on one GPU one at a time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.driver import sim
from gpudra.driver.faults import DELAY_ENV
from gpudra.driver.gpu_locks import GpuLocks, GpuLockTimeout
from tests.driver.node_fixture import SimNode, claim, start_node

DELAY = 0.6


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimNode]:
    n = start_node(tmp_path)
    monkeypatch.setenv(DELAY_ENV, f"prepare:hardware={DELAY}")
    yield n
    n.close()
    sim.uninstall()


def prepare_in_parallel(node: SimNode, *devices: str) -> float:
    errors: list[BaseException] = []

    def run(i: int, device: str) -> None:
        try:
            node.state.prepare(claim(f"{i:08d}-cccc-4000-8000-000000000000", device))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, d)) for i, d in enumerate(devices)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return time.monotonic() - started


def test_different_gpus_prepare_concurrently(node):
    elapsed = prepare_in_parallel(node, "gpu-0-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-0",
                                  "gpu-2-mig-1g10gb-19-0")
    assert elapsed < 2 * DELAY, f"{elapsed:.2f}s: the three GPUs were serialised"
    for gpu in (0, 1, 2):
        assert len(node.control.snapshot()["gpus"][gpu]["gpu_instances"]) == 1
    assert len(node.state.store.load().completed()) == 3  # no update lost in the merge


def test_the_same_gpu_is_serialised(node):
    elapsed = prepare_in_parallel(node, "gpu-3-mig-1g10gb-19-0", "gpu-3-mig-1g10gb-19-1")
    assert elapsed >= 2 * DELAY, f"{elapsed:.2f}s: one GPU was worked on twice at once"
    assert len(node.control.snapshot()["gpus"][3]["gpu_instances"]) == 2


def test_gpu_locks_exclude_other_instances_sharing_the_directory(tmp_path):
    first, second = GpuLocks(tmp_path), GpuLocks(tmp_path)  # like two daemon instances
    with first.hold(["GPU-a"]):
        with (pytest.raises(GpuLockTimeout, match="another daemon instance"),
              second.hold(["GPU-a"], timeout=0.2)):
            pass
        with second.hold(["GPU-b"], timeout=0.2):  # other GPUs are free
            pass
    with second.hold(["GPU-a"], timeout=0.2):
        pass
