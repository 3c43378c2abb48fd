"""The checkpoint encoder re-encodes only the claim records a save changed.

A cached record's text must never outlive the record: each case checks the file a warm
cache writes against the file a cold encoder writes and against what a reader decodes.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpudra.driver.checkpoint_codec import RecordCache, decode_snapshot, encode, encode_as_read
from gpudra.driver.checkpoint_model import (
    Checkpoint,
    ClaimRecord,
    with_claim,
    with_claim_completed,
    with_mig_mode_baseline,
    without_claim,
)
from gpudra.driver.checkpoint_store import CheckpointStore
from tests.driver.test_checkpoint import UID_A, UID_B, canonical_checksum, gpu, sample

PATH = Path("checkpoint.json")
UID_C = "0b8e4f5a-6c1d-4e2f-8a9b-3c4d5e6f7a8b"


def _steps() -> list[Checkpoint]:
    """A run of checkpoints as a daemon makes them: each one change from the one before."""
    cp0 = sample()
    cp1 = with_claim_completed(cp0, UID_B, list(cp0.claims[UID_B].devices))
    cp2 = with_claim(cp1, ClaimRecord(uid=UID_C, namespace="ml", name="c", state="PrepareStarted",
                                      devices=[gpu("gpu-3")],
                                      restore={"timeSlice": {"GPU-3": 2}}))
    cp3 = with_mig_mode_baseline(cp2, "GPU-3", True)
    cp4 = without_claim(cp3, UID_A)
    # The same record object under a second uid is a second claim, not a cache hit.
    cp5 = cp4.model_copy(update={"claims": {**cp4.claims, UID_A: cp4.claims[UID_C]}})
    return [cp0, cp1, cp2, cp3, cp4, cp5]


def test_a_warm_cache_writes_what_a_cold_encoder_writes():
    cache = RecordCache()
    for cp in _steps():
        warm, warm_read = encode_as_read(cp, path=PATH, cache=cache)
        cold, cold_read = encode_as_read(cp, path=PATH)
        assert warm == cold
        assert warm_read == cold_read


def test_what_is_written_is_what_a_reader_decodes():
    cache = RecordCache()
    for cp in _steps():
        content, as_read = encode_as_read(cp, path=PATH, cache=cache)
        doc = json.loads(content)
        assert doc["checksum"] == canonical_checksum(doc["data"])
        # The pydantic dump is the reference for the data's content and key order.
        assert list(doc["data"]) == list(json.loads(cp.model_dump_json()))
        assert doc["data"] == json.loads(cp.model_dump_json())
        assert decode_snapshot(content, path=PATH, boot_id=cp.boot_id).checkpoint == as_read


def test_a_changed_record_is_encoded_again():
    cache = RecordCache()
    cp = sample()
    encode_as_read(cp, path=PATH, cache=cache)
    changed = cp.model_copy(update={"claims": {
        **cp.claims, UID_A: cp.claims[UID_A].model_copy(update={"name": "renamed"})}})
    content, as_read = encode_as_read(changed, path=PATH, cache=cache)
    assert json.loads(content)["data"]["claims"][UID_A]["name"] == "renamed"
    assert as_read.claims[UID_A].name == "renamed"
    assert encode(changed) == content


def test_store_saves_through_the_cache_and_reads_back(tmp_path):
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    for cp in _steps():
        store.save(cp)
        assert store.load() == CheckpointStore(tmp_path, boot_id="boot-1").load()
        assert (tmp_path / "checkpoint.json").read_bytes() == encode(cp)


def test_the_record_a_load_returns_is_not_encoded_again():
    # What the store's next load returns is the as-read checkpoint, and that is what the
    # next save is given: its records must hit the cache (a miss decodes new objects).
    cache = RecordCache()
    _, as_read = encode_as_read(sample(), path=PATH, cache=cache)
    _, again = encode_as_read(as_read, path=PATH, cache=cache)
    assert all(again.claims[uid] is record for uid, record in as_read.claims.items())
    fresh = RecordCache()
    _, cold = encode_as_read(as_read, path=PATH, cache=fresh)
    assert all(cold.claims[uid] is not record for uid, record in as_read.claims.items())
