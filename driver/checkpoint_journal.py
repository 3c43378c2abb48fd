"""``checkpoint.journal``: the claim changes made since the last snapshot, one line per commit.

Each line is one commit (a ``save`` whose only changes were claims)::

    {"checksum":"sha256:<hex>","record":{"generation":"<hex>","seq":<n>,"put":{"<uid>":{<claim>}},"remove":["<uid>"]}}

- ``checksum`` is the SHA-256 of the bytes of the ``record`` value exactly as they stand in
  the line (between ``"record":`` and the closing ``}``), so verifying needs no
  re-marshalling and fields a newer build adds to a claim verify here too;
- ``generation`` names the snapshot the record applies to (its ``journalGeneration``);
  records of another generation are left over from a compaction that crashed between
  writing the snapshot and emptying the journal, and are skipped;
- ``seq`` counts the generation's records from 1, without gaps;
- ``put`` holds whole claim records in the snapshot's on-disk form (the codec's; unknown
  fields kept), replacing any earlier record of the uid; ``remove`` lists forgotten uids.
  Records are states, not operations: replaying one twice changes nothing, and only the
  last put of a uid needs checking by the models.

Ordering: records apply in file order. A writer appends one line with one ``write`` on an
``O_APPEND`` file and ``fdatasync`` before it returns, so every record but the last one was
durable before the next one was written. Only the last line can therefore be torn by a
power cut: a last line without its newline, or whose checksum fails, is a commit that never
returned and is ignored (a lockless reader also sees an append in progress that way). A bad
line followed by anything is not a torn write: the journal is corrupt.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudra.driver.checkpoint_codec import CheckpointCorrupt, decode_claim, encode_claim
from gpudra.driver.checkpoint_model import Checkpoint, ClaimRecord

JOURNAL_NAME = "checkpoint.journal"
MAX_RECORDS = 256
"""A save that would go past this many records (or ``MAX_BYTES``) compacts instead."""
MAX_BYTES = 256 * 1024

_HEAD = b'{"checksum":"sha256:'
_HEX_LEN = 64
_MIDDLE = b'","record":'
_PAYLOAD_AT = len(_HEAD) + _HEX_LEN + len(_MIDDLE)


@dataclass(frozen=True)
class Record:
    """One commit: claims put (whole records, as parsed JSON) and claims removed.

    The claims are checked by the models in :func:`replay`, and only those that survive
    the records after them: a journal of put/remove pairs costs no validation.
    """

    generation: str
    seq: int
    put: Mapping[str, object]
    remove: tuple[str, ...]


@dataclass(frozen=True)
class Scan:
    """What a read of journal bytes found."""

    records: list[Record]
    """The current generation's records, in order."""
    end: int
    """File offset after the last whole, valid line (the next record goes there)."""
    seq: int
    """The last record's ``seq`` (0: none yet)."""
    stale: int
    """Lines of another generation skipped (a compaction that crashed half-way)."""
    tail: int
    """Bytes after ``end``: an append in progress, or a torn one."""


def encode_record(generation: str, seq: int, put: Mapping[str, ClaimRecord],
                  remove: Sequence[str]) -> tuple[bytes, Record]:
    """One journal line (newline included), and the record as a reader will decode it.

    The writer's cache replays the second, so its next read equals a fresh one (a tuple
    in memory is a list on disk).
    """
    encoded = {uid: encode_claim(record) for uid, record in sorted(put.items())}
    claims = ",".join(f"{json.dumps(uid)}:{text}" for uid, text in encoded.items())
    removed = sorted(remove)
    payload = (f'{{"generation":{json.dumps(generation)},"seq":{seq},"put":{{{claims}}},'
               f'"remove":{json.dumps(removed)}}}').encode()
    digest = hashlib.sha256(payload).hexdigest().encode()
    record = Record(generation=generation, seq=seq, remove=tuple(removed),
                    put={uid: json.loads(text) for uid, text in encoded.items()})
    return _HEAD + digest + _MIDDLE + payload + b"}\n", record


class _Unreadable(Exception):
    """A line that is not a whole, intact record: torn if it is the last one."""


def _payload(line: bytes) -> bytes:
    """The verified ``record`` bytes of a line (without its newline)."""
    if not line.startswith(_HEAD) or line[_PAYLOAD_AT - len(_MIDDLE):_PAYLOAD_AT] != _MIDDLE \
            or not line.endswith(b"}") or len(line) <= _PAYLOAD_AT + 1:
        raise _Unreadable("not a journal record")
    payload = line[_PAYLOAD_AT:-1]
    stated = line[len(_HEAD):len(_HEAD) + _HEX_LEN]
    if hashlib.sha256(payload).hexdigest().encode() != stated:
        raise _Unreadable("checksum mismatch")
    return payload


def _decode(payload: bytes, path: Path, where: str, generation: str) -> Record | None:
    """The record, or ``None`` when it belongs to another generation (not validated)."""
    # The checksum held, so nothing below is a torn write: any problem is corruption.
    try:
        raw = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointCorrupt(path, f"{where}: not valid JSON ({err})") from err
    if not isinstance(raw, dict):
        raise CheckpointCorrupt(path, f"{where}: not a JSON object")
    gen, seq, put, remove = (raw.get(k) for k in ("generation", "seq", "put", "remove"))
    if not isinstance(gen, str):
        raise CheckpointCorrupt(path, f"{where}.generation: expected a string")
    if gen != generation:
        return None
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise CheckpointCorrupt(path, f"{where}.seq: expected an integer")
    if not isinstance(put, dict):
        raise CheckpointCorrupt(path, f"{where}.put: expected an object")
    if not isinstance(remove, list) or not all(isinstance(uid, str) for uid in remove):
        raise CheckpointCorrupt(path, f"{where}.remove: expected a list of strings")
    return Record(generation=gen, seq=seq, put=put, remove=tuple(remove))


def scan(data: bytes, *, path: Path, offset: int, generation: str, seq: int) -> Scan:
    """The records of ``generation`` in ``data``, journal bytes read from ``offset``.

    ``seq`` is the last record already applied (0 from the start of the file). Raises
    ``CheckpointCorrupt`` for a bad line with anything after it, or a valid line of the
    wrong shape or out of sequence.
    """
    records: list[Record] = []
    stale = 0
    pos = 0
    while True:
        newline = data.find(b"\n", pos)
        if newline < 0:
            break  # no line, or one without its newline: not there yet, or torn
        where = f"record at byte {offset + pos}"
        try:
            payload = _payload(data[pos:newline])
        except _Unreadable as err:
            if newline + 1 < len(data):
                raise CheckpointCorrupt(
                    path, f"{where}: {err}, and more follows it (not a torn last write)"
                ) from None
            break  # the last line, torn by a crash mid-append: that commit never returned
        record = _decode(payload, path, where, generation)
        pos = newline + 1
        if record is None:
            stale += 1
            continue
        if record.seq != seq + 1:
            raise CheckpointCorrupt(path, f"{where}: seq {record.seq} where {seq + 1} was due")
        seq = record.seq
        records.append(record)
    return Scan(records=records, end=offset + pos, seq=seq, stale=stale, tail=len(data) - pos)


def replay(cp: Checkpoint, records: Sequence[Record], *, path: Path) -> Checkpoint:
    """``cp`` with ``records`` applied in order; raises ``CheckpointCorrupt`` naming the
    claim and field of a claim the models refuse."""
    latest: dict[str, tuple[Record, object] | None] = {}
    for record in records:
        for uid, raw in record.put.items():
            latest[uid] = (record, raw)
        for uid in record.remove:
            latest[uid] = None
    if not latest:
        return cp
    claims = dict(cp.claims)
    for uid, put in latest.items():
        if put is None:
            claims.pop(uid, None)
        else:
            record, raw = put
            claims[uid] = decode_claim(path, uid, raw, f"record {record.seq}.put.{uid}")
    return cp.model_copy(update={"claims": claims})


def claims_diff(old: Checkpoint, new: Checkpoint
                ) -> tuple[dict[str, ClaimRecord], list[str]] | None:
    """Claims ``new`` puts and removes relative to ``old``; ``None`` if more than claims differ."""
    if (old.boot_id != new.boot_id or old.mig_mode_baseline != new.mig_mode_baseline
            or (old.model_extra or {}) != (new.model_extra or {})):
        return None
    before = old.claims
    # Identity first: unchanged records are the very objects a load handed out.
    put = {uid: record for uid, record in new.claims.items()
           if (earlier := before.get(uid)) is not record and earlier != record}
    removed = [uid for uid in before if uid not in new.claims]
    return put, removed
