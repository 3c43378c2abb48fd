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


def test_a_full_gpu_prepare_commits_with_one_atomic_replace(node, syncs):
    node.state.prepare(claim(UID1, "gpu-0"))
    # the CDI spec (renamed in, the directory synced once), then the checkpoint: the
    # temp file synced, renamed over the snapshot, the directory synced
    assert syncs == ["replace", "fsync", "fsync", "replace", "fsync"]


def test_an_unprepare_of_a_call_commits_once(node, syncs):
    node.state.prepare(claim(UID1, "gpu-0"))
    node.state.prepare(claim(UID2, "gpu-1"))
    syncs.clear()
    node.state.unprepare_many([UID1, UID2])
    assert syncs == ["fsync", "replace", "fsync"]
    assert node.state.store.load().claims == {}


def test_every_commit_leaves_a_plain_snapshot_older_builds_read(node):
    snapshot = node.state.store.path
    node.state.prepare(claim(UID1, "gpu-0"))
    assert json.loads(snapshot.read_text())["version"] == 2
    assert sorted(p.name for p in snapshot.parent.glob("checkpoint*")) == [
        "checkpoint.json", "checkpoint.lock"]
