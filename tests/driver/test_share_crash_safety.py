"""Kill the driver at every crash point of a share's prepare and unprepare; after a restart
there is no orphan MPS daemon and no prepared share without its limits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudra.driver import sim
from gpudra.driver.checkpoint_model import Checkpoint
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.device_model import ModelOptions
from gpudra.driver.faults import CRASH_EXIT_CODE, ENV, POINTS
from gpudra.driver.gpu_shares import ALL
from gpudra.driver.shares import daemon_key
from gpudra.driver.sim.mps_daemon import read_limits
from tests import mps_leaks
from tests.driver.node_fixture import SimNode, start_node
from tests.driver.test_shares import (
    GIB,
    SHARE_A,
    SHARE_B,
    SHARE_C,
    UID_A,
    UID_B,
    UID_C,
    share_claim,
)

ROOT = Path(__file__).resolve().parents[2]
# B raises the daemon's limits (the hardware path); C fits under A's (the batched path)
MEMORY = {UID_A: 20 * GIB, UID_B: 40 * GIB, UID_C: 10 * GIB}
MULTIPROCESSORS = {UID_A: 33, UID_B: 33, UID_C: 16}
SHARE = {UID_A: SHARE_A, UID_B: SHARE_B, UID_C: SHARE_C}
# MIG points never fire for a share: it creates no MIG device; nor vfio points: a share
# never moves its GPU to vfio-pci (tests/integration/test_vfio.py crashes at those)
PREPARE_POINTS = [p for p in POINTS
                  if p.startswith("prepare:") and "mig" not in p and "vfio" not in p]
UNPREPARE_POINTS = [p for p in POINTS if p.startswith("unprepare:") and "vfio" not in p]


def open_node(root: Path) -> SimNode:
    return start_node(root, options=ModelOptions(shareable=ALL))


def run(root: Path, action: str, uid: str, crash_at: str | None = None) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ENV, None)
    if crash_at:
        env[ENV] = crash_at
    done = subprocess.run(
        [sys.executable, "-m", "tests.driver.test_share_crash_safety", str(root), action, uid],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode not in (0, CRASH_EXIT_CODE):
        raise AssertionError(done.stderr)
    return done.returncode


def on_disk(root: Path) -> Checkpoint:
    """The checkpoint as the crash left it (read without a restart's reconcile)."""
    return CheckpointStore(root / "plugin", boot_id="boot-1").load()


def daemons() -> list[mps_leaks.SimDaemon]:
    """This test's live control daemons (the crash workers' too: they inherit its mark)."""
    return mps_leaks.find(os.environ[mps_leaks.MARK_ENV])


def converged(root: Path, prepared: set[str], *, specs: bool = True) -> None:
    """Restart and check exactly ``prepared`` shares hold the GPU, with their limits (and,
    with ``specs``, their CDI specs: an unprepare may have removed one before it died)."""
    node = open_node(root)
    try:
        cp = CheckpointStore(root / "plugin", boot_id="boot-1").load()
        assert set(cp.completed()) == prepared and not cp.started()
        uuid = node.control.gpu_uuid(0)
        key = daemon_key(uuid)
        mps = node.state.hardware.mps
        assert mps is not None
        mode = node.control.snapshot()["gpus"][0]["compute_mode"]
        if not prepared:
            assert mps.claim_uids() == [] and daemons() == []  # no orphan daemon, no directory
            assert mode == 0
            return
        pid = mps.running_pid(key)
        assert mps.claim_uids() == [key] and pid is not None
        assert [d.pid for d in daemons()] == [pid]  # the one the restart adopted or started
        limits = read_limits(root / "plugin" / "mps" / key / "log")
        biggest = max(MEMORY[u] for u in prepared) >> 20
        assert limits["defaultDevicePinnedMemLimit"] == {uuid: f"{biggest}M"}
        for uid in prepared if specs else ():  # each kept its own limits in its spec
            [spec] = (root / "cdi").glob(f"*{uid}*")
            assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={MEMORY[uid] >> 20}M" in \
                spec.read_text()
        assert mode == 3
    finally:
        for uid in list(node.state.store.load().claims):
            node.state.unprepare(uid)
        assert node.state.hardware.mps is not None
        assert node.state.hardware.mps.claim_uids() == []
        assert daemons() == []  # stopped, not just its directory removed
        node.close()
        sim.uninstall()


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_crash_preparing_the_first_share_rolls_back(point, tmp_path):
    assert run(tmp_path, "prepare", UID_A, point) == CRASH_EXIT_CODE
    converged(tmp_path, set())


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_crash_preparing_a_second_share_keeps_the_first(point, tmp_path):
    assert run(tmp_path, "prepare", UID_A) == 0
    assert run(tmp_path, "prepare", UID_B, point) == CRASH_EXIT_CODE
    # B raises the daemon's limits: recorded as started before the daemon is told
    assert UID_B in on_disk(tmp_path).claims
    converged(tmp_path, {UID_A})


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_crash_preparing_a_share_that_fits_under_the_daemons_limits(point, tmp_path):
    """Such a share changes nothing on the GPU, so it is not recorded as started (two
    fsyncs saved): until its one commit the checkpoint on disk does not know it."""
    assert run(tmp_path, "prepare", UID_A) == 0
    assert run(tmp_path, "prepare", UID_C, point) == CRASH_EXIT_CODE
    assert UID_C not in on_disk(tmp_path).claims
    converged(tmp_path, {UID_A})


@pytest.mark.parametrize("point", UNPREPARE_POINTS)
def test_crash_unpreparing_the_last_share(point, tmp_path):
    assert run(tmp_path, "prepare", UID_A) == 0
    assert run(tmp_path, "unprepare", UID_A, point) == CRASH_EXIT_CODE
    # still recorded: the restart gives the share its daemon and limits back; the kubelet's
    # retry of the unprepare (in converged's clean-up) then takes both away
    converged(tmp_path, {UID_A}, specs=False)


@pytest.mark.parametrize("point", UNPREPARE_POINTS)
def test_crash_unpreparing_one_of_two_shares(point, tmp_path):
    assert run(tmp_path, "prepare", UID_A) == 0
    assert run(tmp_path, "prepare", UID_B) == 0
    assert run(tmp_path, "unprepare", UID_B, point) == CRASH_EXIT_CODE
    converged(tmp_path, {UID_A, UID_B}, specs=False)


def main() -> None:
    root, action, uid = sys.argv[1:]
    node = open_node(Path(root))
    if action == "prepare":
        node.state.prepare(share_claim(uid, SHARE[uid], memory=MEMORY[uid],
                                       multiprocessors=MULTIPROCESSORS[uid]))
    else:
        node.state.unprepare(uid)
    node.close()


if __name__ == "__main__":
    main()
