"""The previous build's layout, read once to be rewritten as a plain snapshot.

That build kept claim changes in ``checkpoint.journal`` beside a version 3 snapshot whose
``data.journalGeneration`` names the records that complete it. One line per commit::

    {"checksum":"sha256:<hex>","record":{"generation":"<hex>","seq":<n>,"put":{"<uid>":{<claim>}},"remove":["<uid>"]}}

- ``checksum`` is the SHA-256 of the ``record`` value's bytes exactly as they stand in the
  line, so no re-marshalling is needed to verify it;
- records of another generation are left over from a compaction that crashed between
  replacing the snapshot and emptying the journal: skipped;
- ``seq`` counts a generation's records from 1, without gaps;
- ``put`` holds whole claim records in the snapshot's on-disk form, ``remove`` forgotten uids.

Each record was made durable before the next was written, so only the last line can be
torn by a crash: a last line without its newline, or whose checksum fails, is a commit that
never returned and is ignored. A bad line with anything after it is corruption.

Read-only: this build never writes a journal. Remove this module one release after the
snapshot-only store, when no node can still hold that layout.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gpudra.driver.checkpoint_codec import CheckpointCorrupt, decode_claim
from gpudra.driver.checkpoint_model import Checkpoint

JOURNAL_NAME = "checkpoint.journal"

_HEAD = b'{"checksum":"sha256:'
_HEX_LEN = 64
_MIDDLE = b'","record":'
_PAYLOAD_AT = len(_HEAD) + _HEX_LEN + len(_MIDDLE)


def with_journal(cp: Checkpoint, journal: bytes | None, *, generation: str,
                 path: Path) -> Checkpoint:
    """``cp`` (a version 3 snapshot) with the records of ``generation`` in ``journal``
    applied in order; raises ``CheckpointCorrupt`` naming the record and field."""
    latest: dict[str, tuple[int, object] | None] = {}
    seq = 0
    lines = (journal or b"").split(b"\n")
    # The last element is what follows the last newline: empty, or a torn record.
    for number, line in enumerate(lines[:-1]):
        where = f"record on line {number + 1}"
        payload = _payload(line)
        if payload is None:
            if number + 2 < len(lines) or lines[-1]:
                raise CheckpointCorrupt(path, f"{where}: not an intact journal record, and "
                                              "more follows it (not a torn last write)")
            break  # the last line, torn by a crash mid-append: that commit never returned
        record = _record(payload, path, where)
        if record.get("generation") != generation:
            continue
        seq += 1
        stated = record.get("seq")
        if not isinstance(stated, int) or isinstance(stated, bool) or stated != seq:
            raise CheckpointCorrupt(path, f"{where}: seq {stated!r} where {seq} was due")
        put, remove = record.get("put"), record.get("remove")
        if not isinstance(put, dict):
            raise CheckpointCorrupt(path, f"{where}.put: expected an object")
        if not isinstance(remove, list) or not all(isinstance(uid, str) for uid in remove):
            raise CheckpointCorrupt(path, f"{where}.remove: expected a list of strings")
        latest.update({uid: (seq, raw) for uid, raw in put.items()})
        latest.update(dict.fromkeys(remove))
    if not latest:
        return cp
    claims = dict(cp.claims)
    for uid, put_of in latest.items():
        if put_of is None:
            claims.pop(uid, None)
        else:
            number, raw = put_of
            claims[uid] = decode_claim(path, uid, raw, f"record {number}.put.{uid}")
    return cp.model_copy(update={"claims": claims})


def _payload(line: bytes) -> bytes | None:
    """The verified ``record`` bytes of a line, or ``None`` if it is not an intact record."""
    if not line.startswith(_HEAD) or line[_PAYLOAD_AT - len(_MIDDLE):_PAYLOAD_AT] != _MIDDLE \
            or not line.endswith(b"}") or len(line) <= _PAYLOAD_AT + 1:
        return None
    payload = line[_PAYLOAD_AT:-1]
    stated = line[len(_HEAD):len(_HEAD) + _HEX_LEN]
    return payload if hashlib.sha256(payload).hexdigest().encode() == stated else None


def _record(payload: bytes, path: Path, where: str) -> dict[str, object]:
    # The checksum held, so nothing here is a torn write: any problem is corruption.
    try:
        raw = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointCorrupt(path, f"{where}: not valid JSON ({err})") from err
    if not isinstance(raw, dict):
        raise CheckpointCorrupt(path, f"{where}: not a JSON object")
    if not isinstance(raw.get("generation"), str):
        raise CheckpointCorrupt(path, f"{where}.generation: expected a string")
    return raw
