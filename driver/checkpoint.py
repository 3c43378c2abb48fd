"""The node's source of truth: which claims are prepared here and what to undo for each.

One JSON file, ``<plugin data dir>/checkpoint.json``::

    {"kind": "GpudraCheckpoint", "version": 2, "checksum": "sha256:<hex>", "data": {...}}

Rules that keep upgrades and downgrades safe (NVIDIA's driver crash-looped on upgrade
because it checksummed a re-marshalled typed model, issue #1080):

- the checksum covers the canonical JSON of ``data`` exactly as read from disk, so fields
  added by a newer build still verify here;
- unknown fields are kept in each record's ``extra`` and written back, so a
  downgrade → upgrade round trip loses nothing;
- ``version`` changes only for an incompatible layout; adding a field never bumps it.
  Version 1 (the pre-two-phase layout) is migrated on load.

Writes are atomic and durable (temp file, fsync, rename, directory fsync), and a
``flock`` on ``checkpoint.lock`` keeps two daemon instances (rolling update) apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from gpudra.driver.flock import wait_for_flock
from gpudra.driver.metrics import CHECKPOINT_WRITE_SECONDS
from gpudra.driver.mig import parse_device_name

KIND = "GpudraCheckpoint"
VERSION = 2
FILE_NAME = "checkpoint.json"
LOCK_NAME = "checkpoint.lock"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_POLL_SECONDS = 0.02

ClaimState = Literal["PrepareStarted", "PrepareCompleted"]
PREPARE_STARTED: ClaimState = "PrepareStarted"
PREPARE_COMPLETED: ClaimState = "PrepareCompleted"
DeviceKind = Literal["gpu", "mig"]


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
            f"checkpoint {path} has version {version!r}; this gpudra reads versions 1..{VERSION}."
            " It was written by a newer gpudra: roll forward, or move the file aside to start empty"
        )
        self.path = path
        self.version = version


class CheckpointLockTimeout(CheckpointError):
    """Another process (or thread) held the checkpoint lock for longer than the timeout."""


# --- records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MigRecord:
    """A MIG device prepared for a claim; ``created`` means we made it, so we destroy it."""

    parent_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile_id: int
    placement_start: int
    placement_size: int
    mig_uuid: str | None = None
    created: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "parentUuid": self.parent_uuid,
            "gpuInstanceId": self.gpu_instance_id,
            "computeInstanceId": self.compute_instance_id,
            "profileId": self.profile_id,
            "placementStart": self.placement_start,
            "placementSize": self.placement_size,
            "migUuid": self.mig_uuid,
            "created": self.created,
        }

    @classmethod
    def from_json(cls, raw: object, where: str) -> MigRecord:
        r = _Reader(raw, where)
        return cls(
            parent_uuid=r.text("parentUuid"),
            gpu_instance_id=r.integer("gpuInstanceId"),
            compute_instance_id=r.integer("computeInstanceId"),
            profile_id=r.integer("profileId"),
            placement_start=r.integer("placementStart"),
            placement_size=r.integer("placementSize"),
            mig_uuid=r.optional_text("migUuid"),
            created=r.flag("created", default=False),
            extra=r.unknown(),
        )


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as returned to the kubelet, plus what identifies it."""

    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]
    kind: DeviceKind = "gpu"
    share_id: str | None = None
    uuid: str | None = None
    parent_uuid: str | None = None
    mig: MigRecord | None = None
    admin_access: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "requestNames": list(self.request_names),
            "pool": self.pool,
            "device": self.device,
            "cdiDeviceIds": list(self.cdi_device_ids),
            "kind": self.kind,
            "shareId": self.share_id,
            "uuid": self.uuid,
            "parentUuid": self.parent_uuid,
            "mig": None if self.mig is None else self.mig.to_json(),
            "adminAccess": self.admin_access,
        }

    @classmethod
    def from_json(cls, raw: object, where: str) -> PreparedDevice:
        r = _Reader(raw, where)
        kind = r.text("kind")
        if kind not in ("gpu", "mig"):
            raise _Bad(f"{where}.kind: expected 'gpu' or 'mig', got {kind!r}")
        mig = r.optional("mig")
        return cls(
            request_names=r.texts("requestNames"),
            pool=r.text("pool"),
            device=r.text("device"),
            cdi_device_ids=r.texts("cdiDeviceIds"),
            kind=cast(DeviceKind, kind),
            share_id=r.optional_text("shareId"),
            uuid=r.optional_text("uuid"),
            parent_uuid=r.optional_text("parentUuid"),
            mig=None if mig is None else MigRecord.from_json(mig, f"{where}.mig"),
            admin_access=r.flag("adminAccess", default=False),
            extra=r.unknown(),
        )


@dataclass(frozen=True)
class ClaimRecord:
    """A claim this node has started or finished preparing.

    ``restore`` is what unprepare must undo (prior compute modes, time-slice settings,
    MPS daemon id, MIG-mode baselines, ...); its content belongs to the code that fills it.
    """

    uid: str
    namespace: str
    name: str
    state: ClaimState = PREPARE_STARTED
    devices: list[PreparedDevice] = field(default_factory=list)
    restore: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # The uid is the key in ``claims``; it is not repeated inside the record.
        return {
            **self.extra,
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "devices": [d.to_json() for d in self.devices],
            "restore": self.restore,
            "startedAt": self.started_at,
        }

    @classmethod
    def from_json(cls, uid: str, raw: object, where: str) -> ClaimRecord:
        r = _Reader(raw, where)
        state = r.text("state")
        if state not in (PREPARE_STARTED, PREPARE_COMPLETED):
            raise _Bad(f"{where}.state: expected PrepareStarted or PrepareCompleted, got {state!r}")
        return cls(
            uid=uid,
            namespace=r.text("namespace"),
            name=r.text("name"),
            state=state,
            devices=[
                PreparedDevice.from_json(d, f"{where}.devices[{i}]")
                for i, d in enumerate(r.items("devices"))
            ],
            restore=r.mapping("restore", default={}),
            started_at=r.text("startedAt", default=""),
            extra=r.unknown(),
        )


@dataclass(frozen=True)
class Checkpoint:
    """Everything the node remembers across restarts; change it with the ``with_*`` helpers."""

    boot_id: str
    claims: dict[str, ClaimRecord] = field(default_factory=dict)
    mig_mode_baseline: dict[str, bool] = field(default_factory=dict)
    """MIG mode per GPU UUID before gpudra first changed it (survives reboots, as MIG mode does)."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def completed(self) -> dict[str, ClaimRecord]:
        return {uid: c for uid, c in self.claims.items() if c.state == PREPARE_COMPLETED}

    def started(self) -> dict[str, ClaimRecord]:
        """Claims whose prepare began but never finished (crash or failure): roll back first."""
        return {uid: c for uid, c in self.claims.items() if c.state == PREPARE_STARTED}

    def devices_in_use(self, exclude_uid: str | None = None) -> set[tuple[str, str]]:
        """``(pool, device)`` held by claims other than ``exclude_uid``, admin access aside.

        Claims in ``PrepareStarted`` count too: hardware may be half-configured for them
        until they are rolled back.
        """
        return {
            (d.pool, d.device)
            for uid, claim in self.claims.items()
            if uid != exclude_uid
            for d in claim.devices
            if not d.admin_access
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "nodeBootId": self.boot_id,
            "claims": {uid: c.to_json() for uid, c in sorted(self.claims.items())},
            "migModeBaseline": dict(sorted(self.mig_mode_baseline.items())),
        }

    @classmethod
    def from_json(cls, raw: object, where: str = "data") -> Checkpoint:
        r = _Reader(raw, where)
        claims = r.mapping("claims", default={})
        baseline = r.mapping("migModeBaseline", default={})
        for uuid, enabled in baseline.items():
            if not isinstance(enabled, bool):
                raise _Bad(f"{where}.migModeBaseline.{uuid}: expected a boolean")
        return cls(
            boot_id=r.text("nodeBootId"),
            claims={
                uid: ClaimRecord.from_json(uid, c, f"{where}.claims.{uid}")
                for uid, c in claims.items()
            },
            mig_mode_baseline=dict(baseline),
            extra=r.unknown(),
        )


# --- pure transitions ------------------------------------------------------------------


def with_claim_started(cp: Checkpoint, record: ClaimRecord) -> Checkpoint:
    """Record ``record`` as ``PrepareStarted`` (replacing any earlier record of its uid)."""
    started = dataclasses.replace(record, state=PREPARE_STARTED)
    return dataclasses.replace(cp, claims={**cp.claims, record.uid: started})


def with_claim_completed(cp: Checkpoint, uid: str, devices: Sequence[PreparedDevice]) -> Checkpoint:
    """Mark a started claim ``PrepareCompleted`` with the devices handed to the kubelet."""
    if uid not in cp.claims:
        raise KeyError(f"claim {uid} was never recorded as started")
    done = dataclasses.replace(cp.claims[uid], state=PREPARE_COMPLETED, devices=list(devices))
    return dataclasses.replace(cp, claims={**cp.claims, uid: done})


def without_claim(cp: Checkpoint, uid: str) -> Checkpoint:
    """Forget a claim; a no-op when it is unknown (unprepare is idempotent)."""
    if uid not in cp.claims:
        return cp
    return dataclasses.replace(cp, claims={k: v for k, v in cp.claims.items() if k != uid})


def with_mig_mode_baseline(cp: Checkpoint, gpu_uuid: str, enabled: bool) -> Checkpoint:
    """Remember a GPU's MIG mode before gpudra first changes it; later calls keep the first."""
    if gpu_uuid in cp.mig_mode_baseline:
        return cp
    return dataclasses.replace(
        cp, mig_mode_baseline={**cp.mig_mode_baseline, gpu_uuid: enabled}
    )


# --- encoding ----------------------------------------------------------------------------


def checksum(data: object) -> str:
    """``sha256:<hex>`` of the canonical JSON of a raw (already parsed) JSON value."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def encode(cp: Checkpoint) -> bytes:
    # Checksum what a reader will parse, not our in-memory dict: int keys in ``restore``
    # become strings on disk and would then sort differently.
    data = json.loads(json.dumps(cp.to_json()))
    doc = {"kind": KIND, "version": VERSION, "checksum": checksum(data), "data": data}
    # Compact: json's C encoder does not do indentation, and saves sit on the prepare path.
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()


def decode(content: bytes, *, path: Path, boot_id: str) -> tuple[Checkpoint, int]:
    """Parse and verify a checkpoint file; returns it with the version it was written in.

    ``boot_id`` is only used to fill in version 1 files, which did not record one.
    """
    try:
        doc = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointCorrupt(path, f"not valid JSON ({err})") from err
    if not isinstance(doc, dict):
        raise CheckpointCorrupt(path, "top level is not a JSON object")
    version = doc.get("version")
    try:
        if version == VERSION:
            return _decode_v2(doc, path), VERSION
        if version == 1:
            return _decode_v1(doc, path, boot_id), 1
    except _Bad as err:
        raise CheckpointCorrupt(path, str(err)) from err
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise CheckpointVersionUnsupported(path, version)
    raise CheckpointCorrupt(path, f"unknown version {version!r}")


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
    return Checkpoint.from_json(doc["data"])


def _decode_v1(doc: dict[str, Any], path: Path, boot_id: str) -> Checkpoint:
    """Version 1: completed claims only, no boot id, no hardware details.

    ``{"version": 1, "checksum": "sha256:<canonical JSON of the document without
    'checksum'>", "preparedClaims": {uid: {"namespace", "name", "devices": [{"pool",
    "device", "cdiDeviceIds", "requestNames"}]}}}``. It predates dynamic MIG, so MIG
    devices carry no ``MigRecord`` (gpudra did not create them and will not destroy them).
    It recorded no boot id; like NVIDIA's legacy migration, the current one is assumed.
    """
    _verify(path, doc.get("checksum"), {k: v for k, v in doc.items() if k != "checksum"})
    claims = _Reader(doc, "v1").mapping("preparedClaims", default={})
    records: dict[str, ClaimRecord] = {}
    for uid, raw in claims.items():
        where = f"preparedClaims.{uid}"
        r = _Reader(raw, where)
        devices = []
        for i, item in enumerate(r.items("devices")):
            d = _Reader(item, f"{where}.devices[{i}]")
            name = d.text("device")
            devices.append(
                PreparedDevice(
                    request_names=d.texts("requestNames"),
                    pool=d.text("pool"),
                    device=name,
                    cdi_device_ids=d.texts("cdiDeviceIds"),
                    kind="mig" if parse_device_name(name) else "gpu",
                    extra=d.unknown(),
                )
            )
        records[uid] = ClaimRecord(
            uid=uid,
            namespace=r.text("namespace"),
            name=r.text("name"),
            state=PREPARE_COMPLETED,
            devices=devices,
            extra=r.unknown(),
        )
    return Checkpoint(boot_id=boot_id, claims=records)


class _Bad(ValueError):
    """A field has the wrong shape; the message starts with its path."""


_REQUIRED: Any = object()
_T = TypeVar("_T")


class _Reader:
    """Typed access to one raw JSON object, remembering which keys were consumed."""

    def __init__(self, raw: object, where: str) -> None:
        if not isinstance(raw, dict):
            raise _Bad(f"{where}: expected an object, got {type(raw).__name__}")
        self.raw: dict[str, Any] = raw
        self.where = where
        self._seen: set[str] = set()

    def _typed(self, key: str, kind: type[_T], label: str, default: Any = _REQUIRED) -> _T:
        self._seen.add(key)
        if key not in self.raw:
            if default is _REQUIRED:
                raise _Bad(f"{self.where}.{key}: missing")
            return cast(_T, default)
        value = self.raw[key]
        # bool is an int in Python, never in the file.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _Bad(f"{self.where}.{key}: expected {label}, got {type(value).__name__}")
        return value

    def text(self, key: str, default: Any = _REQUIRED) -> str:
        return self._typed(key, str, "a string", default)

    def optional(self, key: str) -> object:
        """The raw value, ``None`` when missing or null."""
        self._seen.add(key)
        return self.raw.get(key)

    def optional_text(self, key: str) -> str | None:
        return None if self.optional(key) is None else self.text(key)

    def integer(self, key: str) -> int:
        return self._typed(key, int, "an integer")

    def flag(self, key: str, *, default: bool) -> bool:
        return self._typed(key, bool, "a boolean", default)

    def mapping(self, key: str, default: Any = _REQUIRED) -> dict[str, Any]:
        return cast(dict[str, Any], self._typed(key, dict, "an object", default))

    def items(self, key: str) -> list[Any]:
        return self._typed(key, list, "a list")

    def texts(self, key: str) -> list[str]:
        values = self.items(key)
        if not all(isinstance(v, str) for v in values):
            raise _Bad(f"{self.where}.{key}: expected a list of strings")
        return cast(list[str], values)

    def unknown(self) -> dict[str, Any]:
        return {k: v for k, v in self.raw.items() if k not in self._seen}


# --- the store ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadResult:
    checkpoint: Checkpoint
    reset_reason: str | None = None
    """Why claims were dropped on load (node rebooted), or ``None``."""
    migrated_from: int | None = None
    """The on-disk version when it was older than ``VERSION``."""


def current_boot_id() -> str:
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return "unknown"  # not Linux: claims then always survive a restart


class CheckpointStore:
    """``checkpoint.json`` and its lock in one directory; safe across threads and processes.

    Every process that changes the file must do so under ``locked()`` (``update`` does);
    readers need no lock because the file is replaced atomically.
    """

    def __init__(self, directory: Path, *, boot_id: str | None = None) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME
        self.lock_path = directory / LOCK_NAME
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        # flock excludes other open files, not other threads sharing ours: the RLock does
        # that, and makes nested locked() in one thread re-entrant.
        self._mutex = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextlib.contextmanager
    def locked(self, timeout: float = 10.0) -> Iterator[None]:
        deadline = time.monotonic() + timeout
        if not self._mutex.acquire(timeout=max(timeout, 0.0)):
            raise CheckpointLockTimeout(
                f"timed out after {timeout:g}s waiting for checkpoint lock {self.lock_path}"
                " (held by another thread of this process)"
            )
        try:
            if self._depth == 0:
                self._fd = self._flock(deadline, timeout)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    os.close(self._fd)  # closing the last fd releases the flock
                    self._fd = None
        finally:
            self._mutex.release()

    def _flock(self, deadline: float, timeout: float) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if not wait_for_flock(fd, deadline, _POLL_SECONDS):
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                raise CheckpointLockTimeout(
                    f"timed out after {timeout:g}s waiting for checkpoint lock"
                    f" {self.lock_path} (held by pid {holder}); is another gpudra"
                    " node daemon running on this node (rolling update)?"
                )
            # Diagnostics only: the holder's pid, for the next waiter's timeout message.
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def load(self) -> Checkpoint:
        return self.load_result().checkpoint

    def load_result(self) -> LoadResult:
        """Read the file; raises ``CheckpointCorrupt`` / ``CheckpointVersionUnsupported``."""
        try:
            content = self.path.read_bytes()
        except FileNotFoundError:
            return LoadResult(Checkpoint(boot_id=self.boot_id))
        cp, version = decode(content, path=self.path, boot_id=self.boot_id)
        migrated = version if version != VERSION else None
        if cp.boot_id != self.boot_id:
            # MIG instances, compute modes and MPS daemons are gone after a reboot; MIG
            # mode itself persists on Ampere, so its baseline is kept.
            reason = (
                f"node rebooted (boot id {cp.boot_id} -> {self.boot_id}):"
                f" dropped {len(cp.claims)} claim(s)"
            )
            reset = dataclasses.replace(cp, boot_id=self.boot_id, claims={})
            return LoadResult(reset, reset_reason=reason, migrated_from=migrated)
        return LoadResult(cp, migrated_from=migrated)

    def save(self, cp: Checkpoint) -> None:
        """Replace the file atomically and durably: old or new content survives any crash."""
        content = encode(cp)
        started = time.perf_counter()
        with self.locked():
            self._remove_stale_temps()
            atomic_write(self.path, content, tmp=self.directory / f"{FILE_NAME}.tmp-{os.getpid()}")
        CHECKPOINT_WRITE_SECONDS.observe(time.perf_counter() - started)

    def update(self, fn: Callable[[Checkpoint], Checkpoint], timeout: float = 10.0) -> Checkpoint:
        """Lock, load, apply ``fn``, save; returns what was saved."""
        with self.locked(timeout):
            new = fn(self.load())
            self.save(new)
            return new

    def quarantine(self) -> Path | None:
        """Move the file aside to ``checkpoint.json.corrupt-<UTC time>``; returns the new path."""
        with self.locked():
            if not self.path.exists():
                return None
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            target = self.directory / f"{FILE_NAME}.corrupt-{stamp}"
            n = 0
            while target.exists():
                n += 1
                target = self.directory / f"{FILE_NAME}.corrupt-{stamp}-{n}"
            self.path.rename(target)
            fsync_directory(self.directory)
            return target

    def _remove_stale_temps(self) -> None:
        # Writers hold the lock while their temp file exists, so any temp file seen under
        # the lock was left by a writer that crashed.
        for stale in self.directory.glob(f"{FILE_NAME}.tmp-*"):
            stale.unlink(missing_ok=True)


def atomic_write(path: Path, content: bytes, *, tmp: Path, mode: int = 0o600) -> None:
    """Replace ``path`` so that a crash at any point leaves the old or the new content.

    ``tmp`` must be in the same directory (rename is atomic only within a filesystem).
    """
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make a rename or create in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
