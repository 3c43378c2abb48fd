"""Claims on different GPUs are prepared in parallel; claims on one GPU one at a time.

Proven by the order of events inside the hardware step (whose ``prepare:hardware`` delay
point the tests turn into a rendezvous), not by how long the calls took.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.driver import faults, sim
from gpudra.driver.faults import DELAY_ENV
from gpudra.driver.gpu_locks import GpuLocks, GpuLockTimeout
from tests.driver.node_fixture import SimNode, claim, start_node

WAIT = 10.0
"""How long a rendezvous waits for the others: only a broken lock (or a hang) reaches it."""


class HardwareStep:
    """Stands in for the delay point's sleep: each prepare that reaches the hardware step
    records ``enter``, waits there for ``together`` prepares (or, alone, for a rival to
    show up), and records ``exit``."""

    def __init__(self, together: int) -> None:
        self.together = together
        self.events: list[tuple[str, str]] = []
        self._changed = threading.Condition()
        self._inside = 0
        self._entered = 0

    def sleep(self, _seconds: float) -> None:
        me = threading.current_thread().name
        with self._changed:
            self.events.append(("enter", me))
            self._inside += 1
            self._entered += 1
            self._changed.notify_all()
            if self.together > 1:  # all of them at once: they are not serialised
                met = self._changed.wait_for(lambda: self._entered >= self.together, WAIT)
                assert met, f"only {self._entered} of {self.together} reached the step at once"
            else:  # alone: a rival entering now would be working on the same GPU at once
                self._changed.wait_for(lambda: self._inside > 1, 0.3)
            self._inside -= 1
            self.events.append(("exit", me))


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimNode]:
    n = start_node(tmp_path)
    monkeypatch.setenv(DELAY_ENV, "prepare:hardware=1")
    yield n
    n.close()
    sim.uninstall()


def step(monkeypatch: pytest.MonkeyPatch, together: int) -> HardwareStep:
    hardware = HardwareStep(together)
    monkeypatch.setattr(faults, "time", types.SimpleNamespace(sleep=hardware.sleep))
    return hardware


def prepare_in_parallel(node: SimNode, *devices: str) -> None:
    errors: list[BaseException] = []

    def run(i: int, device: str) -> None:
        try:
            node.state.prepare(claim(f"{i:08d}-cccc-4000-8000-000000000000", device))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, d), name=d) for i, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


def test_different_gpus_prepare_concurrently(node, monkeypatch):
    hardware = step(monkeypatch, together=3)
    devices = ("gpu-0-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-0", "gpu-2-mig-1g10gb-19-0")
    prepare_in_parallel(node, *devices)
    # All three were inside the hardware step before any left it.
    assert [what for what, _ in hardware.events] == ["enter"] * 3 + ["exit"] * 3
    for gpu in (0, 1, 2):
        assert len(node.control.snapshot()["gpus"][gpu]["gpu_instances"]) == 1
    assert len(node.state.store.load().completed()) == 3  # no update lost in the merge


def test_the_same_gpu_is_serialised(node, monkeypatch):
    hardware = step(monkeypatch, together=1)
    prepare_in_parallel(node, "gpu-3-mig-1g10gb-19-0", "gpu-3-mig-1g10gb-19-1")
    # One left the step before the other entered it.
    first, second = hardware.events[0][1], hardware.events[2][1]
    assert hardware.events == [("enter", first), ("exit", first),
                               ("enter", second), ("exit", second)]
    assert first != second
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
