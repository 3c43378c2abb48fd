"""The compute-domain plugin's checkpoint: which claims it prepared, for which domain.

As the GPU checkpoint: one JSON snapshot replaced atomically (temp, fsync, rename,
directory fsync), two phases per claim — ``started`` is written before any file of the
claim (config directory, CDI spec) is made, ``completed`` after — so a crash in between
leaves a record that an unprepare (or the kubelet's retry of the prepare) finishes. A
checkpoint that cannot be read is refused with one line naming the file; nothing is deleted
on its account.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from gpudra.api.identifiers import check_uid
from gpudra.driver.files import DIR_MODE, FILE_MODE, atomic_write, make_dirs

VERSION = 1
FILE = "compute-domain-checkpoint.json"
Kind = Literal["channel", "daemon"]


class CheckpointError(Exception):
    """The checkpoint cannot be read or written; the message names the file."""


@dataclass(frozen=True)
class PreparedEntry:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class ClaimEntry:
    namespace: str
    name: str
    kind: Kind
    domain: str
    state: Literal["started", "completed"]
    devices: tuple[PreparedEntry, ...] = field(default=())


class Checkpoint:
    """Thread-safe; every change is durable before the method returns."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / FILE
        self._lock = threading.Lock()
        make_dirs(self.path.parent, DIR_MODE)
        self._claims = self._read()

    def _read(self) -> dict[str, ClaimEntry]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{self.path}: cannot read: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise CheckpointError(f"{self.path}: not a version {VERSION} checkpoint")
        claims: dict[str, ClaimEntry] = {}
        try:
            for uid, entry in raw["claims"].items():
                devices = tuple(PreparedEntry(d["request"], d["pool"], d["device"],
                                              tuple(d["cdi_ids"])) for d in entry["devices"])
                claims[check_uid(uid)] = ClaimEntry(
                    entry["namespace"], entry["name"], entry["kind"],
                    check_uid(entry["domain"], "domain"), entry["state"], devices)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{self.path}: malformed entry: {exc}") from exc
        return claims

    def _write(self) -> None:
        body = {"version": VERSION,
                "claims": {uid: asdict(entry) for uid, entry in sorted(self._claims.items())}}
        try:
            atomic_write(self.path, json.dumps(body).encode(),
                         tmp=self.path.with_name(f".{FILE}.tmp-{os.getpid()}"), mode=FILE_MODE)
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot write: {exc.strerror or exc}") from exc

    def get(self, uid: str) -> ClaimEntry | None:
        with self._lock:
            return self._claims.get(uid)

    def all(self) -> dict[str, ClaimEntry]:
        with self._lock:
            return dict(self._claims)

    def put(self, uid: str, entry: ClaimEntry) -> None:
        with self._lock:
            old = self._claims.get(uid)
            self._claims[uid] = entry
            try:
                self._write()
            except CheckpointError:
                if old is None:
                    self._claims.pop(uid, None)
                else:
                    self._claims[uid] = old
                raise

    def remove(self, uid: str) -> None:
        with self._lock:
            old = self._claims.pop(uid, None)
            if old is None:
                return
            try:
                self._write()
            except CheckpointError:
                self._claims[uid] = old
                raise
