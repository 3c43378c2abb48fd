"""The XID watcher and health monitor over the simulated NVML (events from other processes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from gpudra.controller.slice_validation import ensure_valid
from gpudra.controller.slices import build_slices
from gpudra.driver import sim
from gpudra.driver.device_model import build_devices
from gpudra.driver.devices import NodeDevices
from gpudra.driver.health import (
    TAINT_GPU_LOST,
    TAINT_UNMONITORED,
    TAINT_XID,
    HealthEvent,
    HealthPolicy,
    MonitoringChanged,
    XidObserved,
)
from gpudra.driver.health_monitor import HealthMonitor
from gpudra.driver.health_watcher import XidWatcher
from gpudra.driver.inventory import read_inventory, simulated_pcie_root
from gpudra.driver.nvml import Nvml, NvmlError

WAIT_MS, PROBE_INTERVAL = 100, 0.1


class Changes:
    """An ``on_change`` that counts calls and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.count = 0
        self._cond = threading.Condition()

    def __call__(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def wait_past(self, seen: int, timeout: float = 2.0) -> float:
        """Seconds until ``count`` exceeds ``seen``; fails after ``timeout``."""
        start = time.monotonic()
        with self._cond:
            assert self._cond.wait_for(lambda: self.count > seen, timeout), "no change reported"
        return time.monotonic() - start


@dataclass
class Node:
    nvml: Nvml
    library: sim.SimulatedNvml
    control: sim.SimControl
    state_dir: Path
    devices: NodeDevices
    uuids: list[str]

    def taints(self, monitor: HealthMonitor) -> dict[str, list[tuple[str, str, str]]]:
        return {d.name: [(t.key, t.value, t.effect) for t in d.taints]
                for d in monitor.apply(self.devices).devices if d.taints}


@pytest.fixture
def node(simulate, sim_state) -> Callable[[str], Node]:
    def make(profile: str) -> Node:
        library = simulate(profile)
        nvml = Nvml()
        inventory = read_inventory(nvml, pcie_root=simulated_pcie_root)
        return Node(nvml, library, sim.SimControl(sim_state), sim_state,
                    build_devices(inventory), [g.probe.uuid for g in inventory.gpus])
    return make


@pytest.fixture
def monitors() -> Iterator[Callable[..., HealthMonitor]]:
    """Started monitors, stopped (and their threads joined) at teardown."""
    started: list[HealthMonitor] = []

    def start(node: Node, on_change: Callable[[], None], policy: HealthPolicy | None = None,
              *, wait_ms: int = WAIT_MS, probe_interval: float = PROBE_INTERVAL,
              ) -> HealthMonitor:
        monitor = HealthMonitor(node.nvml, node.uuids, policy or HealthPolicy(), on_change,
                                wait_ms=wait_ms, probe_interval=probe_interval)
        monitor.start()
        started.append(monitor)
        return monitor

    yield start
    for monitor in started:
        monitor.stop()
    assert not [t for t in threading.enumerate() if t.name == "gpudra-xid-watcher"]


def _wait_until_watching(node: Node) -> None:
    """The watcher registered its event set (XIDs raised before that are not delivered)."""
    deadline = time.monotonic() + 2
    while not node.library._event_sets or not any(
            s.registrations for s in node.library._event_sets.values()):
        assert time.monotonic() < deadline, "watcher never registered for events"
        time.sleep(0.005)


def test_an_xid_from_another_process_reaches_on_change_within_a_second(node, monitors):
    n = node("dgx-h100")
    changes = Changes()
    monitor = monitors(n, changes)
    _wait_until_watching(n)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from gpudra.driver import sim
        sim.SimControl(Path({str(n.state_dir)!r})).raise_xid(3, 79)
    """)])
    try:
        assert child.wait(timeout=30) == 0
        raised = time.monotonic()
        changes.wait_past(0, timeout=1.0)
        latency = time.monotonic() - raised
    finally:
        child.kill()
    assert latency < 1.0
    # A GPU-wide XID: the full GPU and every (dynamic) MIG device on it, nothing else.
    gpu3 = [d.name for d in n.devices.devices if d.group == "gpu-3"]
    assert len(gpu3) > 1
    assert n.taints(monitor) == {key: [(TAINT_XID, "79", "NoSchedule")] for key in gpu3}
    sample = REGISTRY.get_sample_value("gpudra_xid_events_total",
                                       {"gpu": n.uuids[3], "xid": "79"})
    assert sample is not None and sample >= 1
    assert REGISTRY.get_sample_value("gpudra_device_taints",
                                     {"effect": "NoSchedule"}) == len(gpu3)


def test_a_mig_xid_taints_only_that_mig_device(node, monitors):
    n = node("dgx-a100-static-mig")
    changes = Changes()
    monitor = monitors(n, changes)
    _wait_until_watching(n)
    gi = n.control.snapshot()["gpus"][1]["gpu_instances"][0]
    mig_uuid = gi["compute_instances"][0]["uuid"]
    n.control.raise_xid(1, 94, mig_uuid)
    changes.wait_past(0)
    [(name, taints)] = n.taints(monitor).items()
    assert taints == [(TAINT_XID, "94", "NoSchedule")]
    assert name.startswith("gpu-1-mig-") and name.endswith(
        f"-{gi['profile_id']}-{gi['placement']['start']}")
    # Taints keep every slice valid (keys are label names, at most 16 per device …).
    ensure_valid(build_slices(monitor.apply(n.devices), driver="gpu.nvidia.com",
                              node_name="node-a"))


def test_application_xid_is_recorded_with_effect_none(node, monitors):
    n = node("l4-x4")
    changes = Changes()
    monitor = monitors(n, changes)
    _wait_until_watching(n)
    n.control.raise_xid(2, 13)
    changes.wait_past(0)
    assert n.taints(monitor) == {"gpu-2": [(TAINT_XID, "13", "None")]}
    assert {h.status for h in monitor.device_health(n.devices)} == {"Healthy"}


def test_a_lost_gpu_is_tainted_others_are_still_watched_and_it_recovers(node, monitors):
    n = node("l4-x4")
    changes = Changes()
    monitor = monitors(n, changes)
    _wait_until_watching(n)
    n.control.set_gpu_lost(1, True)
    changes.wait_past(0)
    assert n.taints(monitor) == {"gpu-1": [(TAINT_GPU_LOST, "", "NoSchedule")]}
    seen = changes.count
    n.control.raise_xid(0, 48)  # the lost GPU must not blind the watcher to the others
    changes.wait_past(seen)
    assert n.taints(monitor)["gpu-0"] == [(TAINT_XID, "48", "NoSchedule")]
    seen = changes.count
    n.control.set_gpu_lost(1, False)
    changes.wait_past(seen)
    assert "gpu-1" not in n.taints(monitor)
    seen = changes.count
    n.control.raise_xid(1, 79)  # re-registered after recovery
    changes.wait_past(seen)
    assert n.taints(monitor)["gpu-1"] == [(TAINT_XID, "79", "NoSchedule")]


def test_taints_clear_after_the_quiet_period(node, monitors):
    n = node("t4-x1")
    changes = Changes()
    monitor = monitors(n, changes, HealthPolicy(quiet_period=0.3))
    _wait_until_watching(n)
    n.control.raise_xid(0, 79)
    changes.wait_past(0)
    assert n.taints(monitor) == {"gpu-0": [(TAINT_XID, "79", "NoSchedule")]}
    cleared_after = changes.wait_past(1)
    assert n.taints(monitor) == {}
    assert cleared_after < 1.0
    assert REGISTRY.get_sample_value("gpudra_device_taints", {"effect": "NoSchedule"}) == 0


def test_a_prepare_during_a_wait_is_not_delayed(node, monitors):
    """The wait holds no lock: NVML calls from other threads run at their normal speed."""
    n = node("dgx-h100")

    def timings() -> list[float]:
        taken = []
        for _ in range(30):
            start = time.perf_counter()
            n.nvml.mig_instances(n.uuids[0])  # a prepare's NVML work goes through the lock
            taken.append(time.perf_counter() - start)
            time.sleep(0.01)
        return sorted(taken)

    baseline = timings()
    monitors(n, Changes(), wait_ms=500, probe_interval=60)
    _wait_until_watching(n)
    during = timings()
    # Were the lock held across the 500 ms wait, a call would wait 250 ms on average.
    assert during[15] < baseline[15] + 0.005, (baseline, during)
    assert during[-1] < 0.1, during


def test_stop_is_prompt_and_frees_the_event_set(node):
    n = node("l4-x4")
    monitor = HealthMonitor(n.nvml, n.uuids, HealthPolicy(), Changes(), wait_ms=200,
                            probe_interval=60)
    monitor.start()
    _wait_until_watching(n)
    start = time.monotonic()
    monitor.stop()
    assert time.monotonic() - start < 0.5
    assert n.library._event_sets == {}
    assert not [t for t in threading.enumerate() if t.name == "gpudra-xid-watcher"]


def test_heartbeat_advances_while_watching(node, monitors):
    n = node("t4-x1")
    monitor = monitors(n, Changes())
    first = monitor.checked_at
    time.sleep(0.35)
    assert monitor.checked_at > first
    [health] = monitor.device_health(n.devices)
    assert health.last_updated == monitor.checked_at


def test_a_gpu_that_cannot_report_xids_is_unmonitored(node, monkeypatch):
    n = node("l4-x4")
    original = n.nvml.register_xid_events

    def register(event_set, uuid):
        return False if uuid == n.uuids[2] else original(event_set, uuid)

    monkeypatch.setattr(n.nvml, "register_xid_events", register)
    events: list[HealthEvent] = []
    watcher = XidWatcher(n.nvml, n.uuids, events.append, wait_ms=WAIT_MS,
                         probe_interval=PROBE_INTERVAL)
    watcher.start()
    try:
        deadline = time.monotonic() + 2
        while not events:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        watcher.stop()
    assert events == [MonitoringChanged(n.uuids[2], False, "the GPU does not report XID events")]
    monitor = HealthMonitor(n.nvml, n.uuids, HealthPolicy(), Changes())
    for event in events:
        monitor.observe(event)
    assert n.taints(monitor) == {"gpu-2": [(TAINT_UNMONITORED, "", "None")]}
    assert monitor.device_health(n.devices)[2].status == "Unknown"


def test_callback_failures_do_not_stop_the_watcher(node):
    n = node("t4-x1")
    seen: list[HealthEvent] = []

    def flaky(event: HealthEvent) -> None:
        seen.append(event)
        if len(seen) == 1:
            raise RuntimeError("boom")

    watcher = XidWatcher(n.nvml, n.uuids, flaky, wait_ms=WAIT_MS,
                         probe_interval=PROBE_INTERVAL)
    watcher.start()
    try:
        _wait_until_watching(n)
        n.control.raise_xid(0, 79)
        n.control.raise_xid(0, 48)
        deadline = time.monotonic() + 2
        while len(seen) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert watcher.running
    finally:
        watcher.stop()
    # The simulated driver offers the recovery action field and reports none needed.
    assert seen == [XidObserved(n.uuids[0], 79, recovery_action=0),
                    XidObserved(n.uuids[0], 48, recovery_action=0)]


def test_an_nvml_failure_is_retried_with_a_fresh_event_set(node, monkeypatch):
    n = node("t4-x1")
    original = n.nvml.wait_event
    failures = []

    def wait_event(event_set, timeout_ms):
        if not failures:
            failures.append(event_set)
            raise NvmlError("nvmlEventSetWait", 999, "Unknown Error")
        return original(event_set, timeout_ms)

    monkeypatch.setattr(n.nvml, "wait_event", wait_event)
    seen: list[HealthEvent] = []
    watcher = XidWatcher(n.nvml, n.uuids, seen.append, wait_ms=WAIT_MS,
                         probe_interval=PROBE_INTERVAL)
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        # The failure is recorded before the watcher frees the failed set: wait for both.
        while not (failures and failures[0].freed and len(n.library._event_sets) == 1):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert failures[0].freed  # the failed set was freed, a new one made
        _wait_until_watching(n)
        n.control.raise_xid(0, 79)
        while not seen:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        watcher.stop()
    assert seen == [XidObserved(n.uuids[0], 79, recovery_action=0)]


def test_a_crashed_watcher_reports_every_gpu_unmonitored(node, monkeypatch):
    n = node("l4-x4")

    def broken() -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(n.nvml, "create_event_set", broken)
    seen: list[HealthEvent] = []
    watcher = XidWatcher(n.nvml, n.uuids, seen.append, wait_ms=WAIT_MS,
                         probe_interval=PROBE_INTERVAL)
    watcher.start()
    deadline = time.monotonic() + 2
    while watcher.running:  # it ends by itself
        assert time.monotonic() < deadline
        time.sleep(0.01)
    watcher.stop()
    assert seen == [MonitoringChanged(uuid, False, "the XID watcher failed") for uuid in n.uuids]
