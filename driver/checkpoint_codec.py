"""The checkpoint file format: bytes ↔ :class:`~gpudra.driver.checkpoint_model.Checkpoint`.

One JSON document::

    {"kind": "GpudraCheckpoint", "version": 2, "checksum": "sha256:<hex>", "data": {...}}

Rules that keep upgrades and downgrades safe (NVIDIA's driver crash-looped on upgrade
because it checksummed a re-marshalled typed model, issue #1080):

- the checksum covers the canonical JSON of ``data`` exactly as read from disk, so fields
  added by a newer build still verify here;
- unknown fields are kept in each record and written back (the models allow extras), so a
  downgrade → upgrade round trip loses nothing;
- ``version`` changes only for an incompatible layout; adding a field never bumps it.

Versions read: 1 (the pre-two-phase layout, migrated on load), 2 (what this build writes),
and 3, the previous build's snapshot whose ``data.journalGeneration`` names the journal
records that complete it (:mod:`gpudra.driver.checkpoint_upgrade` reads them). Anything
newer is refused (``CheckpointVersionUnsupported``), never treated as corrupt.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from gpudra.driver.checkpoint_model import PREPARE_COMPLETED, Checkpoint, ClaimRecord
from gpudra.driver.mig import parse_device_name
from gpudra.driver.shown import shown

KIND = "GpudraCheckpoint"
VERSION = 2
"""The plain snapshot, everything in one file: what this build writes."""
JOURNAL_VERSION = 3
"""The previous build's snapshot, completed by the records of its journal generation."""
NEWEST = JOURNAL_VERSION
JOURNAL_KEY = "journalGeneration"


class CheckpointError(Exception):
    """Base of the checkpoint errors."""


class CheckpointCorrupt(CheckpointError):
    """The file cannot be trusted: unparsable, wrong shape, or checksum mismatch."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint {path} is corrupt: {reason}")
        self.path = path
        self.reason = reason


class CheckpointVersionUnsupported(CheckpointError):
    """Written by a newer gpudra with an incompatible layout.

    Deliberately not ``CheckpointCorrupt``: quarantining a newer build's valid state and
    starting empty would let startup reconciliation destroy MIG devices in use.
    """

    def __init__(self, path: Path, version: object) -> None:
        super().__init__(
            f"checkpoint {path} has version {shown(version)}; this gpudra reads versions "
            f"1..{NEWEST}."
            " It was written by a newer gpudra: roll forward, or move the file aside to start empty"
        )
        self.path = path
        self.version = version


def checksum(data: object) -> str:
    """``sha256:<hex>`` of the canonical JSON of a raw (already parsed) JSON value."""
    return "sha256:" + hashlib.sha256(_canonical(data).encode()).hexdigest()


class Snapshot(NamedTuple):
    """A decoded checkpoint file."""

    checkpoint: Checkpoint
    version: int
    generation: str | None
    """The journal generation that completes it (the previous build's version 3), else
    ``None``."""


FILE_HINT = "checkpoint.json"
"""Only named in errors of a record that does not survive its own round trip (a bug)."""


def encode(cp: Checkpoint) -> bytes:
    """The checkpoint as a version 2 file."""
    return encode_as_read(cp, path=Path(FILE_HINT))[0]


class _Encoded(NamedTuple):
    record: ClaimRecord
    """Held, as ``as_read`` is, so that neither ``id`` is reused while the entry lives."""
    plain: str
    """``"<uid>":<record>`` as written: the models' key order (the layout earlier builds
    wrote, byte for byte)."""
    canonical: str
    """``"<uid>":<record>`` as checksummed: sorted keys."""
    as_read: ClaimRecord


class RecordCache:
    """Each claim record's JSON texts and as-read record, by record object.

    Records are immutable and a save changes one or two of them, so a save encodes and
    re-reads only those: the rest of the file is text already made. A record and the
    record a reader decodes from its text (what the store's next load returns, and so what
    the next save is given) share one entry. Safe across threads: a save swaps in the
    entries of the records it wrote; entries are never changed.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[int, str], _Encoded] = {}

    def encoded(self, uid: str, record: ClaimRecord, path: Path) -> _Encoded:
        entry = self._entries.get((id(record), uid))
        if entry is not None and (entry.record is record or entry.as_read is record):
            return entry
        raw = json.loads(record.model_dump_json())
        key = json.dumps(uid)
        return _Encoded(record, f"{key}:{_compact(raw)}", f"{key}:{_canonical(raw)}",
                        decode_claim(path, uid, raw, f"data.claims.{uid}"))

    def keep(self, entries: dict[str, _Encoded]) -> None:
        """Keep the entries of one save's records (``uid`` → entry), and forget the rest."""
        kept: dict[tuple[int, str], _Encoded] = {}
        for uid, entry in entries.items():
            kept[(id(entry.record), uid)] = kept[(id(entry.as_read), uid)] = entry
        self._entries = kept


def encode_as_read(cp: Checkpoint, *, path: Path,
                   cache: RecordCache | None = None) -> tuple[bytes, Checkpoint]:
    """The version 2 file, and the checkpoint a reader decodes from it (values as JSON has
    them: lists where ``cp`` may hold tuples), without parsing the file again.

    Records found in ``cache`` are not encoded again.
    """
    cache = cache if cache is not None else RecordCache()
    # Checksum what a reader will parse, not an in-memory dict: integer keys become
    # strings on disk and would then sort differently.
    rest = json.loads(cp.model_copy(update={"claims": {}}).model_dump_json())
    if JOURNAL_KEY in rest:  # would make the previous build look for a journal
        raise ValueError(f"{JOURNAL_KEY!r} is reserved, not a checkpoint field")
    entries = {uid: cache.encoded(uid, record, path)
               for uid, record in sorted(cp.claims.items())}
    cache.keep(entries)
    digest = "sha256:" + hashlib.sha256(
        _assembled(rest, entries, canonical=True).encode()).hexdigest()
    head = json.dumps({"kind": KIND, "version": VERSION, "checksum": digest},
                      separators=(",", ":"))
    data_text = _assembled(rest, entries, canonical=False)
    content = f'{head[:-1]},"data":{data_text}}}\n'.encode()
    top = _validate(path, {**rest, "claims": {}}, "data")
    as_read = top.model_copy(update={"claims": {
        uid: entry.as_read for uid, entry in entries.items()}})
    return content, as_read


def _assembled(rest: dict[str, Any], entries: dict[str, _Encoded], *,
               canonical: bool) -> str:
    """``data``'s JSON text from its non-claim fields and the claims' encoded texts."""
    claims = "{" + ",".join(
        entry.canonical if canonical else entry.plain for entry in entries.values()) + "}"
    encode_value = _canonical if canonical else _compact
    keys = sorted(rest) if canonical else list(rest)
    return "{" + ",".join(
        f"{json.dumps(key)}:{claims if key == 'claims' else encode_value(rest[key])}"
        for key in keys) + "}"


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _canonical(value: object) -> str:
    """The text :func:`checksum` hashes for ``value``."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def decode_snapshot(content: bytes, *, path: Path, boot_id: str) -> Snapshot:
    """Parse and verify a checkpoint file: the checkpoint, its version and, for the
    previous build's version 3, the journal generation that completes it (not read here).

    ``boot_id`` is only used to fill in version 1 files, which did not record one.
    """
    try:
        doc = json.loads(content)
    except (ValueError, RecursionError) as err:  # bad UTF-8 or JSON, a 5000-digit number,
        # or nesting deeper than the parser goes: all corrupt, none a traceback
        raise CheckpointCorrupt(path, f"not valid JSON ({str(err)[:120]})") from err
    if not isinstance(doc, dict):
        raise CheckpointCorrupt(path, "top level is not a JSON object")
    version = doc.get("version")
    if version == VERSION:
        return Snapshot(_decode_v2(doc, path), VERSION, None)
    if version == JOURNAL_VERSION:
        cp, generation = _decode_v3(doc, path)
        return Snapshot(cp, JOURNAL_VERSION, generation)
    if version == 1:
        return Snapshot(_decode_v1(doc, path, boot_id), 1, None)
    if isinstance(version, int) and not isinstance(version, bool) and version > NEWEST:
        raise CheckpointVersionUnsupported(path, version)
    raise CheckpointCorrupt(path, f"unknown version {shown(version)}")


def decode_claim(path: Path, uid: str, raw: object, where: str) -> ClaimRecord:
    """A claim record in its on-disk form (as the snapshot holds it under
    ``data.claims.<uid>``), checked."""
    if not isinstance(raw, dict):
        raise CheckpointCorrupt(path, f"{where}: expected an object, got {type(raw).__name__}")
    try:
        return ClaimRecord.model_validate({**raw, "uid": uid}, by_alias=True, by_name=False)
    except ValidationError as err:
        raise CheckpointCorrupt(path, _problems(err, where, v1=False)) from err


def _verify(path: Path, stated: object, data: object) -> None:
    actual = checksum(data)
    if stated != actual:
        raise CheckpointCorrupt(
            path, f"checksum mismatch: file says {stated!r}, content is {actual}"
        )


def _decode_v2(doc: dict[str, Any], path: Path) -> Checkpoint:
    # Envelope keys other than these are ignored: they are outside the checksum.
    if doc.get("kind") != KIND:
        raise CheckpointCorrupt(path, f"kind is {doc.get('kind')!r}, expected {KIND!r}")
    if "data" not in doc:
        raise CheckpointCorrupt(path, "no 'data' object")
    _verify(path, doc.get("checksum"), doc["data"])
    return _validate(path, doc["data"], "data")


def _decode_v3(doc: dict[str, Any], path: Path) -> tuple[Checkpoint, str]:
    """Version 2's layout plus ``data.journalGeneration`` (covered by the checksum)."""
    if doc.get("kind") != KIND:
        raise CheckpointCorrupt(path, f"kind is {doc.get('kind')!r}, expected {KIND!r}")
    data = doc.get("data")
    if not isinstance(data, dict):
        raise CheckpointCorrupt(path, "no 'data' object")
    _verify(path, doc.get("checksum"), data)
    generation = data.get(JOURNAL_KEY)
    if not isinstance(generation, str) or not generation:
        raise CheckpointCorrupt(path, f"data.{JOURNAL_KEY}: expected a non-empty string")
    return _validate(path, {k: v for k, v in data.items() if k != JOURNAL_KEY}, "data"), generation


def _decode_v1(doc: dict[str, Any], path: Path, boot_id: str) -> Checkpoint:
    """Version 1: completed claims only, no boot id, no hardware details.

    ``{"version": 1, "checksum": "sha256:<canonical JSON of the document without
    'checksum'>", "preparedClaims": {uid: {"namespace", "name", "devices": [{"pool",
    "device", "cdiDeviceIds", "requestNames"}]}}}``. It predates dynamic MIG, so MIG
    devices carry no ``MigRecord`` (gpudra did not create them and will not destroy them).
    It recorded no boot id; like NVIDIA's legacy migration, the current one is assumed.
    The version 2 data is built from it as raw JSON, so the same models check its shape
    and keep its unknown fields.
    """
    _verify(path, doc.get("checksum"), {k: v for k, v in doc.items() if k != "checksum"})
    claims = doc.get("preparedClaims", {})
    if not isinstance(claims, dict):
        raise CheckpointCorrupt(path, "preparedClaims: expected an object")
    data: dict[str, Any] = {"nodeBootId": boot_id, "claims": {
        uid: _v1_claim(raw) for uid, raw in claims.items()}}
    return _validate(path, data, "preparedClaims", v1=True)


def _v1_claim(raw: object) -> object:
    if not isinstance(raw, dict) or not isinstance(raw.get("devices"), list):
        return raw  # left for the model to name what is wrong
    devices = [
        {**device, "kind": "mig" if parse_device_name(str(device.get("device"))) else "gpu"}
        if isinstance(device, dict) else device
        for device in raw["devices"]
    ]
    return {**raw, "state": PREPARE_COMPLETED, "devices": devices}


def _validate(path: Path, data: object, where: str, *, v1: bool = False) -> Checkpoint:
    try:
        # By the on-disk names only: a snake_case key is somebody else's unknown field.
        return Checkpoint.model_validate(data, by_alias=True, by_name=False)
    except ValidationError as err:
        raise CheckpointCorrupt(path, _problems(err, where, v1=v1)) from err


_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "bool_type": "a boolean",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _problems(err: ValidationError, where: str, *, v1: bool) -> str:
    """``data.claims.<uid>.devices[0].kind: expected ...`` for each problem."""
    problems = []
    for error in err.errors(include_url=False):
        loc = list(error["loc"])
        if v1 and loc[:1] == ["claims"]:
            loc = loc[1:]  # v1 claims sit at the top, under ``preparedClaims``
        path = where + "".join(f"[{part}]" if isinstance(part, int) else f".{part}"
                               for part in loc)
        value = error.get("input")
        if error["type"] == "missing":
            message = "missing"
        elif error["type"] in _EXPECTED:
            message = f"expected {_EXPECTED[error['type']]}, got {type(value).__name__}"
        else:
            message = f"{error['msg']}, got {value!r}"
        problems.append(f"{path}: {message}")
    return "; ".join(problems)

