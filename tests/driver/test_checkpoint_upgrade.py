"""Upgrades and downgrades against the previous build (a snapshot plus a journal).

That build's files are fixtures it wrote (``fixtures/prev_*``); that build itself runs from
its archive in a subprocess (:mod:`tests.driver.prev_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudra.driver.checkpoint_codec import (
    CheckpointCorrupt,
    CheckpointVersionUnsupported,
    decode_snapshot,
    encode,
)
from gpudra.driver.checkpoint_model import Checkpoint, without_claim
from gpudra.driver.checkpoint_store import CheckpointStore, Opened, Unreadable
from tests.driver.test_checkpoint import UID_A, UID_B, sample

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
UID_C = "c3b1f0a2-5d4e-4f6a-8b7c-9d0e1f2a3b4c"
UID_X = "d4c2e1b3-6e5f-4a7b-9c8d-0e1f2a3b4c5d"
LAYOUTS = ["prev_plain", "prev_journal", "prev_torn", "prev_stale"]


def copied(layout: str, tmp_path: Path) -> Path:
    directory = tmp_path / layout
    shutil.copytree(FIXTURES / layout, directory)
    (directory / "expected.json").unlink()
    return directory


def expected(layout: str) -> tuple[bytes, Checkpoint]:
    content = (FIXTURES / layout / "expected.json").read_bytes()
    path = FIXTURES / layout / "expected.json"
    return content, decode_snapshot(content, path=path, boot_id="boot-1").checkpoint


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def previous_build(tmp_path: Path, directory: Path, *actions: str) -> list[dict[str, Any]]:
    """Run the previous build's store on ``directory``: one JSON result per action."""
    work = tmp_path / f"prev-{len(list(tmp_path.glob('prev-*')))}"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "tests.driver.prev_checkpoint", str(work), str(directory),
         *actions], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def data_of(cp: Checkpoint) -> Any:
    return json.loads(encode(cp))["data"]


# --- this build reads the previous build's files -------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_previous_builds_files_load_as_that_build_loaded_them(layout, tmp_path):
    directory = copied(layout, tmp_path)
    before = {name: (directory / name).read_bytes() for name in names(directory)}
    _, want = expected(layout)
    assert CheckpointStore(directory, boot_id="boot-1").load() == want
    # reading changes nothing
    assert {name: (directory / name).read_bytes() for name in names(directory)
            if name != "checkpoint.lock"} == before


@pytest.mark.parametrize("layout", LAYOUTS)
def test_open_rewrites_them_once_as_a_plain_snapshot(layout, tmp_path):
    directory = copied(layout, tmp_path)
    content, want = expected(layout)
    store = CheckpointStore(directory, boot_id="boot-1")
    opened = store.open()
    assert isinstance(opened, Opened)
    assert opened.result.checkpoint == want
    assert opened.result.migrated_from == (None if layout == "prev_plain" else 3)
    # byte for byte what that build wrote when it folded its journal at a clean stop
    assert (directory / "checkpoint.json").read_bytes() == content
    assert names(directory) == ["checkpoint.json", "checkpoint.lock"]
    # once: a second start reads and writes nothing more
    stat = (directory / "checkpoint.json").stat()
    again = CheckpointStore(directory, boot_id="boot-1").open()
    assert isinstance(again, Opened) and again.result.migrated_from is None
    assert os.path.samestat((directory / "checkpoint.json").stat(), stat)
    assert again.result.checkpoint == want


def test_a_journal_in_effect_is_read_under_the_lock_and_each_time(tmp_path):
    # The previous build, still running during a rolling update, appends without replacing
    # the snapshot: this build must not answer from a cache keyed on the snapshot.
    directory = copied("prev_journal", tmp_path)
    store = CheckpointStore(directory, boot_id="boot-1")
    assert UID_X not in store.load().claims
    [after] = previous_build(tmp_path, directory, "put:" + UID_X)
    assert after["version"] == 3
    assert UID_X in store.load().claims
    assert data_of(store.load()) == after["data"]


# --- the previous build reads this build's files -------------------------------------------


def test_the_previous_build_reads_what_this_one_writes(tmp_path):
    store = CheckpointStore(tmp_path / "plugin", boot_id="boot-1")
    store.save(sample())
    [read] = previous_build(tmp_path, tmp_path / "plugin", "load")
    assert read == {"version": 2, "data": data_of(sample())}


def test_after_an_upgrade_the_previous_build_reads_the_rewritten_files(tmp_path):
    directory = copied("prev_journal", tmp_path)
    store = CheckpointStore(directory, boot_id="boot-1")
    assert isinstance(store.open(), Opened)
    store.update(lambda cp: without_claim(cp, UID_B))
    [read] = previous_build(tmp_path, directory, "load")
    assert read["version"] == 2 and read["data"] == data_of(store.load())
    assert UID_B not in read["data"]["claims"] and UID_C in read["data"]["claims"]


def test_a_rolling_update_with_both_builds_committing_loses_nothing(tmp_path):
    directory = tmp_path / "plugin"
    new = CheckpointStore(directory, boot_id="boot-1")
    new.save(sample())
    # the previous build commits the way it does: the first compacts, the next appends
    first, second = previous_build(tmp_path, directory, "put:" + UID_C, "put:" + UID_X)
    assert first["version"] == second["version"] == 3
    assert set(second["data"]["claims"]) == {UID_A, UID_B, UID_C, UID_X}
    assert (directory / "checkpoint.journal").read_bytes().count(b"\n") == 1
    assert data_of(new.load()) == second["data"]
    new.update(lambda cp: without_claim(cp, UID_A))  # a plain snapshot again, no journal
    assert names(directory) == ["checkpoint.json", "checkpoint.lock"]
    ours = data_of(new.load())
    [read, removed] = previous_build(tmp_path, directory, "load", "remove:" + UID_C)
    assert read["version"] == 2 and read["data"] == ours
    assert set(new.load().claims) == {UID_B, UID_X} == set(removed["data"]["claims"])
    # and a rollback's clean stop leaves a file this build reads as well
    [folded] = previous_build(tmp_path, directory, "compact")
    assert folded["version"] == 2
    assert data_of(CheckpointStore(directory, boot_id="boot-1").load()) == folded["data"]


# --- what cannot be read -------------------------------------------------------------------


def test_an_unreadable_checkpoint_is_reported_and_left_as_it_is(tmp_path):
    directory = copied("prev_journal", tmp_path)
    snapshot = directory / "checkpoint.json"
    snapshot.write_bytes(snapshot.read_bytes().replace(b'"trainer"', b'"trainef"'))
    before = {name: (directory / name).read_bytes() for name in names(directory)}
    opened = CheckpointStore(directory, boot_id="boot-1").open()
    assert isinstance(opened, Unreadable)
    assert "checksum mismatch" in str(opened.error) and opened.error.path == snapshot
    assert {name: (directory / name).read_bytes() for name in names(directory)
            if name != "checkpoint.lock"} == before


def test_a_newer_builds_version_is_refused_and_left_as_it_is(tmp_path):
    snapshot = tmp_path / "checkpoint.json"
    snapshot.write_text(json.dumps({"kind": "GpudraCheckpoint", "version": 4, "data": {}}))
    content = snapshot.read_bytes()
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    with pytest.raises(CheckpointVersionUnsupported,
                       match=r"version 4; this gpudra reads versions 1\.\.3"):
        store.open()
    with pytest.raises(CheckpointVersionUnsupported):
        store.save(sample())
    assert snapshot.read_bytes() == content and names(tmp_path) == ["checkpoint.json",
                                                                    "checkpoint.lock"]


def journal_line(payload: bytes) -> bytes:
    """A journal line holding ``payload`` as its record, checksummed as that build did."""
    digest = hashlib.sha256(payload).hexdigest().encode()
    return b'{"checksum":"sha256:' + digest + b'","record":' + payload + b"}\n"


def with_lines(tmp_path: Path, *lines: bytes) -> Path:
    directory = copied("prev_journal", tmp_path)
    (directory / "checkpoint.journal").write_bytes(b"".join(lines))
    return directory


GENERATION = json.loads((FIXTURES / "prev_journal" / "checkpoint.json").read_text())[
    "data"]["journalGeneration"]


def record(seq: int, put: str = "{}", remove: str = "[]") -> bytes:
    return journal_line(f'{{"generation":"{GENERATION}","seq":{seq},"put":{put},'
                        f'"remove":{remove}}}'.encode())


@pytest.mark.parametrize(("lines", "match"), [
    ((b'{"checksum":"sha256:00","record":{}}\n', record(1)),
     "line 1: not an intact journal record, and more follows it"),
    ((record(1), record(3)), "line 2: seq 3 where 2 was due"),
    ((record(1, put=f'{{"{UID_C}":{{"namespace":"ns"}}}}'),),
     rf"record 1\.put\.{UID_C}\.name: missing"),
    ((record(1, remove='"x"'),), r"line 1\.remove: expected a list of strings"),
])
def test_a_journal_that_is_not_a_torn_write_is_corrupt_naming_the_record(tmp_path, lines,
                                                                         match):
    directory = with_lines(tmp_path, *lines)
    store = CheckpointStore(directory, boot_id="boot-1")
    with pytest.raises(CheckpointCorrupt, match=match):
        store.load()
    assert isinstance(store.open(), Unreadable)


def test_fields_from_a_newer_build_in_journal_records_survive_the_rewrite(tmp_path):
    raw = data_of(sample())["claims"][UID_A]
    raw["futureClaimField"] = {"kept": [1, None]}
    directory = with_lines(tmp_path, record(1, put=json.dumps({UID_X: raw})))
    store = CheckpointStore(directory, boot_id="boot-1")
    assert isinstance(store.open(), Opened)
    written = json.loads((directory / "checkpoint.json").read_text())["data"]
    assert written["claims"][UID_X]["futureClaimField"] == {"kept": [1, None]}


def test_claims_of_a_reboot_are_dropped_after_the_rewrite_too(tmp_path):
    directory = copied("prev_journal", tmp_path)
    opened = CheckpointStore(directory, boot_id="boot-2").open()
    assert isinstance(opened, Opened)
    assert opened.result.checkpoint.claims == {}
    assert "node rebooted" in str(opened.result.reset_reason)
    # the file keeps them until start-up's reconciliation commits the reset
    assert CheckpointStore(directory, boot_id="boot-1").load() == expected("prev_journal")[1]


def test_a_version_1_file_is_rewritten_too(tmp_path):
    shutil.copy(FIXTURES / "checkpoint_v1.json", tmp_path / "checkpoint.json")
    opened = CheckpointStore(tmp_path, boot_id="boot-1").open()
    assert isinstance(opened, Opened) and opened.result.migrated_from == 1
    assert json.loads((tmp_path / "checkpoint.json").read_text())["version"] == 2
    assert set(opened.result.checkpoint.completed()) == {UID_A, UID_B}
    assert CheckpointStore(tmp_path, boot_id="boot-1").load() == opened.result.checkpoint
