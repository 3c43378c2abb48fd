"""The compute-domain plugin's checkpoint: which claims it prepared, for which domain.

As the GPU checkpoint: one JSON snapshot replaced atomically (temp, fsync, rename,
directory fsync), two phases per claim — ``started`` is written before any file of the
claim (config directory, CDI spec) is made, ``completed`` after — so a crash in between
leaves a record that an unprepare (or the kubelet's retry of the prepare) finishes.

Two daemon instances share the file during a rolling update (the chart surges the new pod
next to the old one): a change is made under ``compute-domain-checkpoint.lock``'s ``flock``
(:class:`~gpudra.driver.checkpoint_lock.CheckpointLock`) to the file as it is on disk, never
to a copy in memory, so neither instance writes away the other's claims. Readers need no
lock: the path always names a whole file.

A checksum of the claims is written beside them (files of the build before have none and
are read as they are; that build ignores the key). A checkpoint that cannot be read (not
JSON, wrong shape, checksum mismatch) is set aside (renamed, never deleted) and rebuilt, under
the lock, from what survives, the claims' CDI specs (:func:`recovered_from_specs`): each
such claim comes back as ``started``, so the kubelet's retry of its prepare finishes it from
the API server and its unprepare removes its spec and, for a daemon claim, its domain's IMEX
directory (named by the spec's mount). Nothing is deleted on the checkpoint's account.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from gpudra.api.identifiers import check_uid
from gpudra.driver.checkpoint_lock import CheckpointLock
from gpudra.driver.files import DIR_MODE, FILE_MODE, atomic_write, make_dirs

log = structlog.get_logger(__name__)

VERSION = 1
FILE = "compute-domain-checkpoint.json"
LOCK_FILE = "compute-domain-checkpoint.lock"
LOCK_TIMEOUT = 10.0
"""Seconds a change waits for the other instance's (a few file writes at most)."""
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
    """Safe across threads and processes; every change is durable before the method returns.

    ``recover`` rebuilds the records when the file cannot be read (``set_aside`` then names
    where the last unreadable one went); without it such a file is a
    :class:`CheckpointError`. ``CheckpointLockTimeout`` (a :class:`CheckpointError` too)
    when the other instance holds the lock too long.
    """

    def __init__(self, data_dir: Path,
                 recover: Callable[[], dict[str, ClaimEntry]] | None = None, *,
                 lock_timeout: float = LOCK_TIMEOUT) -> None:
        self.path = Path(data_dir) / FILE
        self._recover = recover
        self._lock_timeout = lock_timeout
        self.set_aside: Path | None = None
        make_dirs(self.path.parent, DIR_MODE)
        self._lock = CheckpointLock(self.path.with_name(LOCK_FILE))
        self._cache: tuple[bytes, dict[str, ClaimEntry]] | None = None
        """The bytes last read or written, and their claims: a read of the same bytes
        parses nothing."""
        with self._held():
            self._load()

    def close(self) -> None:
        """Close the lock file."""
        self._lock.close()

    def get(self, uid: str) -> ClaimEntry | None:
        return self._claims().get(uid)

    def all(self) -> dict[str, ClaimEntry]:
        return dict(self._claims())

    def put(self, uid: str, entry: ClaimEntry) -> None:
        with self._held():
            claims = self._load()
            if claims.get(uid) != entry:
                self._write({**claims, uid: entry})

    def remove(self, uid: str) -> None:
        with self._held():
            claims = self._load()
            if uid in claims:
                self._write({k: v for k, v in claims.items() if k != uid})

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the lock across several changes and the files they stand for (re-entrant
        in a thread): the other instance then sees all of them or none."""
        return self._held()

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        hold = self._lock.held(self._lock_timeout)
        try:
            hold.__enter__()
        except OSError as exc:  # the lock file cannot be made: a full or read-only disk
            raise CheckpointError(f"{self._lock.path}: {exc.strerror or exc}") from exc
        try:
            yield
        finally:
            hold.__exit__(None, None, None)

    def _claims(self) -> dict[str, ClaimEntry]:
        """The claims on disk now (a lockless read); an unreadable file is recovered under
        the lock, as at start."""
        try:
            return self._read()
        except CheckpointError:
            if self._recover is None:
                raise
        with self._held():
            return self._load()

    def _load(self) -> dict[str, ClaimEntry]:
        """The claims on disk (under the lock); an unreadable file is set aside and rebuilt
        with ``recover``."""
        try:
            return self._read()
        except CheckpointError as exc:
            if self._recover is None:
                raise
            problem = str(exc)
        aside = self.path.with_name(f"{FILE}.unreadable-{int(time.time())}")
        n = 0
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"{FILE}.unreadable-{int(time.time())}-{n}")
        self.path.replace(aside)
        self.set_aside = aside
        claims = self._recover()
        self._write(claims)
        log.warning("checkpoint unreadable: set aside and rebuilt from the CDI specs",
                    problem=problem, set_aside=str(aside), claims=len(claims))
        return claims

    def _read(self) -> dict[str, ClaimEntry]:
        try:
            content = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot read: {exc}") from exc
        cached = self._cache
        if cached is not None and cached[0] == content:
            return cached[1]
        claims = _decoded(self.path, content)
        self._cache = (content, claims)
        return claims

    def _write(self, claims: dict[str, ClaimEntry]) -> None:
        encoded = {uid: asdict(entry) for uid, entry in sorted(claims.items())}
        body = {"version": VERSION, "checksum": _checksum(encoded), "claims": encoded}
        content = json.dumps(body).encode()
        try:
            atomic_write(self.path, content,
                         tmp=self.path.with_name(f".{FILE}.tmp-{os.getpid()}"), mode=FILE_MODE)
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot write: {exc.strerror or exc}") from exc
        self._cache = (content, dict(claims))


def _checksum(encoded: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(
        json.dumps(encoded, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _decoded(path: Path, content: bytes) -> dict[str, ClaimEntry]:
    """The claims of a file's ``content``; :class:`CheckpointError` naming ``path`` when it
    is not a whole version 1 checkpoint."""
    try:
        raw = json.loads(content)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: cannot read: {str(exc)[:120]}") from exc
    if not isinstance(raw, dict) or raw.get("version") != VERSION \
            or not isinstance(raw.get("claims"), dict):
        raise CheckpointError(f"{path}: not a version {VERSION} checkpoint")
    if "checksum" in raw and raw["checksum"] != _checksum(raw["claims"]):
        raise CheckpointError(f"{path}: checksum mismatch (changed since it was written)")
    claims: dict[str, ClaimEntry] = {}
    try:
        for uid, entry in raw["claims"].items():
            devices = tuple(PreparedEntry(str(d["request"]), str(d["pool"]), str(d["device"]),
                                          tuple(str(i) for i in d["cdi_ids"]))
                            for d in entry["devices"])
            if entry["kind"] not in ("channel", "daemon") \
                    or entry["state"] not in ("started", "completed"):
                raise ValueError(f"claim {uid}: kind {entry['kind']!r}, state {entry['state']!r}")
            claims[check_uid(uid)] = ClaimEntry(
                str(entry["namespace"]), str(entry["name"]), entry["kind"],
                check_uid(entry["domain"], "domain"), entry["state"], devices)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path}: malformed entry: {exc}") from exc
    return claims


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
