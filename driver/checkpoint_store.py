"""The checkpoint on disk: one snapshot, replaced atomically, and one writer at a time.

Two files in the driver's directory:

- ``checkpoint.json``, the snapshot (:mod:`gpudra.driver.checkpoint_codec`), only ever
  replaced whole: temp file, fsync, rename, directory fsync. A crash at any point leaves
  the old or the new content, never a mix. A commit that changes only claims leaves out
  the directory fsync: claims are dropped at the next boot anyway, and a process crash
  loses no rename; so a power cut that brings back the previous file loses nothing it
  would have kept. What a new boot keeps (MIG-mode baselines, the boot id) is always
  committed with the directory fsync;
- ``checkpoint.lock``, whose ``flock`` keeps writers apart: the threads of this process,
  and two daemon instances sharing the directory during a rolling update.

Writers hold the lock across their read-modify-write (:meth:`CheckpointStore.update`, or a
caller's :meth:`~CheckpointStore.locked` around ``load`` and ``save``). Readers need none:
the path always names a whole file. A read takes the file's bytes and decodes them only
when they differ from the bytes decoded last (the in-process cache); keyed on the content,
so another instance's write is always seen, whatever it did to inodes or timestamps.

Compatibility. This build writes version 2, which the previous build (a snapshot plus a
journal of claim changes) reads too. That build's own layout, a version 3 snapshot
completed by ``checkpoint.journal`` (:mod:`gpudra.driver.checkpoint_upgrade`), is read here
together with its journal, under the lock (that build appends to the journal without
replacing the snapshot), and :meth:`CheckpointStore.open` rewrites it once as a plain
version 2 snapshot and removes the journal. A version newer than 3 is refused, changing
nothing (``CheckpointVersionUnsupported``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpudra.driver.checkpoint_codec import (
    JOURNAL_VERSION,
    VERSION,
    CheckpointCorrupt,
    RecordCache,
    decode_snapshot,
    encode_as_read,
)
from gpudra.driver.checkpoint_lock import CheckpointLock
from gpudra.driver.checkpoint_model import Checkpoint
from gpudra.driver.checkpoint_upgrade import JOURNAL_NAME, with_journal
from gpudra.driver.files import atomic_write, fsync_directory
from gpudra.driver.metrics import CHECKPOINT_WRITE_SECONDS

FILE_NAME = "checkpoint.json"
LOCK_NAME = "checkpoint.lock"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
READ_SIZE = 1 << 16


@dataclass(frozen=True)
class LoadResult:
    checkpoint: Checkpoint
    reset_reason: str | None = None
    """Why claims were dropped on load (node rebooted), or ``None``."""
    migrated_from: int | None = None
    """The on-disk version when it is not the one this build writes (1, or the previous
    build's 3 with its journal); ``None`` once rewritten."""


@dataclass(frozen=True)
class Opened:
    """The checkpoint was read (and, if it was in an older layout, rewritten as version 2)."""

    result: LoadResult


@dataclass(frozen=True)
class Unreadable:
    """The checkpoint cannot be trusted (unparsable, wrong shape, checksum mismatch).

    Nothing was changed: the files are as found, and what to do is the caller's decision.
    """

    error: CheckpointCorrupt


OpenOutcome = Opened | Unreadable


def current_boot_id() -> str:
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return "unknown"  # not Linux: claims then always survive a restart


@dataclass(frozen=True)
class _Read:
    """What the files held at one read."""

    content: bytes | None
    """The snapshot's bytes; ``None``: no file."""
    journal: bytes | None
    """The journal's bytes when the snapshot is version 3 (it completes it), else ``None``."""
    checkpoint: Checkpoint
    """As on disk: boot id and claims not yet reset for a reboot."""
    version: int | None


def _read_bytes(path: Path) -> bytes | None:
    # os calls, not Path.read_bytes: half the system calls (no buffered file object), and
    # every kubelet call reads the file one to three times.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, READ_SIZE):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _kept_by_new_boot(cp: Checkpoint) -> dict[str, object]:
    """What of ``cp`` outlives a reboot: everything but the claims (see
    :meth:`CheckpointStore._result`)."""
    return cp.model_dump(exclude={"claims"})


class CheckpointStore:
    """The checkpoint's file and lock in one directory; safe across threads and processes."""

    def __init__(self, directory: Path, *, boot_id: str | None = None) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME
        self.journal_path = directory / JOURNAL_NAME
        self.lock_path = directory / LOCK_NAME
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        self._lock = CheckpointLock(self.lock_path)
        self._cache: _Read | None = None
        self._records = RecordCache()
        self._temp: tuple[int, Path] | None = None
        self._written: bytes | None = None
        """The content this process last wrote (its rename synced unless it changed claims
        alone), or found there and synced."""

    def locked(self, timeout: float = 10.0) -> contextlib.AbstractContextManager[None]:
        """Hold the checkpoint lock (re-entrant in a thread, exclusive across threads and
        processes); raises ``CheckpointLockTimeout``."""
        return self._lock.held(timeout)

    def close(self) -> None:
        """Close the lock file (a hold is released with it)."""
        self._lock.close()

    # --- start-up --------------------------------------------------------------------------

    def open(self) -> OpenOutcome:
        """Read the checkpoint once at start-up, under the lock.

        A file in an older layout (version 1, or the previous build's version 3 and its
        journal) is rewritten as a plain version 2 snapshot; temp files of writers that
        crashed are removed. An unreadable checkpoint is reported as :class:`Unreadable`
        with nothing changed; a newer build's version raises
        ``CheckpointVersionUnsupported``, also changing nothing.
        """
        with self.locked():
            try:
                read = self._read()
            except CheckpointCorrupt as exc:
                return Unreadable(exc)
            self._remove_stale_temps()
            if read.version is not None and read.version != VERSION:
                self._write(*encode_as_read(read.checkpoint, path=self.path, cache=self._records))
                return Opened(self._result(read.checkpoint, migrated_from=read.version))
            if read.version is not None and self.journal_path.exists():
                self.journal_path.unlink()  # left by the previous build: never read again
            return Opened(self._result(read.checkpoint, migrated_from=None))

    # --- reading ---------------------------------------------------------------------------

    def load(self) -> Checkpoint:
        """The checkpoint of this boot (claims of an earlier boot are dropped, not written)."""
        cp = self._read().checkpoint
        return cp if cp.boot_id == self.boot_id else self.load_result().checkpoint

    def load_result(self) -> LoadResult:
        """Read the file; raises ``CheckpointCorrupt`` / ``CheckpointVersionUnsupported``."""
        read = self._read()
        migrated = read.version if read.version not in (None, VERSION) else None
        return self._result(read.checkpoint, migrated_from=migrated)

    def _result(self, cp: Checkpoint, *, migrated_from: int | None) -> LoadResult:
        if cp.boot_id == self.boot_id:
            return LoadResult(cp, migrated_from=migrated_from)
        # MIG instances, compute modes and MPS daemons are gone after a reboot; MIG mode
        # itself persists on Ampere, so its baseline is kept.
        reason = (f"node rebooted (boot id {cp.boot_id} -> {self.boot_id}):"
                  f" dropped {len(cp.claims)} claim(s)")
        reset = cp.model_copy(update={"boot_id": self.boot_id, "claims": {}})
        return LoadResult(reset, reset_reason=reason, migrated_from=migrated_from)

    def _read(self) -> _Read:
        cached = self._cache
        content = _read_bytes(self.path)
        if cached is not None and content == cached.content and cached.journal is None:
            return cached
        if content is None:
            empty = Checkpoint(boot_id=self.boot_id)
            read = _Read(content=None, journal=None, checkpoint=empty, version=None)
        else:
            snapshot = decode_snapshot(content, path=self.path, boot_id=self.boot_id)
            if snapshot.generation is not None:
                return self._read_previous_layout()
            read = _Read(content=content, journal=None, checkpoint=snapshot.checkpoint,
                         version=snapshot.version)
        self._cache = read
        return read

    def _read_previous_layout(self) -> _Read:
        """The previous build's version 3 snapshot with its journal, read as one pair.

        Under the lock, where that build (another daemon instance, in a rolling update)
        cannot be appending or compacting. Not cached: its appends leave the snapshot as
        it is.
        """
        with self.locked():
            content = _read_bytes(self.path)
            if content is None:
                return _Read(content=None, journal=None,
                             checkpoint=Checkpoint(boot_id=self.boot_id), version=None)
            snapshot = decode_snapshot(content, path=self.path, boot_id=self.boot_id)
            if snapshot.generation is None:
                return _Read(content=content, journal=None, checkpoint=snapshot.checkpoint,
                             version=snapshot.version)
            journal = _read_bytes(self.journal_path)
            cp = with_journal(snapshot.checkpoint, journal, generation=snapshot.generation,
                              path=self.journal_path)
            return _Read(content=content, journal=journal or b"", checkpoint=cp,
                         version=JOURNAL_VERSION)

    # --- writing ---------------------------------------------------------------------------

    def save(self, cp: Checkpoint) -> None:
        """Make ``cp`` the checkpoint: the old or the new state survives any crash, and
        after a power cut the new one too, but for its claims (see the module's docstring).

        A save of what the file already holds writes nothing. A file this build cannot
        read is replaced whole, except a newer build's (``CheckpointVersionUnsupported``).
        """
        with self.locked():
            self._save(cp, None)

    def _save(self, cp: Checkpoint, read: _Read | None) -> None:
        """:meth:`save` under the lock; ``read``: the files as this thread read them under
        this hold of the lock, so as they still are (no writer can have changed them)."""
        started = time.perf_counter()
        content, as_read = encode_as_read(cp, path=self.path, cache=self._records)
        on_disk = read.content if read is not None else _read_bytes(self.path)
        if on_disk == content:
            if content != self._written:
                # Written by another process, which may have died between its rename and
                # its directory fsync: ours makes the rename durable.
                fsync_directory(self.directory)
                self._written = content
            return
        cached = read if read is not None else self._cache
        if read is None and on_disk is not None and on_disk != self._written and (
                cached is None or on_disk != cached.content):
            with contextlib.suppress(CheckpointCorrupt):
                cached = self._read()  # raises for a newer build's version
        # A commit of claims alone replacing a plain snapshot needs no directory fsync; the
        # previous build's snapshot goes with its journal, so that rename is always synced.
        previous = cached.checkpoint if cached is not None and cached.journal is None \
            and on_disk is not None and cached.content == on_disk else None
        self._write(content, as_read, sync_rename=previous is None or (
            _kept_by_new_boot(previous) != _kept_by_new_boot(as_read)))
        CHECKPOINT_WRITE_SECONDS.observe(time.perf_counter() - started)

    def _write(self, content: bytes, as_read: Checkpoint, *, sync_rename: bool = True) -> None:
        """Replace the snapshot with ``content``, which a reader decodes as ``as_read``
        (under the lock); ``sync_rename=False`` leaves out the directory fsync (see the
        module's docstring: only for a commit that changes claims alone)."""
        # The directory exists: the lock file held meanwhile is in it (made with its mode).
        self._cache = self._written = None
        atomic_write(self.path, content, tmp=self._temp_path(), sync_rename=sync_rename)
        # The previous build's journal, if any, completed the snapshot just replaced; the
        # new one is whole without it. A power cut that brings the journal back brings
        # the old snapshot back with it, or leaves one the journal does not belong to.
        self.journal_path.unlink(missing_ok=True)
        self._written = content
        # The cache: what a reader decodes (not the checkpoint saved: see encode_as_read).
        self._cache = _Read(content=content, journal=None, checkpoint=as_read, version=VERSION)

    def _temp_path(self) -> Path:
        """This process's temp file (by pid: two instances may write the directory)."""
        pid = os.getpid()
        if self._temp is None or self._temp[0] != pid:
            self._temp = (pid, self.directory / f"{FILE_NAME}.tmp-{pid}")
        return self._temp[1]

    def update(self, fn: Callable[[Checkpoint], Checkpoint], timeout: float = 10.0) -> Checkpoint:
        """Lock, load, apply ``fn``, save; returns what was saved."""
        with self.locked(timeout):
            read = self._read()
            cp = read.checkpoint
            if cp.boot_id != self.boot_id:
                cp = self._result(cp, migrated_from=None).checkpoint
            new = fn(cp)
            self._save(new, read)
            return new

    def quarantine(self) -> Path | None:
        """Move the files aside to ``checkpoint.{json,journal}.corrupt-<UTC time>``; returns
        the snapshot's new path."""
        with self.locked():
            if not self.path.exists():
                return None
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            suffix = f"corrupt-{stamp}"
            n = 0
            while (self.directory / f"{FILE_NAME}.{suffix}").exists() \
                    or (self.directory / f"{JOURNAL_NAME}.{suffix}").exists():
                n += 1
                suffix = f"corrupt-{stamp}-{n}"
            target = self.directory / f"{FILE_NAME}.{suffix}"
            self.path.rename(target)
            with contextlib.suppress(FileNotFoundError):
                self.journal_path.rename(self.directory / f"{JOURNAL_NAME}.{suffix}")
            fsync_directory(self.directory)
            self._cache = self._written = None
            return target

    def _remove_stale_temps(self) -> None:
        # Writers hold the lock while their temp file exists, so any temp file seen under
        # the lock was left by a writer that crashed.
        for stale in self.directory.glob(f"{FILE_NAME}.tmp-*"):
            stale.unlink(missing_ok=True)
