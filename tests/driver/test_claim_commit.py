"""ClaimCommit: a call's puts, removes and MIG-mode baselines, merged in one commit."""

from __future__ import annotations

import os

import pytest

from gpudra.driver.checkpoint_model import Checkpoint, with_claim, with_mig_mode_baseline
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.claim_commit import ClaimCommit
from tests.driver.test_checkpoint import numbered


def test_one_commit_merges_into_what_others_committed_meanwhile(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(with_claim(with_claim(Checkpoint(boot_id="boot"), numbered(1)), numbered(2)))
    call = ClaimCommit(store, lock_timeout=1).put(numbered(3)).remove("uid-0001")
    call.baselines({"GPU-A": False})
    # another call (other GPUs) commits in between
    other = CheckpointStore(tmp_path, boot_id="boot")
    ClaimCommit(other, lock_timeout=1).put(numbered(4)).baselines({"GPU-A": True}).commit()
    call.commit()
    cp = CheckpointStore(tmp_path, boot_id="boot").load()
    assert sorted(cp.claims) == ["uid-0002", "uid-0003", "uid-0004"]
    assert cp.mig_mode_baseline == {"GPU-A": True}  # the first baseline on disk stays


def test_the_last_change_of_a_claim_wins_and_an_empty_commit_writes_nothing(
        tmp_path, monkeypatch: pytest.MonkeyPatch):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(with_mig_mode_baseline(Checkpoint(boot_id="boot"), "GPU-A", False))
    call = ClaimCommit(store, lock_timeout=1)
    call.put(numbered(1)).remove("uid-0001").put(numbered(2)).remove("uid-0002")
    call.put(numbered(2))
    call.commit()
    assert list(store.load().claims) == ["uid-0002"]
    replaced: list[object] = []
    monkeypatch.setattr(os, "replace", lambda *args: replaced.append(args))
    call.commit()  # collected changes were written: nothing left
    ClaimCommit(store, lock_timeout=1).commit()
    assert replaced == []
