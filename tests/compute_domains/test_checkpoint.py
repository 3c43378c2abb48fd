"""The compute-domain checkpoint shared by two daemon instances (a rolling update), and
read back whole or not at all."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpudra.driver.checkpoint_lock import CheckpointLock, CheckpointLockTimeout
from gpudra.driver.compute_domain_checkpoint import (
    FILE,
    LOCK_FILE,
    Checkpoint,
    CheckpointError,
    ClaimEntry,
    PreparedEntry,
)
from tests.integration.daemon import ROOT

DOMAIN = "11111111-2222-4333-8444-555555555555"


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def entry(n: int, state: str = "completed") -> ClaimEntry:
    return ClaimEntry("default", f"claim-{n}", "channel", DOMAIN, state,  # type: ignore[arg-type]
                      (PreparedEntry("channel", "node-a", f"channel-{n}",
                                     (f"k8s.compute-domain.nvidia.com/claim={uid(n)}-c",)),))


def test_two_instances_never_write_away_each_others_claims(tmp_path: Path) -> None:
    old, new = Checkpoint(tmp_path), Checkpoint(tmp_path)
    old.put(uid(1), entry(1))
    new.put(uid(2), entry(2))  # made from the file, not from what `new` read at start
    old.put(uid(3), entry(3, "started"))
    old.remove(uid(1))
    assert set(new.all()) == set(old.all()) == {uid(2), uid(3)}
    assert new.get(uid(3)) == entry(3, "started")
    reread = Checkpoint(tmp_path)
    assert reread.all() == {uid(2): entry(2), uid(3): entry(3, "started")}
    for checkpoint in (old, new, reread):
        checkpoint.close()


def test_another_process_writing_at_the_same_time_loses_nothing(tmp_path: Path) -> None:
    """A second process puts claims 1000… while this one puts 0…: every put of both is
    in the file at the end."""
    writer = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from tests.compute_domains.test_checkpoint import entry, uid
        from gpudra.driver.compute_domain_checkpoint import Checkpoint
        checkpoint = Checkpoint(Path({str(tmp_path)!r}))
        print("ready", flush=True)
        sys.stdin.readline()
        for n in range(1000, 1040):
            checkpoint.put(uid(n), entry(n))
    """)
    mine = Checkpoint(tmp_path)
    with subprocess.Popen([sys.executable, "-c", writer], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, cwd=ROOT) as other:
        try:
            assert other.stdout is not None and other.stdin is not None
            assert other.stdout.readline().strip() == "ready"
            other.stdin.write("go\n")
            other.stdin.flush()
            for n in range(40):
                mine.put(uid(n), entry(n))
            assert other.wait(60) == 0
        finally:
            if other.poll() is None:
                other.kill()
    assert set(mine.all()) == {uid(n) for n in [*range(40), *range(1000, 1040)]}
    mine.close()


def test_a_change_waits_for_the_other_instance_then_says_whose_lock(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path, lock_timeout=0.2)
    other = CheckpointLock(tmp_path / LOCK_FILE)  # another open file: as another process
    with other.held(1.0), pytest.raises(CheckpointLockTimeout, match=LOCK_FILE):
        checkpoint.put(uid(1), entry(1))
    other.close()
    checkpoint.put(uid(1), entry(1))
    assert checkpoint.get(uid(1)) == entry(1)
    checkpoint.close()


def test_a_file_changed_since_it_was_written_is_caught_by_its_checksum(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path)
    checkpoint.put(uid(1), entry(1))
    checkpoint.close()
    path = tmp_path / FILE
    body = json.loads(path.read_text())
    body["claims"][uid(1)]["state"] = "started"  # still valid JSON, still a valid entry
    path.write_text(json.dumps(body))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        Checkpoint(tmp_path)
    recovered = Checkpoint(tmp_path, recover=lambda: {uid(1): entry(1, "started")})
    assert recovered.set_aside is not None and recovered.set_aside.exists()
    assert json.loads(recovered.set_aside.read_text()) == body  # kept, never deleted
    assert recovered.all() == {uid(1): entry(1, "started")}
    recovered.close()


def test_a_file_that_turns_unreadable_while_running_is_recovered_on_the_next_read(
        tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path, recover=lambda: {uid(7): entry(7, "started")})
    checkpoint.put(uid(1), entry(1))
    (tmp_path / FILE).write_text('{"version": 1, "claims": [')
    assert checkpoint.get(uid(7)) == entry(7, "started")
    assert checkpoint.set_aside is not None
    assert checkpoint.set_aside.read_text() == '{"version": 1, "claims": ['
    checkpoint.close()


def test_the_previous_builds_file_without_a_checksum_is_read(tmp_path: Path) -> None:
    (tmp_path / FILE).write_text(json.dumps({"version": 1, "claims": {uid(1): {
        "namespace": "default", "name": "claim-1", "kind": "channel", "domain": DOMAIN,
        "state": "completed", "devices": [{"request": "channel", "pool": "node-a",
                                           "device": "channel-1", "cdi_ids": [
                                               f"k8s.compute-domain.nvidia.com/claim={uid(1)}-c"]}]}}}))
    checkpoint = Checkpoint(tmp_path)
    assert checkpoint.all() == {uid(1): entry(1)}
    checkpoint.put(uid(2), entry(2))
    written = json.loads((tmp_path / FILE).read_text())
    # What the previous build reads: version 1, the claims as it wrote them; the checksum
    # beside them is a key it does not look at.
    assert written["version"] == 1 and set(written["claims"]) == {uid(1), uid(2)}
    assert written["claims"][uid(1)]["devices"][0]["cdi_ids"] == [
        f"k8s.compute-domain.nvidia.com/claim={uid(1)}-c"]
    checkpoint.close()


@pytest.mark.parametrize("bad", [
    {"kind": "rootkit"}, {"state": "maybe"}, {"domain": "../../etc"}, {"devices": "x"},
])
def test_an_entry_of_the_wrong_shape_is_unreadable(tmp_path: Path, bad: dict[str, object]) -> None:
    checkpoint = Checkpoint(tmp_path)
    checkpoint.put(uid(1), entry(1))
    checkpoint.close()
    path = tmp_path / FILE
    body = json.loads(path.read_text())
    body["claims"][uid(1)].update(bad)
    del body["checksum"]
    path.write_text(json.dumps(body))
    with pytest.raises(CheckpointError, match=str(path)):
        Checkpoint(tmp_path)
