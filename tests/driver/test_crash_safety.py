"""Kill the driver hard at every crash point; after a restart nothing leaks or sticks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudra.driver import sim
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.faults import CRASH_EXIT_CODE, ENV, POINTS
from tests.driver.crash_worker import PAIR_UID, crash_claim
from tests.driver.node_fixture import DRIVER, start_node

ROOT = Path(__file__).resolve().parents[2]
UID = "33333333-3333-4333-8333-333333333333"
DEVICES = ("gpu-0-mig-3g40gb-9-4", "gpu-1-mig-1g10gb-19-6", "gpu-2")


def run_worker(root: Path, action: str, crash_at: str | None,
               devices: tuple[str, ...] = DEVICES) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ENV, None)
    if crash_at:
        env[ENV] = crash_at
    done = subprocess.run(
        [sys.executable, "-m", "tests.driver.crash_worker", str(root), action, UID, *devices],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode not in (0, CRASH_EXIT_CODE):
        raise AssertionError(done.stderr)
    return done.returncode


def assert_converged(root: Path, *, prepared: bool) -> None:
    """Restart (reconcile) and check the node is exactly 'prepared' or 'clean'."""
    node = start_node(root)
    try:
        cp = CheckpointStore(root / "plugin", boot_id="boot-1").load()  # loads: not corrupt
        snapshot = node.control.snapshot()["gpus"]
        specs = sorted(p.name for p in (root / "cdi").glob("*")) if (root / "cdi").exists() else []
        if prepared:
            assert set(cp.completed()) == {UID} and not cp.started()
            assert [len(snapshot[i]["gpu_instances"]) for i in (0, 1, 2)] == [1, 1, 0]
            assert specs == [f"k8s.{DRIVER}-claim_{UID}.json"]
            assert snapshot[2]["compute_mode"] == 3
            assert (root / "plugin" / "mps" / UID / "pipe" / "control").exists()
        else:
            assert cp.claims == {}
            assert [g["gpu_instances"] for g in snapshot] == [[]] * len(snapshot)
            assert [g["mig_mode"]["current"] for g in snapshot] == [0] * len(snapshot)
            assert specs == []
            assert all(g["compute_mode"] == 0 for g in snapshot)
            assert not (root / "plugin" / "mps" / UID).exists()  # MPS daemon stopped
        # and the claim can be prepared (again) with the same answer as a fresh node gives
        result = node.state.prepare(crash_claim(UID, *DEVICES))
        assert [r.device for r in result] == list(DEVICES)
        node.state.unprepare(UID)
        assert all(g["gpu_instances"] == [] for g in node.control.snapshot()["gpus"])
    finally:
        node.close()
        sim.uninstall()


# VFIO's points are reached only by vfio claims: tests/integration/test_vfio.py crashes at each.
PREPARE_POINTS = [p for p in POINTS if p.startswith("prepare:") and "vfio" not in p]
UNPREPARE_POINTS = [p for p in POINTS if p.startswith("unprepare:") and "vfio" not in p]


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_crash_during_prepare_rolls_back(point, tmp_path):
    assert run_worker(tmp_path, "prepare", point) == CRASH_EXIT_CODE
    # before the restart the half-made state really is there (the crash was real)
    cp = CheckpointStore(tmp_path / "plugin", boot_id="boot-1").load()
    assert set(cp.started()) == {UID}
    assert_converged(tmp_path, prepared=False)


@pytest.mark.parametrize("point", UNPREPARE_POINTS)
def test_crash_during_unprepare_finishes_on_retry(point, tmp_path):
    assert run_worker(tmp_path, "prepare", None) == 0
    assert run_worker(tmp_path, "unprepare", point) == CRASH_EXIT_CODE
    # the kubelet retries the unprepare; it must complete from the checkpoint alone
    assert run_worker(tmp_path, "unprepare", None) == 0
    assert_converged(tmp_path, prepared=False)


@pytest.mark.parametrize("point", UNPREPARE_POINTS)
def test_crash_during_a_batched_unprepare_finishes_on_retry(point, tmp_path):
    # Two claims in one call, one commit at the end: a crash after the first claim's undo
    # leaves both recorded, and the retry undoes both again from the checkpoint.
    assert run_worker(tmp_path, "prepare-pair", None) == 0
    assert run_worker(tmp_path, "unprepare-pair", point) == CRASH_EXIT_CODE
    assert set(CheckpointStore(tmp_path / "plugin", boot_id="boot-1").load().claims) == {
        UID, PAIR_UID}
    assert run_worker(tmp_path, "unprepare-pair", None) == 0
    assert CheckpointStore(tmp_path / "plugin", boot_id="boot-1").load().claims == {}
    assert_converged(tmp_path, prepared=False)


def test_no_crash_leaves_a_prepared_claim(tmp_path):
    assert run_worker(tmp_path, "prepare", None) == 0
    assert_converged(tmp_path, prepared=True)


@pytest.mark.parametrize("point", ["prepare:after-started", "prepare:after-cdi-write",
                                   "prepare:after-cdi-sync"])
def test_crash_during_a_plain_full_gpu_prepare_leaves_no_stray_spec(point, tmp_path):
    # Nothing on the GPU changes for this claim, so no PrepareStarted record is written;
    # the CDI spec a crash may leave behind is removed by reconcile.
    assert run_worker(tmp_path, "prepare-plain", point, ("gpu-4",)) == CRASH_EXIT_CODE
    specs = tmp_path / "cdi"
    if point != "prepare:after-started":
        assert len(list(specs.glob("*.json"))) == 1  # the crash really left a spec behind
    node = start_node(tmp_path)
    try:
        assert not specs.exists() or list(specs.glob("*")) == []
        assert CheckpointStore(tmp_path / "plugin", boot_id="boot-1").load().claims == {}
    finally:
        node.close()
        sim.uninstall()


def test_a_kill_between_gpu_and_compute_instance_leaves_a_bare_one_that_restart_removes(
        tmp_path):
    # The step NVML's MIG-device listing cannot see: a GPU instance without its compute
    # instance. Before the restart it really is there, MIG mode on; the restart rolls the
    # claim back by enumerating GPU instances (issue 27 item 3).
    from gpudra.driver.sim import SimControl

    point = "prepare:after-mig-gpu-instance"
    assert run_worker(tmp_path, "prepare", point) == CRASH_EXIT_CODE
    gpu0 = SimControl(tmp_path / "sim").snapshot()["gpus"][0]
    assert [gi["compute_instances"] for gi in gpu0["gpu_instances"]] == [[]]
    assert gpu0["mig_mode"]["current"] == 1
    assert_converged(tmp_path, prepared=False)
