"""GPUs waiting for recovery survive a daemon restart (not a reboot): the store, and the
monitor over the simulator before and after a restart, with and without the driver's
recovery action field."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from gpudra.driver.health import HealthPolicy, RecoveryRecord
from gpudra.driver.health_monitor import HealthMonitor
from gpudra.driver.health_store import RecoveryStore
from tests.driver.test_health_watcher import PROBE_INTERVAL, WAIT_MS, _wait_until_watching
from tests.driver.test_xid_recovery import _recovery_taints, sim_node  # noqa: F401 (fixture)

RECORD = RecoveryRecord(1, 1_700_000_000.0, "XID 48 (the driver's recovery action)", True)


def test_the_store_keeps_records_of_this_boot_only(tmp_path: Path):
    path = tmp_path / "data" / "gpu-recovery.json"
    store = RecoveryStore(path, "boot-1")
    assert store.load() == {}
    store.save({"GPU-a": RECORD})
    assert RecoveryStore(path, "boot-1").load() == {"GPU-a": RECORD}
    assert path.stat().st_mode & 0o777 == 0o600  # ours, explicitly
    assert RecoveryStore(path, "boot-2").load() == {}  # a reboot reset every GPU
    store.save({})
    assert not path.exists()


def test_unreadable_or_malformed_content_is_an_empty_start(tmp_path: Path):
    path = tmp_path / "gpu-recovery.json"
    for content in (b"{not json", b"[]",
                    json.dumps({"bootID": "b", "gpus": {"GPU-a": {"action": "reset"}}}).encode(),
                    json.dumps({"bootID": "b", "gpus": {"GPU-a": {
                        "action": -1, "since": 1, "cause": "", "fromDriver": True}}}).encode()):
        path.write_bytes(content)
        assert RecoveryStore(path, "b").load() == {}


class _Changes:
    def __call__(self) -> None:
        pass


def _wait(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def _monitor(n, store: RecoveryStore) -> HealthMonitor:
    return HealthMonitor(n.nvml, n.uuids, HealthPolicy(quiet_period=60), _Changes(),
                         wait_ms=WAIT_MS, probe_interval=PROBE_INTERVAL, store=store)


def test_a_catalog_recovery_is_still_there_after_a_restart(sim_node, tmp_path):  # noqa: F811
    n = sim_node("l4-x4")
    n.control.set_recovery_action(0, None)  # a driver without the field
    store = RecoveryStore(tmp_path / "gpu-recovery.json", "boot-1")
    first = _monitor(n, store)
    with first:
        _wait_until_watching(n)
        n.control.raise_xid(0, 79)
        _wait(lambda: _recovery_taints(n, first) == {"gpu-0": "node-reboot"})
    again = _monitor(n, store)  # the daemon restarted; nothing reset the GPU
    assert _recovery_taints(n, again) == {"gpu-0": "node-reboot"}  # before any watching
    with again:
        # Three probe intervals of heartbeats: probes ran (a tick follows each due probe)
        # and found nothing that clears it. Waiting on the heartbeat, not a blind sleep,
        # proves the watcher really looked on a slow machine.
        watching_from = again.checked_at
        _wait(lambda: again.checked_at >= watching_from + 3 * PROBE_INTERVAL)
        assert _recovery_taints(n, again) == {"gpu-0": "node-reboot"}
    rebooted = _monitor(n, RecoveryStore(tmp_path / "gpu-recovery.json", "boot-2"))
    assert _recovery_taints(n, rebooted) == {}


def test_a_gpu_reset_while_the_daemon_was_down_is_seen_at_start(sim_node, tmp_path):  # noqa: F811
    n = sim_node("l4-x4")
    store = RecoveryStore(tmp_path / "gpu-recovery.json", "boot-1")
    first = _monitor(n, store)
    with first:
        _wait_until_watching(n)
        n.control.raise_xid(2, 48, recovery_action=1)
        _wait(lambda: _recovery_taints(n, first) == {"gpu-2": "gpu-reset"})
    n.control.reset_gpu(2)  # the admin reset it meanwhile: the driver reports NONE
    again = _monitor(n, store)
    assert _recovery_taints(n, again) == {"gpu-2": "gpu-reset"}  # remembered ...
    with again:
        _wait(lambda: _recovery_taints(n, again) == {})  # ... until the driver says none
    assert not (tmp_path / "gpu-recovery.json").exists()
