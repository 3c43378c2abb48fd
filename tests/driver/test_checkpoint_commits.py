"""What a prepare and an unprepare cost in durable writes, on a simulated node."""

from __future__ import annotations

import json
import os

import pytest

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


def test_a_full_gpu_prepare_commits_with_one_fdatasync(node, syncs):
    node.state.prepare(claim(UID2, "gpu-1"))  # the first claim puts a journal in effect
    syncs.clear()
    node.state.prepare(claim(UID1, "gpu-0"))
    # the CDI spec (renamed in, the directory synced once), then the checkpoint: one append
    assert syncs == ["replace", "fsync", "fdatasync"]


def test_without_claims_the_checkpoint_is_one_an_older_build_reads(node, syncs):
    """Start-up (after a reboot: claims dropped) leaves version 2, no journal in effect:
    a rollback starts even if this build dies before its clean stop folds the journal."""
    snapshot = node.state.store.path
    assert json.loads(snapshot.read_text())["version"] == 2
    node.state.prepare(claim(UID1, "gpu-0"))
    assert json.loads(snapshot.read_text())["version"] == 3
    node.state.unprepare_many([UID1])
    node.state.store.save(node.state.store.load().model_copy(
        update={"mig_mode_baseline": {"GPU-X": True}}))  # not only claims: a compaction
    assert json.loads(snapshot.read_text())["version"] == 2


def test_an_unprepare_commits_with_one_fdatasync(node, syncs):
    node.state.prepare(claim(UID1, "gpu-0"))
    node.state.prepare(claim(UID2, "gpu-1"))
    syncs.clear()
    node.state.unprepare_many([UID1, UID2])
    assert syncs == ["fdatasync"]
    assert node.state.store.load().claims == {}
