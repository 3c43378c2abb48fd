"""The checkpoint on disk: a snapshot, a journal of claim changes, and one writer at a time.

(Over 450 lines: the cache, the append and the compaction share one state and the
orderings below; split apart, each would have to re-check the others' invariants.)

Three files in the driver's directory:

- ``checkpoint.json``, the snapshot (:mod:`gpudra.driver.checkpoint_codec`), only ever
  replaced atomically: temp file, fsync, rename, directory fsync;
- ``checkpoint.journal``, the claim changes since that snapshot, one line per commit
  (:mod:`gpudra.driver.checkpoint_journal`);
- ``checkpoint.lock``, whose ``flock`` keeps two daemon instances (rolling update) apart.

Commit (``save``). When only claims changed since the state on disk, one journal record is
appended with one ``write`` and made durable with one ``fdatasync`` (data plus the file size:
~0.1 ms here, against ~0.4 ms for the four waits of an atomic replace). A torn tail left by
a crash (see the journal module) is cut off first, under the lock, so a record never lands
glued to garbage (no sync of its own: the fdatasync makes the new size durable with the
data). A save that changes nothing writes nothing. Anything else — boot id, MIG-mode
baselines, unknown fields, no readable state, a journal past ``MAX_RECORDS`` or
``MAX_BYTES`` — compacts, in this order:

1. open the journal, creating it if missing;
2. replace the snapshot with a new, random generation (version 3; a checkpoint without
   claims is written as version 2, no journal in effect): the fsync makes its
   content durable before the rename publishes it, the directory fsync makes the rename
   durable and with it the journal's directory entry (so appends need only fdatasync);
3. empty the journal (``ftruncate`` + ``fsync``).

A crash between 2 and 3 leaves records of the previous generation, which load skips (the
next writer compacts them away). Generations are random rather than counted: a version 2
snapshot has none to count on from, and a left-over record must never match a later one.

Load = the snapshot plus its generation's records, in order. Lockless readers may race a
writer: an append in progress is an unfinished last line ("not there yet"), and a
compaction replaces the snapshot before it empties the journal, so a reader that finds the
snapshot path unchanged after reading the journal has read a matching pair (else it reads
again; after a few tries it takes the lock). A reader that found stale records (a new
snapshot, the old journal not yet emptied) reads the journal from its start next time, not
from where it stopped: the emptied journal may have grown past that point meanwhile.

Downgrades. An older build reads the snapshot only; missing the journal's claims it would
destroy their MIG devices on reconcile. A snapshot with a journal in effect is therefore
version 3, which builds reading versions 1..2 refuse (``CheckpointVersionUnsupported``).
:meth:`CheckpointStore.compact` folds the journal into a plain version 2 snapshot: after a
clean stop that calls it, an older build reads the checkpoint. The next save then writes
version 3 again (one compaction per start).

Reads are cached, keyed on the files' identity: the snapshot's inode, size and mtime, the
journal's inode and the length read. An unchanged checkpoint costs two ``stat`` calls. The
content used to be the key because a rewrite in place within one clock tick keeps size and
mtime; gpudra no longer writes in place: the snapshot is only replaced (a new inode), and
the journal only grows, is cut back to the end of its last record (a torn tail; a failed
append, which then also compacts), or is emptied right after the snapshot is replaced. A
journal cut back and grown again to the same length is
not mistaken: a tail is re-read from the end of the last record every time, never assumed.
Inode numbers are reused once free, so the cache keeps the files it read open: an inode
cannot be reused while it is open. A save refreshes the cache with what it wrote, as a
reader would decode it, so the next load costs the same two ``stat`` calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpudra.driver.checkpoint_codec import (
    JOURNAL_VERSION,
    VERSION,
    CheckpointError,
    decode_snapshot,
    encode,
)
from gpudra.driver.checkpoint_journal import (
    JOURNAL_NAME,
    MAX_BYTES,
    MAX_RECORDS,
    claims_diff,
    encode_record,
    replay,
    scan,
)
from gpudra.driver.checkpoint_lock import CheckpointLock
from gpudra.driver.checkpoint_model import Checkpoint
from gpudra.driver.files import append_durably, atomic_write, fsync_directory
from gpudra.driver.metrics import CHECKPOINT_WRITE_SECONDS

FILE_NAME = "checkpoint.json"
LOCK_NAME = "checkpoint.lock"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_LOCKLESS_TRIES = 3


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


class _Open:
    """A file kept open, with its ``fstat`` when opened; closed when the last user drops it.

    Open, its inode number cannot be reused, so comparing it with a later ``stat`` of the
    path is an identity check. Closed by reference count rather than explicitly, because
    another thread may still be reading through an older cache entry.
    """

    __slots__ = ("fd", "stat")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.stat = os.fstat(fd)

    def is_(self, st: os.stat_result | None) -> bool:
        return st is not None and (st.st_ino, st.st_dev) == (self.stat.st_ino, self.stat.st_dev)

    def __del__(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class _State:
    """What the files held when last read or written by this process."""

    checkpoint: Checkpoint
    """Snapshot plus journal."""
    base: Checkpoint
    """The snapshot alone."""
    version: int | None
    """The snapshot's version; ``None``: no snapshot."""
    generation: str | None
    """The journal generation in effect (version 3), else ``None``: no journal read."""
    snapshot: _Open | None
    journal: _Open | None
    end: int = 0
    """Journal bytes applied (or skipped as stale): where the next record goes."""
    seq: int = 0
    stale: int = 0
    """Records of an older generation seen (a compaction that crashed half-way)."""
    tail: int = 0
    """Bytes after ``end``: an append in progress, or a torn one."""
    synced: bool = False
    """Written and synced by this process (else another may have died before its sync)."""


def _stat(path: str) -> os.stat_result | None:
    try:
        # Not Path.stat(): a microsecond more per call, and a load is two of these.
        return os.stat(path)  # noqa: PTH116
    except FileNotFoundError:
        return None


def _unchanged(snapshot: _Open | None, st: os.stat_result | None) -> bool:
    if snapshot is None:
        return st is None
    return (snapshot.is_(st) and st is not None and st.st_size == snapshot.stat.st_size
            and st.st_mtime_ns == snapshot.stat.st_mtime_ns)


def _open(path: Path, flags: int) -> _Open | None:
    try:
        return _Open(os.open(path, flags | os.O_CLOEXEC))
    except FileNotFoundError:
        return None


def _read_from(fd: int, offset: int) -> bytes:
    chunks = []
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


class CheckpointStore:
    """The checkpoint's files and lock in one directory; safe across threads and processes.

    Every process that changes the files must do so under ``locked()`` (``save`` and
    ``update`` do); readers need no lock (see the module docstring).
    """

    def __init__(self, directory: Path, *, boot_id: str | None = None) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME
        self.journal_path = directory / JOURNAL_NAME
        self.lock_path = directory / LOCK_NAME
        self._path_str, self._journal_str = str(self.path), str(self.journal_path)
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        self._lock = CheckpointLock(self.lock_path)
        self._state: _State | None = None
        self._appender: _Open | None = None
        """The journal, opened ``O_APPEND`` for writing (under the lock only)."""

    def locked(self, timeout: float = 10.0) -> contextlib.AbstractContextManager[None]:
        """Hold the checkpoint lock (re-entrant in a thread, exclusive across threads and
        processes); raises ``CheckpointLockTimeout``."""
        return self._lock.held(timeout)

    def close(self) -> None:
        """Close the files (held locks are released with the lock file)."""
        # Dropped, not closed: a thread still using one holds it open (see _Open).
        self._state = None
        self._appender = None
        self._lock.close()

    # --- reading -------------------------------------------------------------------------

    def load(self) -> Checkpoint:
        cp = self._current().checkpoint
        return cp if cp.boot_id == self.boot_id else self.load_result().checkpoint

    def load_result(self) -> LoadResult:
        """Read the files; raises ``CheckpointCorrupt`` / ``CheckpointVersionUnsupported``."""
        state = self._current()
        cp = state.checkpoint
        migrated = state.version if state.version not in (None, VERSION, JOURNAL_VERSION) \
            else None
        if cp.boot_id != self.boot_id:
            # MIG instances, compute modes and MPS daemons are gone after a reboot; MIG
            # mode itself persists on Ampere, so its baseline is kept.
            reason = (
                f"node rebooted (boot id {cp.boot_id} -> {self.boot_id}):"
                f" dropped {len(cp.claims)} claim(s)"
            )
            reset = cp.model_copy(update={"boot_id": self.boot_id, "claims": {}})
            return LoadResult(reset, reset_reason=reason, migrated_from=migrated)
        return LoadResult(cp, migrated_from=migrated)

    def _current(self) -> _State:
        """The files' state: the cache while they are unchanged, else read (what changed)."""
        for _ in range(_LOCKLESS_TRIES):
            state = self._refresh()
            if state is not None:
                return state
        # A compaction ran during each try: under the lock none can (but another program
        # writing the files could, and then nothing is to be trusted).
        with self.locked():
            state = self._refresh()
        if state is None:
            raise CheckpointError(f"checkpoint {self.path} changed while read under its lock")
        return state

    def _refresh(self) -> _State | None:
        """One try of :meth:`_current`; ``None`` if a compaction got in the way."""
        state = self._state
        if state is None or not _unchanged(state.snapshot, _stat(self._path_str)):
            fresh = self._read()
        elif state.generation is None:
            return state  # no journal in effect
        else:
            journal = _stat(self._journal_str)
            if journal is None and state.journal is None:
                return state
            if state.journal is not None and state.journal.is_(journal) \
                    and journal is not None and journal.st_size == state.end \
                    and not state.stale:
                return state
            fresh = self._read_journal(state, journal)
        if fresh is not None:
            self._state = fresh
        return fresh

    def _read(self) -> _State | None:
        """Snapshot and journal from scratch; ``None`` if the snapshot changed meanwhile."""
        snapshot = _open(self.path, os.O_RDONLY)
        if snapshot is None:
            empty = Checkpoint(boot_id=self.boot_id)
            return _State(checkpoint=empty, base=empty, version=None, generation=None,
                          snapshot=None, journal=None)
        content = _read_from(snapshot.fd, 0)
        cp, version, generation = decode_snapshot(content, path=self.path, boot_id=self.boot_id)
        state = _State(checkpoint=cp, base=cp, version=version, generation=generation,
                       snapshot=snapshot, journal=None)
        if generation is None:
            return state  # v1/v2: any journal is left over from before, and is not read
        return self._read_journal(state, _stat(self._journal_str))

    def _read_journal(self, state: _State, journal: os.stat_result | None) -> _State | None:
        """``state`` with the journal read on from where it was, or from its start when it
        is another file or shorter; ``None`` if the snapshot changed meanwhile."""
        assert state.generation is not None
        handle = state.journal
        # Stale lines mean a compaction's journal truncate is due: it may have happened and
        # the journal grown past where we read since, so only a read from its start is sure.
        if handle is not None and handle.is_(journal) and journal is not None \
                and journal.st_size >= state.end and not state.stale:
            start, cp, seq, stale, synced = (state.end, state.checkpoint, state.seq,
                                             state.stale, state.synced)
        else:
            handle = _open(self.journal_path, os.O_RDONLY)
            start, cp, seq, stale, synced = 0, state.base, 0, 0, False
        if handle is None:
            found = None
        else:
            data = _read_from(handle.fd, start)
            try:
                found = scan(data, path=self.journal_path, offset=start,
                             generation=state.generation, seq=seq)
                cp = replay(cp, found.records, path=self.journal_path)
            except CheckpointError:
                if not _unchanged(state.snapshot, _stat(self._path_str)):
                    return None  # we read a compaction's new journal against the old snapshot
                raise
        # The snapshot is replaced before its journal is emptied: if it is still the one
        # we have, the journal we read belongs to it.
        if not _unchanged(state.snapshot, _stat(self._path_str)):
            return None
        if found is None:
            return dataclasses.replace(state, checkpoint=state.base, journal=None, end=0,
                                       seq=0, stale=0, tail=0, synced=False)
        return dataclasses.replace(
            state, checkpoint=cp, journal=handle, end=found.end, seq=found.seq,
            stale=stale + found.stale, tail=found.tail, synced=synced and not found.records)

    # --- writing -------------------------------------------------------------------------

    def save(self, cp: Checkpoint) -> None:
        """Make ``cp`` the checkpoint, durably: the old or the new state survives any crash."""
        started = time.perf_counter()
        with self.locked():
            try:
                state: _State | None = self._current()
            except CheckpointError:
                state = None  # unreadable (corrupt, or a newer build's): replaced whole
            try:
                if state is None or not self._append(state, cp):
                    # No claims: version 2, which an older build reads. So start-up after
                    # a reboot (claims dropped) leaves a file a rollback can start on even
                    # if this build dies before its clean stop.
                    self._compact(cp, generation=secrets.token_hex(8) if cp.claims else None)
            except BaseException:
                self._state = None
                raise
        CHECKPOINT_WRITE_SECONDS.observe(time.perf_counter() - started)

    def _append(self, state: _State, cp: Checkpoint) -> bool:
        """Commit ``cp`` as one journal record if that is all it takes; ``False``: compact."""
        if state.version is None:
            return False
        diff = claims_diff(state.checkpoint, cp)
        if diff is None:
            return False
        put, removed = diff
        if not put and not removed:
            if state.version == 1:
                return False  # rewrite it in the current format
            if not state.synced and state.journal is not None and state.end:
                # Another process may have died between its write and its fdatasync.
                os.fdatasync(state.journal.fd)
                self._state = dataclasses.replace(state, synced=True)
            return True
        if (state.generation is None or state.journal is None or state.stale
                or state.seq >= MAX_RECORDS):
            return False
        line, record = encode_record(state.generation, state.seq + 1, put, removed)
        if state.end + len(line) > MAX_BYTES:
            return False
        appender = self._appender_for(state.journal)
        if appender is None:
            return False
        if state.tail:
            # A torn last record (a crash mid-append): cut it off so ours is not glued to
            # it. fdatasync below makes the shorter-then-longer size durable with our data.
            os.ftruncate(appender.fd, state.end)
        try:
            append_durably(appender.fd, line)
        except BaseException:
            self._undo_append(state, appender)
            raise
        self._state = dataclasses.replace(
            state, checkpoint=replay(state.checkpoint, [record], path=self.journal_path),
            end=state.end + len(line), seq=record.seq, tail=0, synced=True)
        return True

    def _appender_for(self, journal: _Open) -> _Open | None:
        """The file ``journal`` is, opened ``O_APPEND``; ``None`` if it is not there."""
        appender = self._appender
        if appender is None or not appender.is_(journal.stat):
            appender = _open(self.journal_path, os.O_WRONLY | os.O_APPEND)
            if appender is None or not appender.is_(journal.stat):
                return None  # replaced since it was read: compact
            self._appender = appender
        return appender

    def _undo_append(self, state: _State, appender: _Open) -> None:
        """After a failed append: the state before it, as a new snapshot, best effort.

        Cutting the record off restores the content, and the new snapshot makes every
        reader that saw the record read again (a cut journal can grow back to the length
        a reader already read).
        """
        with contextlib.suppress(OSError):
            os.ftruncate(appender.fd, state.end)
            os.fsync(appender.fd)  # the cut durable: a power cut must not bring it back
            self._compact(state.checkpoint, generation=secrets.token_hex(8))

    def _compact(self, cp: Checkpoint, *, generation: str | None) -> None:
        """Replace the snapshot (with ``generation``: version 3, else 2) and empty the journal."""
        content = encode(cp, generation=generation)
        journal: _Open | None
        if generation is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            # created before the snapshot's directory fsync, which makes its entry durable
            journal = _Open(os.open(self.journal_path, flags | os.O_CLOEXEC, 0o600))
        else:
            journal = _open(self.journal_path, os.O_WRONLY | os.O_APPEND)
        self._remove_stale_temps()
        atomic_write(self.path, content, tmp=self.directory / f"{FILE_NAME}.tmp-{os.getpid()}")
        if journal is not None:
            if os.fstat(journal.fd).st_size:
                os.ftruncate(journal.fd, 0)
                os.fsync(journal.fd)
            self._appender = journal
        # The cache: what we wrote, as a reader decodes it.
        snapshot = _open(self.path, os.O_RDONLY)
        base = decode_snapshot(content, path=self.path, boot_id=self.boot_id).checkpoint
        self._state = _State(
            checkpoint=base, base=base, version=VERSION if generation is None else JOURNAL_VERSION,
            generation=generation, snapshot=snapshot,
            journal=None if generation is None else _open(self.journal_path, os.O_RDONLY),
            synced=True)

    def compact(self) -> None:
        """Fold the journal into a version 2 snapshot, which older builds read too.

        For a clean stop: the next save writes version 3 again.
        """
        with self.locked():
            state = self._current()
            if state.version is None:
                return
            journal = _stat(self._journal_str)
            if state.version == VERSION and (journal is None or journal.st_size == 0):
                return
            try:
                self._compact(state.checkpoint, generation=None)
            except BaseException:
                self._state = None
                raise

    def update(self, fn: Callable[[Checkpoint], Checkpoint], timeout: float = 10.0) -> Checkpoint:
        """Lock, load, apply ``fn``, save; returns what was saved."""
        with self.locked(timeout):
            new = fn(self.load())
            self.save(new)
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
            self._state = None
            self._appender = None
            return target

    def _remove_stale_temps(self) -> None:
        # Writers hold the lock while their temp file exists, so any temp file seen under
        # the lock was left by a writer that crashed.
        for stale in self.directory.glob(f"{FILE_NAME}.tmp-*"):
            stale.unlink(missing_ok=True)
