"""What a prepare and an unprepare cost in durable writes, on a simulated node."""

from __future__ import annotations

import json
import os

import pytest

from gpudra.driver.checkpoint_model import (
    PREPARE_COMPLETED,
    ClaimRecord,
    with_claim,
    with_mig_mode_baseline,
    without_claim,
)
from gpudra.driver.checkpoint_store import CheckpointStore
from tests.driver.node_fixture import claim
from tests.driver.test_device_state import UID1, UID2


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The durable-write system calls made from now on (the os functions, wrapped)."""
    calls: list[str] = []

    def counting(name):
        real = getattr(os, name)

        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return call

    for name in ("fsync", "fdatasync", "replace", "rename"):
        monkeypatch.setattr(os, name, counting(name))
    return calls


def test_a_full_gpu_prepare_commits_with_one_atomic_replace(node, syncs):
    node.state.prepare(claim(UID1, "gpu-0"))
    # the CDI spec (renamed in, the directory synced once), then the checkpoint: the
    # temp file synced and renamed over the snapshot. Claims alone changed, so the
    # directory is not synced (a new boot drops claims anyway).
    assert syncs == ["replace", "fsync", "fsync", "replace"]


def test_an_unprepare_of_a_call_commits_once(node, syncs):
    node.state.prepare(claim(UID1, "gpu-0"))
    node.state.prepare(claim(UID2, "gpu-1"))
    syncs.clear()
    node.state.unprepare_many([UID1, UID2])
    assert syncs == ["fsync", "replace"]
    assert node.state.store.load().claims == {}


def test_every_commit_leaves_a_plain_snapshot_older_builds_read(node):
    snapshot = node.state.store.path
    node.state.prepare(claim(UID1, "gpu-0"))
    assert json.loads(snapshot.read_text())["version"] == 2
    assert sorted(p.name for p in snapshot.parent.glob("checkpoint*")) == [
        "checkpoint.json", "checkpoint.lock"]


def test_what_a_new_boot_keeps_is_committed_with_the_directory_synced(tmp_path, syncs):
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    store.update(lambda cp: with_claim(cp, record(UID1)))
    assert syncs == ["fsync", "replace", "fsync"]  # the first file: its name too
    syncs.clear()
    store.update(lambda cp: with_claim(cp, record(UID2)))
    assert syncs == ["fsync", "replace"]  # claims alone
    syncs.clear()
    store.update(lambda cp: with_mig_mode_baseline(cp, "GPU-a", False))
    assert syncs == ["fsync", "replace", "fsync"]  # a baseline outlives a reboot
    syncs.clear()
    store.update(lambda cp: without_claim(cp, UID1))
    assert syncs == ["fsync", "replace"]
    store.close()
    # After a reboot the first commit writes the new boot id: synced too.
    rebooted = CheckpointStore(tmp_path, boot_id="boot-2")
    syncs.clear()
    saved = rebooted.update(lambda cp: with_claim(cp, record(UID1)))
    assert syncs == ["fsync", "replace", "fsync"]
    assert saved.boot_id == "boot-2" and saved.mig_mode_baseline == {"GPU-a": False}
    assert list(rebooted.load().claims) == [UID1]
    rebooted.close()


def test_a_save_compares_with_the_file_as_it_is_not_as_last_read(tmp_path, syncs):
    """``save`` of a checkpoint made from an older read (a blind overwrite, which callers
    avoid by holding the lock from load to save) still syncs the directory when what a new
    boot keeps differs from the file it replaces: here a baseline another process wrote."""
    mine = CheckpointStore(tmp_path, boot_id="boot-1")
    other = CheckpointStore(tmp_path, boot_id="boot-1")
    stale = mine.update(lambda cp: with_claim(cp, record(UID1)))
    other.update(lambda cp: with_mig_mode_baseline(cp, "GPU-a", True))
    syncs.clear()
    mine.save(with_claim(stale, record(UID2)))
    assert syncs == ["fsync", "replace", "fsync"]
    assert other.load().mig_mode_baseline == {}
    mine.close()
    other.close()


def record(uid: str) -> ClaimRecord:
    return ClaimRecord(uid=uid, namespace="default", name=f"claim-{uid[:4]}",
                       state=PREPARE_COMPLETED, devices=[], started_at="2026-11-28T00:00:00Z")
