"""The checkpoint's journal: claims-only commits append, torn tails, compaction, two writers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest

from gpudra.driver.checkpoint_codec import CheckpointCorrupt, CheckpointVersionUnsupported
from gpudra.driver.checkpoint_journal import MAX_BYTES, MAX_RECORDS, encode_record
from gpudra.driver.checkpoint_model import (
    PREPARE_COMPLETED,
    Checkpoint,
    ClaimRecord,
    DeviceRecord,
    with_claim,
    with_mig_mode_baseline,
    without_claim,
)
from gpudra.driver.checkpoint_store import CheckpointStore

ROOT = Path(__file__).resolve().parents[2]
BASE_COMMIT = "2b789825cf502c032439a91763d046c5eb4e4891"
"""A build from before the journal: it reads checkpoint versions 1..2."""


def claim(n: int, *, restore: dict[str, object] | None = None) -> ClaimRecord:
    uid = f"uid-{n:04d}"
    return ClaimRecord(
        uid=uid, namespace="ns", name=f"claim-{n}", state=PREPARE_COMPLETED,
        devices=[DeviceRecord(request_names=["gpu"], pool="node", device=f"gpu-{n % 8}",
                              cdi_device_ids=[f"k8s.gpu.nvidia.com/claim={uid}-gpu"],
                              kind="gpu", uuid=f"GPU-{n % 8}")],
        restore=restore or {})


def base(claims: int = 2) -> Checkpoint:
    cp = Checkpoint(boot_id="boot", mig_mode_baseline={"GPU-0": False})
    for n in range(claims):
        cp = with_claim(cp, claim(n))
    return cp


def files(directory: Path) -> tuple[Path, Path]:
    return directory / "checkpoint.json", directory / "checkpoint.journal"


def lines(directory: Path) -> list[bytes]:
    return files(directory)[1].read_bytes().splitlines(keepends=True)


def generation_of(directory: Path) -> str:
    """The journal generation the snapshot names."""
    generation: str = json.loads(files(directory)[0].read_text())["data"]["journalGeneration"]
    return generation


def write_line(directory: Path, payload: bytes) -> None:
    """Make the journal one line holding ``payload`` as its record, checksummed as a newer
    build would write it (the record's bytes exactly as they stand)."""
    digest = hashlib.sha256(payload).hexdigest().encode()
    files(directory)[1].write_bytes(
        b'{"checksum":"sha256:' + digest + b'","record":' + payload + b"}\n")


def reopened(directory: Path) -> Checkpoint:
    """What a restarted daemon reads (a new store: no cache)."""
    return CheckpointStore(directory, boot_id="boot").load()


def test_claims_only_saves_append_one_verified_line_each(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    snapshot, journal = files(tmp_path)
    inode = snapshot.stat().st_ino
    generation = generation_of(tmp_path)
    assert journal.read_bytes() == b""

    cp = with_claim(store.load(), claim(5))
    store.save(cp)  # put
    cp = without_claim(cp, "uid-0000")
    store.save(cp)  # remove
    changed = claim(1, restore={"computeMode": {"GPU-1": "Default"}})
    cp = with_claim(without_claim(cp, "uid-0005"), changed)
    store.save(cp)  # both in one record
    assert snapshot.stat().st_ino == inode  # never rewritten

    records = []
    for line in lines(tmp_path):
        doc = json.loads(line)  # each line is a JSON document
        payload = line[line.index(b'"record":') + len(b'"record":'):-2]
        assert doc["checksum"] == "sha256:" + hashlib.sha256(payload).hexdigest()
        records.append(doc["record"])
    assert [(r["generation"], r["seq"]) for r in records] == [(generation, 1), (generation, 2),
                                                             (generation, 3)]
    assert list(records[0]["put"]) == ["uid-0005"] and records[0]["remove"] == []
    assert records[1]["put"] == {} and records[1]["remove"] == ["uid-0000"]
    assert records[2]["put"]["uid-0001"]["restore"] == {"computeMode": {"GPU-1": "Default"}}
    assert records[2]["remove"] == ["uid-0005"]
    # the claim in the codec's on-disk form, as the snapshot would hold it
    in_snapshot = json.loads(snapshot.read_text())["data"]["claims"]["uid-0000"]
    assert records[0]["put"]["uid-0005"].keys() == in_snapshot.keys()

    assert store.load() == cp
    assert reopened(tmp_path) == cp  # replayed by a new store


def test_a_torn_last_record_is_ignored_then_cut_off_by_the_next_save(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    store.save(with_claim(store.load(), claim(5)))
    committed = store.load()
    _, journal = files(tmp_path)
    good = journal.read_bytes()
    # A power cut half-way through the next append: half a line, no newline.
    torn, _ = encode_record(json.loads(good)["record"]["generation"], 2,
                            {"uid-0006": claim(6)}, [])
    with journal.open("ab") as f:
        f.write(torn[: len(torn) // 2])
    assert reopened(tmp_path) == committed
    assert store.load() == committed

    store.save(with_claim(store.load(), claim(7)))
    assert journal.read_bytes().startswith(good)
    assert len(lines(tmp_path)) == 2 and journal.read_bytes().endswith(b"}\n")
    assert set(reopened(tmp_path).claims) == {"uid-0000", "uid-0001", "uid-0005", "uid-0007"}


def test_a_whole_last_line_failing_its_checksum_is_a_torn_write(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    store.save(with_claim(store.load(), claim(5)))
    committed = store.load()
    store.save(with_claim(committed, claim(6)))
    _, journal = files(tmp_path)
    first, last = lines(tmp_path)
    # power cut: the last block reached the disk zero-filled, only its newline made it
    journal.write_bytes(first + b"\0" * (len(last) - 1) + b"\n")
    assert reopened(tmp_path) == committed
    restarted = CheckpointStore(tmp_path, boot_id="boot")
    restarted.save(with_claim(restarted.load(), claim(8)))
    assert lines(tmp_path)[0] == first and len(lines(tmp_path)) == 2
    assert set(reopened(tmp_path).claims) == {"uid-0000", "uid-0001", "uid-0005", "uid-0008"}


def test_a_bad_record_followed_by_good_ones_is_corrupt(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    for n in (5, 6):
        store.save(with_claim(store.load(), claim(n)))
    _, journal = files(tmp_path)
    first, second = lines(tmp_path)
    journal.write_bytes(first.replace(b'"claim-5"', b'"claim-X"') + second)
    with pytest.raises(CheckpointCorrupt, match=r"checkpoint\.journal is corrupt: record at "
                                                 r"byte 0: checksum mismatch, and more follows"):
        reopened(tmp_path)
    # (store's cache does not see a rewrite in place of the same length: gpudra never
    # writes so, and a bit flip on disk is found by the next start)


def test_records_must_follow_each_other_in_sequence(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    store.save(with_claim(store.load(), claim(5)))
    _, journal = files(tmp_path)
    generation = json.loads(lines(tmp_path)[0])["record"]["generation"]
    skipped, _ = encode_record(generation, 3, {"uid-0006": claim(6)}, [])
    with journal.open("ab") as f:
        f.write(skipped)
    with pytest.raises(CheckpointCorrupt, match="seq 3 where 2 was due"):
        reopened(tmp_path)


def test_a_bad_claim_in_a_valid_record_names_the_claim_and_field(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    raw = json.loads(claim(6).model_dump_json())
    raw["devices"][0]["kind"] = 7
    write_line(tmp_path, json.dumps({"generation": generation_of(tmp_path), "seq": 1,
                                     "put": {"uid-0006": raw}, "remove": []},
                                    separators=(",", ":")).encode())
    with pytest.raises(CheckpointCorrupt,
                       match=r"put\.uid-0006\.devices\[0\]\.kind: Input should be 'gpu' or"):
        reopened(tmp_path)


def test_fields_from_a_newer_build_in_journal_records_survive(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    raw = json.loads(claim(6).model_dump_json())
    raw["futureClaimField"] = {"keep": [1, None]}
    write_line(tmp_path, json.dumps({"generation": generation_of(tmp_path), "seq": 1,
                                     "put": {"uid-0006": raw}, "remove": [],
                                     "futureRecordField": 1}).encode())
    loaded = reopened(tmp_path).claims["uid-0006"]
    assert loaded.model_extra == {"futureClaimField": {"keep": [1, None]}}
    store.compact()
    doc = json.loads(files(tmp_path)[0].read_text())
    assert doc["data"]["claims"]["uid-0006"]["futureClaimField"] == {"keep": [1, None]}


def test_a_crash_between_compactions_snapshot_and_truncate_loads_the_snapshot(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    store.save(with_claim(store.load(), claim(5)))  # a record putting uid-0005
    _, journal = files(tmp_path)
    left_over = journal.read_bytes()
    # Compacts (more than claims change), and forgets uid-0005 in the same commit.
    compacted = with_mig_mode_baseline(without_claim(store.load(), "uid-0005"), "GPU-1", True)
    store.save(compacted)
    assert journal.read_bytes() == b""
    # ... as if the crash came before the journal was emptied: its old records remain.
    journal.write_bytes(left_over)
    assert reopened(tmp_path) == compacted  # the old generation's put is not replayed
    assert "uid-0005" not in store.load().claims
    # The next writer does not append behind them: it compacts them away.
    after = with_claim(store.load(), claim(9))
    store.save(after)
    assert b'"uid-0005"' not in journal.read_bytes()
    assert reopened(tmp_path) == after


def test_records_of_another_generation_are_skipped(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    _, journal = files(tmp_path)
    other, _ = encode_record("0123456789abcdef", 1, {"uid-0006": claim(6)}, [])
    journal.write_bytes(other)
    assert reopened(tmp_path) == base()


def test_compaction_at_the_record_limit(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    snapshot, journal = files(tmp_path)
    inode = snapshot.stat().st_ino
    for n in range(MAX_RECORDS):
        store.update(lambda cp, n=n: with_claim(cp, claim(100 + n)))
    assert len(lines(tmp_path)) == MAX_RECORDS and snapshot.stat().st_ino == inode
    store.update(lambda cp: without_claim(cp, "uid-0100"))
    assert journal.read_bytes() == b"" and snapshot.stat().st_ino != inode
    expected = {f"uid-{n:04d}" for n in [0, 1, *range(101, 100 + MAX_RECORDS)]}
    assert set(reopened(tmp_path).claims) == expected
    assert json.loads(snapshot.read_text())["version"] == 3  # a journal is in effect


def test_compaction_at_the_byte_limit(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    snapshot, journal = files(tmp_path)
    inode = snapshot.stat().st_ino
    big = {"blob": "x" * (MAX_BYTES // 3)}
    for n in range(2):
        store.update(lambda cp, n=n: with_claim(cp, claim(10 + n, restore=big)))
    assert len(lines(tmp_path)) == 2 and snapshot.stat().st_ino == inode
    store.update(lambda cp: with_claim(cp, claim(12, restore=big)))  # would pass the limit
    assert journal.read_bytes() == b"" and snapshot.stat().st_ino != inode
    assert set(reopened(tmp_path).claims) == {"uid-0000", "uid-0001", "uid-0010", "uid-0011",
                                              "uid-0012"}


class Syncs:
    """Counts the durable-write system calls the store makes (the os functions, wrapped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in ("fsync", "fdatasync", "replace", "rename"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._counting(name, real))

    def _counting(self, name, real):
        def call(*args, **kwargs):
            self.calls.append(name)
            return real(*args, **kwargs)
        return call


def test_a_claims_only_save_is_one_fdatasync_and_no_rename(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    syncs = Syncs(monkeypatch)
    store.update(lambda cp: with_claim(cp, claim(5)))
    assert syncs.calls == ["fdatasync"]
    syncs.calls.clear()
    store.update(lambda cp: without_claim(cp, "uid-0005"))
    assert syncs.calls == ["fdatasync"]
    syncs.calls.clear()
    # A compaction: snapshot fsync, rename, directory fsync, the emptied journal's fsync.
    store.update(lambda cp: with_mig_mode_baseline(cp, "GPU-3", True))
    assert syncs.calls == ["fsync", "replace", "fsync", "fsync"]
    syncs.calls.clear()
    store.save(store.load())  # nothing changed: nothing written
    assert syncs.calls == []


def test_an_unchanged_checkpoint_is_read_from_the_cache_even_after_a_save(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    store.save(with_claim(store.load(), claim(5)))
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(str(path))
                        or real_open(path, *a, **k))
    first = store.load()
    assert store.load() is first and opened == []  # two stats, no read, no decode
    assert first == with_claim(base(), claim(5))


def test_what_the_cache_holds_after_a_save_is_what_a_reader_decodes(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    record = claim(5).model_copy(update={"restore": {"ids": (1, 2)}})  # a tuple: not JSON yet
    store.save(with_claim(store.load(), record))
    assert store.load().claims["uid-0005"].restore == {"ids": [1, 2]}
    assert store.load() == reopened(tmp_path)


def test_a_failed_append_leaves_the_state_before_it(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    store.save(with_claim(store.load(), claim(5)))
    before = store.load()

    def io_error(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", io_error)
    with pytest.raises(OSError, match="Input/output"):
        store.save(with_claim(before, claim(6)))
    monkeypatch.undo()
    assert store.load() == before
    assert reopened(tmp_path) == before
    store.save(with_claim(store.load(), claim(7)))
    assert set(reopened(tmp_path).claims) == {"uid-0000", "uid-0001", "uid-0005", "uid-0007"}


def test_two_stores_interleaving_saves_see_each_others_claims(tmp_path):
    one = CheckpointStore(tmp_path, boot_id="boot")  # e.g. the old and the new daemon
    two = CheckpointStore(tmp_path, boot_id="boot")
    one.save(base())
    snapshot, _ = files(tmp_path)
    inode = snapshot.stat().st_ino
    one.update(lambda cp: with_claim(cp, claim(5)))
    two.update(lambda cp: with_claim(cp, claim(6)))
    assert set(one.load().claims) == {"uid-0000", "uid-0001", "uid-0005", "uid-0006"}
    one.update(lambda cp: without_claim(cp, "uid-0006"))
    two.update(lambda cp: without_claim(cp, "uid-0005"))
    assert set(one.load().claims) == set(two.load().claims) == {"uid-0000", "uid-0001"}
    assert snapshot.stat().st_ino == inode and len(lines(tmp_path)) == 4
    assert [json.loads(line)["record"]["seq"] for line in lines(tmp_path)] == [1, 2, 3, 4]


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from gpudra.driver.checkpoint_model import *
    from tests.driver.test_checkpoint_journal import claim

    directory, first, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    from gpudra.driver.checkpoint_store import CheckpointStore
    store = CheckpointStore(directory, boot_id="boot")
    for n in range(first, first + count):
        store.update(lambda cp: with_claim(cp, claim(n)))
        if n % 3 == 0:
            store.update(lambda cp: without_claim(cp, f"uid-{n - 1:04d}"))
""")


def test_two_processes_committing_at_once_lose_nothing(tmp_path):
    CheckpointStore(tmp_path, boot_id="boot").save(Checkpoint(boot_id="boot"))
    count = 180  # with the removals, more commits than one journal holds: compacts too
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(first),
                               str(count)], env=env, cwd=ROOT, stderr=subprocess.PIPE,
                              text=True) for first in (1000, 5000)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    expected = {f"uid-{n:04d}" for first in (1000, 5000) for n in range(first, first + count)
                if (n + 1) % 3 != 0 or n + 1 >= first + count}
    assert set(reopened(tmp_path).claims) == expected


def test_a_lockless_reader_never_sees_a_half_commit(tmp_path):
    writer = CheckpointStore(tmp_path, boot_id="boot")
    reader = CheckpointStore(tmp_path, boot_id="boot")
    writer.save(base(0))
    done = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def read():
        try:
            while not done.is_set():
                claims = reader.load().claims  # no lock
                # each commit adds the next claim: a prefix, never a gap
                assert set(claims) == {f"uid-{n:04d}" for n in range(len(claims))}
                seen.append(len(claims))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for n in range(MAX_RECORDS + 40):  # through a compaction
            writer.update(lambda cp, n=n: with_claim(cp, claim(n)))
    finally:
        done.set()
        thread.join()
    assert not errors, errors
    assert seen == sorted(seen) and len(reader.load().claims) == MAX_RECORDS + 40


def test_a_removed_journal_is_recreated_by_a_compaction(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    _, journal = files(tmp_path)
    journal.unlink()
    cp = with_claim(store.load(), claim(5))
    store.save(cp)  # must not append to a file whose directory entry is not durable
    assert journal.exists() and journal.read_bytes() == b""
    assert reopened(tmp_path) == cp


def test_quarantine_moves_the_journal_aside_too(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    store.save(with_claim(store.load(), claim(5)))
    moved = store.quarantine()
    assert moved is not None and moved.name.startswith("checkpoint.json.corrupt-")
    aside = tmp_path / moved.name.replace("checkpoint.json", "checkpoint.journal")
    assert b"uid-0005" in aside.read_bytes()
    assert store.load() == Checkpoint(boot_id="boot")


def older_build_codec() -> types.ModuleType:
    """The checkpoint codec of a build from before the journal, from git."""
    try:
        source = subprocess.run(["git", "show", f"{BASE_COMMIT}:driver/checkpoint_codec.py"],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"commit {BASE_COMMIT} is not in this checkout")
    module = types.ModuleType("older_checkpoint_codec")
    exec(compile(source, "older_checkpoint_codec.py", "exec"), module.__dict__)
    return module


def test_an_older_build_refuses_a_snapshot_with_a_journal_and_reads_a_compacted_one(tmp_path):
    older = older_build_codec()
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    store.save(with_claim(store.load(), claim(5)))
    snapshot, _ = files(tmp_path)
    assert json.loads(snapshot.read_text())["version"] == 3
    with pytest.raises(older.CheckpointVersionUnsupported, match=r"reads versions 1\.\.2"):
        older.decode(snapshot.read_bytes(), path=snapshot, boot_id="boot")
    # A clean stop compacts: the older build then reads every claim.
    store.compact()
    cp, version = older.decode(snapshot.read_bytes(), path=snapshot, boot_id="boot")
    assert version == 2 and cp == with_claim(base(), claim(5))
    # and this build carries on with it
    assert reopened(tmp_path) == cp
    store.save(without_claim(store.load(), "uid-0005"))
    assert json.loads(snapshot.read_text())["version"] == 3


def test_this_build_refuses_a_newer_layout_in_the_same_way(tmp_path):
    snapshot, _ = files(tmp_path)
    snapshot.write_text(json.dumps({"kind": "GpudraCheckpoint", "version": 4, "data": {}}))
    with pytest.raises(CheckpointVersionUnsupported):
        reopened(tmp_path)


def test_compacting_a_plain_snapshot_changes_nothing(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path, boot_id="boot")
    store.save(base())
    store.compact()
    snapshot, _ = files(tmp_path)
    content = snapshot.read_bytes()
    syncs = Syncs(monkeypatch)
    store.compact()
    CheckpointStore(tmp_path, boot_id="boot").compact()
    assert syncs.calls == [] and snapshot.read_bytes() == content


CRASHER = textwrap.dedent("""
    import json, os, random, signal, sys, time, traceback
    from pathlib import Path
    from gpudra.driver.checkpoint_journal import MAX_RECORDS
    from gpudra.driver.checkpoint_model import *
    from gpudra.driver.checkpoint_store import CheckpointStore
    from tests.driver.test_checkpoint_journal import claim

    directory, min_rounds = Path(sys.argv[1]), int(sys.argv[2])
    store = CheckpointStore(directory, boot_id="boot")
    store.save(Checkpoint(boot_id="boot"))
    rng = random.Random(2)
    last = done = 0
    # At least min_rounds kills, and more until the writers went through a compaction.
    while done < min_rounds or (last <= MAX_RECORDS + 20 and done < 10 * min_rounds):
        done += 1
        pid = os.fork()
        if pid == 0:  # the writer: one claim more per commit, until killed
            try:
                writer = CheckpointStore(directory, boot_id="boot")
                while True:
                    writer.update(lambda cp: with_claim(cp, claim(len(cp.claims))))
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.001, 0.03))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status), "the writer failed"
        claims = store.load().claims  # raises if the kill left a broken journal
        assert set(claims) == {f"uid-{n:04d}" for n in range(len(claims))}
        assert len(claims) >= last
        last = len(claims)
    print(json.dumps({"last": last}))
""")


def test_sigkill_during_appends_and_compactions_never_loses_a_commit(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CRASHER, str(tmp_path), "25"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout)["last"]
    assert last > MAX_RECORDS  # went through compactions
    assert len(reopened(tmp_path).claims) == last


def test_a_reader_between_a_compactions_rename_and_truncate_still_sees_later_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Another daemon instance (rolling update) reads without the lock right after our
    compaction replaced the snapshot, while the old journal is still there: it must not
    resume later reads from that old journal's end once the new one has grown past it."""
    import gpudra.driver.checkpoint_store as store_module

    writer = CheckpointStore(tmp_path, boot_id="boot")
    reader = CheckpointStore(tmp_path, boot_id="boot")
    cp = base(0)
    writer.save(cp)
    for n in range(3):
        cp = with_claim(cp, claim(n))
        writer.save(cp)
    old_journal = (tmp_path / "checkpoint.journal").stat().st_size
    real = store_module.atomic_write

    def then_the_reader_looks(*args: object, **kwargs: object) -> None:
        real(*args, **kwargs)  # type: ignore[arg-type]
        monkeypatch.setattr(store_module, "atomic_write", real)
        reader.load()

    monkeypatch.setattr(store_module, "atomic_write", then_the_reader_looks)
    cp = with_mig_mode_baseline(cp, "GPU-1", True)  # not only claims: a compaction
    writer.save(cp)
    n = 100
    while (tmp_path / "checkpoint.journal").stat().st_size < old_journal:
        cp = with_claim(cp, claim(n))
        writer.save(cp)
        n += 1
    assert sorted(reader.load().claims) == sorted(cp.claims)
    with reader.locked():  # a commit of its own keeps the writer's claims
        reader.save(with_claim(reader.load(), claim(900)))
    assert sorted(CheckpointStore(tmp_path, boot_id="boot").load().claims) == sorted(
        [*cp.claims, claim(900).uid])
