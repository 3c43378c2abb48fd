"""The compute-domain plugin's checkpoint: which claims it prepared, for which domain.

As the GPU checkpoint: one JSON snapshot replaced atomically (temp, fsync, rename,
directory fsync), two phases per claim — ``started`` is written before any file of the
claim (config directory, CDI spec) is made, ``completed`` after — so a crash in between
leaves a record that an unprepare (or the kubelet's retry of the prepare) finishes. A
checkpoint that cannot be read is set aside (renamed, never deleted) and rebuilt from what
survives, the claims' CDI specs (:func:`recovered_from_specs`): each such claim comes back as
``started``, so the kubelet's retry of its prepare finishes it from the API server and its
unprepare removes its spec and, for a daemon claim, its domain's IMEX directory (named by
the spec's mount). Nothing is deleted on the checkpoint's account.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
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


UNKNOWN_DOMAIN = "00000000-0000-0000-0000-000000000000"
"""A recovered channel claim's domain: its CDI spec does not name it (none is needed to
unprepare it; a retried prepare reads it again)."""


class Checkpoint:
    """Thread-safe; every change is durable before the method returns.

    ``recover`` rebuilds the records when the file cannot be read (``set_aside`` then names
    where the unreadable one went); without it such a file is a :class:`CheckpointError`.
    """

    def __init__(self, data_dir: Path,
                 recover: Callable[[], dict[str, ClaimEntry]] | None = None) -> None:
        self.path = Path(data_dir) / FILE
        self._lock = threading.Lock()
        self.set_aside: Path | None = None
        make_dirs(self.path.parent, DIR_MODE)
        try:
            self._claims = self._read()
        except CheckpointError:
            if recover is None:
                raise
            self.set_aside = self.path.with_name(f"{FILE}.unreadable-{int(time.time())}")
            self.path.replace(self.set_aside)
            self._claims = recover()
            self._write()

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


def recovered_from_specs(cdi_root: Path, driver: str) -> dict[str, ClaimEntry]:
    """Records for the claims whose CDI specs this driver left in ``cdi_root``, each
    ``started`` (see the module docstring); a spec that cannot be read is skipped (the
    kubelet's unprepare of it removes it all the same)."""
    from gpudra.driver import cdi
    from gpudra.driver.compute_domain_devices import parse_device

    found: dict[str, ClaimEntry] = {}
    for uid, path in cdi.list_claim_specs(cdi_root, driver).items():
        try:
            check_uid(uid)
            spec = json.loads(path.read_text())
            kinds, domain = set(), UNKNOWN_DOMAIN
            for device in spec["devices"]:
                parsed = parse_device(str(device["name"]).removeprefix(f"{uid}-"))
                if parsed is None:
                    raise ValueError(f"not our device: {device['name']}")
                kinds.add(parsed[0])
                for mount in device["containerEdits"].get("mounts") or []:
                    domain = check_uid(Path(mount["hostPath"]).name, "domain")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if len(kinds) == 1:
            kind: Kind = "daemon" if kinds == {"daemon"} else "channel"
            found[uid] = ClaimEntry("", "", kind, domain, "started", ())
    return found
