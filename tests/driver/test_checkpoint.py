"""The checkpoint: format and checksum, reboots, crashes, locking, the cache.

The previous build's layout (a journal) and both-way compatibility with it are
``test_checkpoint_upgrade``'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpudra.driver.checkpoint_codec import CheckpointCorrupt, CheckpointVersionUnsupported, encode
from gpudra.driver.checkpoint_lock import CheckpointLockTimeout
from gpudra.driver.checkpoint_model import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    ClaimRecord,
    DeviceRecord,
    MigRecord,
    with_claim,
    with_claim_completed,
    with_claim_started,
    with_mig_mode_baseline,
    without_claim,
)
from gpudra.driver.checkpoint_store import CheckpointStore, Opened, current_boot_id

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]
UID_A = "6f1c7a52-3b0e-4d5e-9a43-0c2f1e9b8d10"
UID_B = "a0d4e2f7-91b3-4c68-b5a2-7e3f0d1c6b29"


def gpu(device="gpu-0", *, admin=False):
    return DeviceRecord(
        request_names=["gpu"],
        pool="node-a",
        device=device,
        cdi_device_ids=[f"k8s.gpu.nvidia.com/claim={UID_A}-{device}"],
        kind="gpu",
        uuid="GPU-0000",
        admin_access=admin,
    )


def mig_device():
    return DeviceRecord(
        request_names=["mig"],
        pool="node-a",
        device="gpu-1-mig-1g10gb-19-3",
        cdi_device_ids=[f"k8s.gpu.nvidia.com/claim={UID_B}-gpu-1-mig-1g10gb-19-3"],
        kind="mig",
        share_id="share-1",
        uuid="MIG-1111",
        parent_uuid="GPU-1111",
        mig=MigRecord(
            parent_uuid="GPU-1111",
            gpu_instance_id=5,
            compute_instance_id=0,
            profile_id=19,
            placement_start=3,
            placement_size=1,
            mig_uuid="MIG-1111",
            created=True,
        ),
    )


def sample(boot_id="boot-1"):
    cp = Checkpoint(boot_id=boot_id, mig_mode_baseline={"GPU-1111": False})
    cp = with_claim_started(cp, ClaimRecord(uid=UID_A, namespace="ml", name="trainer",
                                            state=PREPARE_STARTED, devices=[],
                                            restore={"computeMode": {"GPU-0000": "Default"}},
                                            started_at="2026-01-01T00:00:00Z"))
    cp = with_claim_completed(cp, UID_A, [gpu()])
    cp = with_claim_started(cp, ClaimRecord(uid=UID_B, namespace="default", name="nb",
                                            state=PREPARE_STARTED, devices=[mig_device()]))
    return cp


def canonical_checksum(data):
    # Independent of the module: the documented rule, spelled out.
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_save_and_load_round_trip(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    cp = sample()
    store.save(cp)
    assert store.load() == cp
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    assert (doc["kind"], doc["version"]) == ("GpudraCheckpoint", 2)
    assert doc["checksum"] == canonical_checksum(doc["data"])
    assert "journalGeneration" not in doc["data"]
    assert doc["data"]["claims"][UID_A]["state"] == "PrepareCompleted"
    assert doc["data"]["claims"][UID_B]["devices"][0]["mig"]["gpuInstanceId"] == 5
    assert CheckpointStore(tmp_path, boot_id="boot-1").load() == cp


def test_restore_data_with_non_string_keys_still_verifies(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="b")
    record = ClaimRecord(uid="u", namespace="n", name="c", state=PREPARE_STARTED, devices=[],
                         restore={2: "a", 10: "b"})
    store.save(with_claim_started(Checkpoint(boot_id="b"), record))
    assert store.load().claims["u"].restore.model_extra == {"2": "a", "10": "b"}  # JSON's


def test_missing_file_is_an_empty_checkpoint_of_this_boot(tmp_path):
    result = CheckpointStore(tmp_path / "new", boot_id="boot-9").load_result()
    assert result.checkpoint == Checkpoint(boot_id="boot-9")
    assert result.reset_reason is None and result.migrated_from is None


def test_boot_id_defaults_to_the_kernels():
    assert CheckpointStore(Path("/nonexistent")).boot_id == current_boot_id()
    assert current_boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_restore_is_typed_and_written_as_before(tmp_path):
    record = ClaimRecord(uid="u", namespace="n", name="c", state=PREPARE_STARTED, devices=[],
                         restore={"mps": {"claim": "u", "uuids": ("GPU-1",)},
                                  "timeSlice": {"GPU-1": 0}, "futureKey": [1]})
    assert record.restore.mps is not None and record.restore.mps.uuids == ["GPU-1"]
    assert record.restore.time_slice == {"GPU-1": 0} and record.restore.compute_mode == {}
    store = CheckpointStore(tmp_path, boot_id="b")
    store.save(with_claim_started(Checkpoint(boot_id="b"), record))
    written = json.loads((tmp_path / "checkpoint.json").read_text())["data"]["claims"]["u"]
    # empty fields are left out, as the untyped record had them; unknown keys are kept
    assert written["restore"] == {"timeSlice": {"GPU-1": 0}, "futureKey": [1],
                                  "mps": {"claim": "u", "uuids": ["GPU-1"]}}
    assert CheckpointStore(tmp_path, boot_id="b").load().claims["u"] == record
    with pytest.raises(ValidationError, match="timeSlice"):
        ClaimRecord(uid="u", namespace="n", name="c", state=PREPARE_STARTED, devices=[],
                    restore={"timeSlice": {"GPU-1": "fast"}})


def test_two_phase_transitions_and_queries():
    cp = sample()
    assert set(cp.completed()) == {UID_A}
    assert set(cp.started()) == {UID_B}
    assert cp.claims[UID_A].devices == [gpu()]
    assert without_claim(cp, UID_A).claims.keys() == {UID_B}
    assert without_claim(cp, "unknown") is cp
    with pytest.raises(KeyError, match="never recorded as started"):
        with_claim_completed(cp, "unknown", [])
    # Restarting a claim that had completed puts it back to started.
    again = with_claim_started(cp, cp.claims[UID_A])
    assert again.claims[UID_A].state == PREPARE_STARTED
    assert cp.claims[UID_A].state == PREPARE_COMPLETED  # the original is untouched


def test_mig_mode_baseline_keeps_the_first_value():
    cp = with_mig_mode_baseline(Checkpoint(boot_id="b"), "GPU-1", False)
    assert with_mig_mode_baseline(cp, "GPU-1", True).mig_mode_baseline == {"GPU-1": False}


def test_devices_in_use_excludes_own_claim_and_admin_access():
    cp = sample()
    assert cp.devices_in_use() == {("node-a", "gpu-0"), ("node-a", "gpu-1-mig-1g10gb-19-3")}
    assert cp.devices_in_use(exclude_uid=UID_A) == {("node-a", "gpu-1-mig-1g10gb-19-3")}
    admin = ClaimRecord(uid="admin", namespace="mon", name="dcgm", state=PREPARE_STARTED,
                        devices=[gpu("gpu-7", admin=True)])
    cp = with_claim_completed(with_claim_started(cp, admin), "admin", admin.devices)
    assert ("node-a", "gpu-7") not in cp.devices_in_use(exclude_uid=UID_A)


def test_flipped_byte_is_detected(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    store.save(sample())
    path = tmp_path / "checkpoint.json"
    content = path.read_bytes()
    # Still valid JSON, one character different: only the checksum can tell.
    flipped = content.replace(b'"trainer"', b'"trainef"')
    assert flipped != content
    path.write_bytes(flipped)
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch") as err:
        store.load()
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"kind": "GpudraCheckpoint", "version": 2, "chec', "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"kind": "Other", "version": 2, "checksum": "", "data": {}}', "kind is 'Other'"),
        (b'{"version": "two"}', "unknown version 'two'"),
    ],
)
def test_unparsable_files_are_corrupt(tmp_path, content, reason):
    (tmp_path / "checkpoint.json").write_bytes(content)
    with pytest.raises(CheckpointCorrupt, match=reason):
        CheckpointStore(tmp_path, boot_id="b").load()


def test_wrong_field_type_names_the_field(tmp_path):
    data = json.loads(encode(sample()))["data"]
    data["claims"][UID_B]["devices"][0]["mig"]["gpuInstanceId"] = "5"
    write_raw(tmp_path, data)
    with pytest.raises(CheckpointCorrupt,
                       match=rf"data\.claims\.{UID_B}\.devices\[0\]\.mig\.gpuInstanceId: "
                             "expected an integer, got str"):
        CheckpointStore(tmp_path, boot_id="boot-1").load()


def test_newer_major_version_is_not_treated_as_corrupt(tmp_path):
    # This build writes 2 and reads up to 3 (the previous build's snapshot with a journal);
    # 4 would be the next incompatible one.
    (tmp_path / "checkpoint.json").write_text(json.dumps(
        {"kind": "GpudraCheckpoint", "version": 4, "checksum": "x", "data": {}}))
    with pytest.raises(CheckpointVersionUnsupported,
                       match=r"version 4.*reads versions 1\.\.3.*newer gpudra") as err:
        CheckpointStore(tmp_path, boot_id="b").load()
    assert not isinstance(err.value, CheckpointCorrupt)


def write_raw(directory, data, **envelope):
    # Written the way another build might: compact, its own key order.
    doc = {"data": data, "checksum": canonical_checksum(data), "version": 2,
           "kind": "GpudraCheckpoint", **envelope}
    (directory / "checkpoint.json").write_text(json.dumps(doc, separators=(",", ":")))


def test_fields_from_a_newer_version_verify_load_and_survive_a_rewrite(tmp_path):
    data = json.loads(encode(sample()))["data"]
    data["futureNodeField"] = {"nested": [1, 2.5, None, "x"]}
    # A newer build may also omit fields it considers empty.
    del data["claims"][UID_A]["devices"][0]["shareId"]
    del data["claims"][UID_A]["restore"]
    claim = data["claims"][UID_B]
    claim["futureClaimField"] = "keep me"
    claim["devices"][0]["futureDeviceField"] = True
    claim["devices"][0]["mig"]["futureMigField"] = 7
    write_raw(tmp_path, data, futureEnvelopeField="outside the checksum")

    store = CheckpointStore(tmp_path, boot_id="boot-1")
    cp = store.load()
    assert cp.model_extra == {"futureNodeField": {"nested": [1, 2.5, None, "x"]}}
    assert cp.claims[UID_B].model_extra == {"futureClaimField": "keep me"}
    assert cp.claims[UID_B].devices[0].model_extra == {"futureDeviceField": True}
    assert cp.claims[UID_B].devices[0].mig.model_extra == {"futureMigField": 7}

    # This (older) build changes something unrelated and writes the file back.
    store.update(lambda c: without_claim(with_mig_mode_baseline(c, "GPU-2", True), UID_A))
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    written = doc["data"]
    assert doc["checksum"] == canonical_checksum(written)
    assert written["futureNodeField"] == {"nested": [1, 2.5, None, "x"]}
    assert written["claims"][UID_B]["futureClaimField"] == "keep me"
    assert written["claims"][UID_B]["devices"][0]["futureDeviceField"] is True
    assert written["claims"][UID_B]["devices"][0]["mig"]["futureMigField"] == 7
    assert "futureEnvelopeField" not in doc  # not covered by the checksum, so not trusted
    assert written["migModeBaseline"] == {"GPU-1111": False, "GPU-2": True}


def test_a_file_written_by_the_earlier_build_loads_and_is_rewritten_byte_for_byte(tmp_path):
    # checkpoint_v2.json is sample() as written by the hand-written codec the models replaced.
    content = (FIXTURES / "checkpoint_v2.json").read_bytes()
    (tmp_path / "checkpoint.json").write_bytes(content)
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    assert store.load() == sample()
    assert encode(sample()) == content
    store.save(store.load())
    assert (tmp_path / "checkpoint.json").read_bytes() == content


def test_snake_case_keys_on_disk_are_unknown_fields_not_the_camel_case_ones(tmp_path):
    data = json.loads(encode(sample()))["data"]
    data["claims"][UID_B]["devices"][0]["mig"]["gpu_instance_id"] = 99
    write_raw(tmp_path, data)
    mig = CheckpointStore(tmp_path, boot_id="boot-1").load().claims[UID_B].devices[0].mig
    assert mig.gpu_instance_id == 5 and mig.model_extra == {"gpu_instance_id": 99}


def test_version_1_fixture_migrates_to_version_2(tmp_path):
    shutil.copy(FIXTURES / "checkpoint_v1.json", tmp_path / "checkpoint.json")
    store = CheckpointStore(tmp_path, boot_id="boot-now")
    result = store.load_result()
    assert result.migrated_from == 1 and result.reset_reason is None
    cp = result.checkpoint
    assert cp.boot_id == "boot-now"  # version 1 had none: the current boot is assumed
    assert set(cp.completed()) == {UID_A, UID_B}
    trainer = cp.claims[UID_A]
    assert (trainer.namespace, trainer.name) == ("ml", "trainer-gpu")
    assert [d.device for d in trainer.devices] == ["gpu-0", "gpu-1"]
    assert trainer.devices[0].cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={UID_A}-gpu-0"]
    assert trainer.devices[0].request_names == ["gpu"]
    notebook = cp.claims[UID_B].devices[0]
    assert (notebook.kind, notebook.mig) == ("mig", None)

    store.save(cp)  # changes nothing, yet rewrites the file in the current format
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    assert doc["version"] == 2
    assert store.load_result().migrated_from is None
    assert store.load() == cp


def test_version_1_with_a_bad_checksum_is_corrupt(tmp_path):
    doc = json.loads((FIXTURES / "checkpoint_v1.json").read_text())
    doc["preparedClaims"][UID_A]["name"] = "tampered"
    (tmp_path / "checkpoint.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch"):
        CheckpointStore(tmp_path, boot_id="b").load()


def test_reboot_drops_claims_and_keeps_mig_mode_baselines(tmp_path):
    CheckpointStore(tmp_path, boot_id="boot-1").save(sample())
    store = CheckpointStore(tmp_path, boot_id="boot-2")
    result = store.load_result()
    assert result.checkpoint == Checkpoint(boot_id="boot-2",
                                           mig_mode_baseline={"GPU-1111": False})
    assert "rebooted" in result.reset_reason and "dropped 2 claim(s)" in result.reset_reason
    # The first save after the reboot makes it stick.
    store.save(result.checkpoint)
    assert store.load_result().reset_reason is None


def test_quarantine_moves_the_file_aside(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="b")
    assert store.quarantine() is None
    (tmp_path / "checkpoint.json").write_text("garbage")
    first = store.quarantine()
    (tmp_path / "checkpoint.json").write_text("more garbage")
    second = store.quarantine()
    assert first.name.startswith("checkpoint.json.corrupt-") and first.read_text() == "garbage"
    assert second != first and second.read_text() == "more garbage"
    assert store.load() == Checkpoint(boot_id="b")


def test_a_save_that_fails_midway_keeps_the_old_file(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    store.save(sample())

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        store.save(Checkpoint(boot_id="boot-1"))
    monkeypatch.undo()
    assert store.load() == sample()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json", "checkpoint.lock"]


def test_stale_temp_files_of_crashed_writers_are_removed_at_open(tmp_path):
    CheckpointStore(tmp_path, boot_id="b").save(sample("b"))
    (tmp_path / "checkpoint.json.tmp-99999").write_text('{"partial')
    assert isinstance(CheckpointStore(tmp_path, boot_id="b").open(), Opened)
    assert not list(tmp_path.glob("checkpoint.json.tmp-*"))


CRASHER = textwrap.dedent("""
    import json, os, random, signal, sys, time
    from pathlib import Path
    from gpudra.driver.checkpoint_model import *
    from gpudra.driver.checkpoint_store import CheckpointStore

    directory, min_rounds = Path(sys.argv[1]), int(sys.argv[2])

    def record(j, generation):
        return ClaimRecord(
            uid=f"uid-{j:03d}", namespace="ns", name=f"claim-{j}", state=PREPARE_COMPLETED,
            devices=[DeviceRecord(request_names=["gpu"], pool="node", device=f"gpu-{j}",
                                  cdi_device_ids=[f"k8s/claim=uid-{j}"], kind="gpu")],
            restore={"generation": generation})

    CLAIMS = {f"uid-{j:03d}": record(j, 0) for j in range(150)}

    def big(generation):
        # One claim changes per save, as in the daemon: the encoder's cache makes the rest
        # cheap, so most of a save is the file's write, sync and rename (where kills matter)
        j = generation % 150
        claims = {**CLAIMS, f"uid-{j:03d}": record(j, generation)}
        return Checkpoint(boot_id="boot", claims=claims, generation=generation)

    store = CheckpointStore(directory, boot_id="boot")
    store.save(big(0))
    rng = random.Random(1)
    last = torn = done = 0
    # At least min_rounds kills, and more until one of them landed mid-save.
    while done < min_rounds or (not torn and done < 3 * min_rounds):
        done += 1
        saved, told = os.pipe()
        pid = os.fork()
        if pid == 0:  # the writer: save newer generations until killed
            try:
                writer = CheckpointStore(directory, boot_id="boot")
                generation = last + 1
                while True:
                    writer.save(big(generation))
                    os.write(told, b".")
                    generation += 1
            finally:
                os._exit(1)
        os.close(told)
        os.read(saved, 1)  # one save done: kill it somewhere in a later one
        time.sleep(rng.uniform(0.0, 0.03))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(saved)
        assert os.WIFSIGNALED(status), "the writer failed"
        torn += bool(list(directory.glob("checkpoint.json.tmp-*")))
        cp = store.load()  # raises if the kill left a partial file
        assert len(cp.claims) == 150 and cp.model_extra["generation"] >= last
        last = cp.model_extra["generation"]
    print(json.dumps({"rounds": done, "torn": torn, "last": last}))
""")


def test_sigkill_during_saves_never_leaves_a_partial_file(tmp_path):
    # A supervisor process forks writers and SIGKILLs them at random moments; after each
    # kill the file must load. Forking there keeps each round cheap and pytest fork-free.
    proc = subprocess.run([sys.executable, "-c", CRASHER, str(tmp_path), "30"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout)
    assert outcome["rounds"] >= 30
    assert outcome["last"] >= outcome["rounds"]  # every writer saved before its kill
    assert outcome["torn"] > 0  # some kills landed mid-save (a temp file was left behind)
    store = CheckpointStore(tmp_path, boot_id="boot")
    assert store.load().model_extra["generation"] == outcome["last"]


CONTENDER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from gpudra.driver.checkpoint_store import CheckpointStore

    directory, rounds = Path(sys.argv[1]), int(sys.argv[2])
    counter, log = directory / "counter", directory / "log"
    store = CheckpointStore(directory, boot_id="boot")
    for _ in range(rounds):
        with store.locked(), store.locked():  # nested: re-entrant
            with log.open("a") as f:
                f.write(f"enter {os.getpid()}\\n")
            value = int(counter.read_text())
            os.sched_yield()  # widen the read-modify-write window
            counter.write_text(str(value + 1))
            with log.open("a") as f:
                f.write(f"exit {os.getpid()}\\n")
""")


def test_two_processes_never_interleave_under_the_lock(tmp_path):
    rounds = 150
    (tmp_path / "counter").write_text("0")
    procs = [subprocess.Popen([sys.executable, "-c", CONTENDER, str(tmp_path), str(rounds)],
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    assert int((tmp_path / "counter").read_text()) == 2 * rounds
    pairs = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    assert len(pairs) == 2 * 2 * rounds
    # Every enter is followed by the same process's exit: no critical sections overlap.
    for (enter, pid_in), (exit_, pid_out) in zip(pairs[0::2], pairs[1::2], strict=True):
        assert (enter, exit_, pid_in) == ("enter", "exit", pid_out)
    assert len({pid for _, pid in pairs[0::2]}) == 2


def test_update_is_an_atomic_read_modify_write_across_store_objects(tmp_path):
    def bump(cp):
        return cp.model_copy(update={"n": (cp.model_extra or {}).get("n", 0) + 1})

    def worker():
        store = CheckpointStore(tmp_path, boot_id="b")
        for _ in range(15):
            store.update(bump)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert CheckpointStore(tmp_path, boot_id="b").load().model_extra == {"n": 45}


def test_lock_is_reentrant_in_one_thread_and_exclusive_across_threads(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="b")
    errors = []

    def other_thread():
        try:
            with store.locked(timeout=0.05):
                pass
        except CheckpointLockTimeout as err:
            errors.append(str(err))

    with store.locked(), store.locked():
        store.save(sample("b"))  # save takes the lock again
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert len(errors) == 1 and "another thread" in errors[0]
    with store.locked(timeout=0.05):  # released after the outermost exit
        pass


def test_lock_timeout_names_the_lock_and_its_holder(tmp_path):
    holder = CheckpointStore(tmp_path, boot_id="b")
    waiter = CheckpointStore(tmp_path, boot_id="b")
    with holder.locked(), pytest.raises(CheckpointLockTimeout) as err, waiter.locked(timeout=0.1):
        pass
    message = str(err.value)
    assert str(tmp_path / "checkpoint.lock") in message
    assert f"held by pid {os.getpid()}" in message and "0.1s" in message
    with waiter.locked(timeout=0.1):
        pass


def test_a_read_of_unchanged_bytes_is_served_from_the_cache(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    store.save(sample())
    first = store.load()
    assert store.load() is first  # parsed once, not per read


def test_the_cache_sees_every_write_of_another_store(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    other = CheckpointStore(tmp_path, boot_id="boot-1")  # another daemon instance
    store.save(sample())
    assert set(store.load().claims) == {UID_A, UID_B}
    other.update(lambda cp: without_claim(cp, UID_B))
    assert set(store.load().claims) == {UID_A}
    other.update(lambda cp: with_mig_mode_baseline(cp, "GPU-9", True))
    assert store.load().mig_mode_baseline == {"GPU-1111": False, "GPU-9": True}
    # Keyed on the content: a rewrite in place of the same size with its mtime put back
    # (another program, within one clock tick) is seen at the next read.
    path = tmp_path / "checkpoint.json"
    before = path.stat()
    path.write_bytes(path.read_bytes().replace(b'"trainer"', b'"trainef"'))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch"):
        store.load()


def test_a_save_of_what_the_file_holds_writes_nothing(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    store.save(sample())
    stat = (tmp_path / "checkpoint.json").stat()
    replaced: list[object] = []
    monkeypatch.setattr(os, "replace", lambda *args: replaced.append(args))
    store.save(store.load())
    CheckpointStore(tmp_path, boot_id="boot-1").save(sample())
    assert replaced == []
    assert os.path.samestat((tmp_path / "checkpoint.json").stat(), stat)


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from gpudra.driver.checkpoint_model import with_claim, without_claim
    from gpudra.driver.checkpoint_store import CheckpointStore
    from tests.driver.test_checkpoint import numbered

    directory, first, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = CheckpointStore(directory, boot_id="boot")
    for n in range(first, first + count):
        store.update(lambda cp: with_claim(cp, numbered(n)))
        if n % 3 == 0:
            store.update(lambda cp: without_claim(cp, f"uid-{n - 1:04d}"))
""")


def numbered(n: int) -> ClaimRecord:
    uid = f"uid-{n:04d}"
    return ClaimRecord(uid=uid, namespace="ns", name=f"claim-{n}", state=PREPARE_COMPLETED,
                       devices=[gpu(f"gpu-{n % 8}")])


def test_two_processes_committing_at_once_lose_nothing(tmp_path):
    CheckpointStore(tmp_path, boot_id="boot").save(Checkpoint(boot_id="boot"))
    count = 60
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(first),
                               str(count)], env=env, cwd=ROOT, stderr=subprocess.PIPE,
                              text=True) for first in (1000, 5000)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    expected = {f"uid-{n:04d}" for first in (1000, 5000) for n in range(first, first + count)
                if (n + 1) % 3 != 0 or n + 1 >= first + count}
    assert set(CheckpointStore(tmp_path, boot_id="boot").load().claims) == expected


def test_a_reader_without_the_lock_never_sees_a_half_commit(tmp_path):
    writer = CheckpointStore(tmp_path, boot_id="boot")
    reader = CheckpointStore(tmp_path, boot_id="boot")
    writer.save(Checkpoint(boot_id="boot"))
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
        for n in range(150):
            writer.update(lambda cp, n=n: with_claim(cp, numbered(n)))
    finally:
        done.set()
        thread.join()
    assert not errors, errors
    assert seen == sorted(seen) and len(reader.load().claims) == 150


def test_the_lock_file_is_reopened_when_it_was_removed(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    with store.locked(timeout=1):
        pass
    (tmp_path / "checkpoint.lock").unlink()
    other = CheckpointStore(tmp_path, boot_id="boot-1")
    # both lock the file that is there now, so they still exclude each other
    with store.locked(timeout=1), pytest.raises(CheckpointLockTimeout), \
            other.locked(timeout=0.05):
        pass
    store.close()
    other.close()
