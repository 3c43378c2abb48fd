"""``checkpoint.json`` on disk: atomic, durable writes and one writer at a time.

Writes replace the file atomically and durably (temp file, fsync, rename, directory
fsync), and a ``flock`` on ``checkpoint.lock`` keeps two daemon instances (rolling update)
apart. The format is :mod:`gpudra.driver.checkpoint_codec`'s.

Reads are cached: the parsed checkpoint is kept with the bytes it was parsed from, and a
read that finds the same bytes skips parsing, checksumming and validating (the costly part
of a read; reading a few KiB is ~10 µs). Keyed on the content rather than on the file's
inode and mtime because mtimes are only as fine as the kernel tick: an in-place rewrite of
the same size within one tick would look unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpudra.driver.checkpoint_codec import VERSION, CheckpointError, decode, encode
from gpudra.driver.checkpoint_model import Checkpoint
from gpudra.driver.files import atomic_write, fsync_directory
from gpudra.driver.flock import wait_for_flock
from gpudra.driver.metrics import CHECKPOINT_WRITE_SECONDS

FILE_NAME = "checkpoint.json"
LOCK_NAME = "checkpoint.lock"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_POLL_SECONDS = 0.02


class CheckpointLockTimeout(CheckpointError):
    """Another process (or thread) held the checkpoint lock for longer than the timeout."""


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
        self._held = False
        self._cache: tuple[bytes, Checkpoint, int] | None = None

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
                self._flock(deadline, timeout)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._held:
                    assert self._fd is not None
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    self._held = False
        finally:
            self._mutex.release()

    def _flock(self, deadline: float, timeout: float) -> None:
        # The lock file stays open between holds (opening it is a path walk per prepare);
        # it is re-opened if somebody removed or replaced it meanwhile.
        if self._fd is None or not self._lock_file_is(self._fd):
            self.close()
            self.directory.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fd = self._fd
        if not wait_for_flock(fd, deadline, _POLL_SECONDS):
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise CheckpointLockTimeout(
                f"timed out after {timeout:g}s waiting for checkpoint lock"
                f" {self.lock_path} (held by pid {holder}); is another gpudra"
                " node daemon running on this node (rolling update)?"
            )
        self._held = True
        # Diagnostics only: the holder's pid, for the next waiter's timeout message. Fixed
        # width, so it overwrites the last holder's without a truncate.
        os.pwrite(fd, f"{os.getpid():<20}\n".encode(), 0)

    def _lock_file_is(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), self.lock_path.stat())
        except FileNotFoundError:
            return False

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:  # a store dropped without close(): do not leak the fd
            os.close(fd)

    def close(self) -> None:
        """Close the lock file (held locks are released with it)."""
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                self._held = False

    def load(self) -> Checkpoint:
        return self.load_result().checkpoint

    def load_result(self) -> LoadResult:
        """Read the file; raises ``CheckpointCorrupt`` / ``CheckpointVersionUnsupported``."""
        try:
            cp, version = self._read()
        except FileNotFoundError:
            return LoadResult(Checkpoint(boot_id=self.boot_id))
        migrated = version if version != VERSION else None
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

    def _read(self) -> tuple[Checkpoint, int]:
        """The parsed file, from the cache while its bytes are unchanged."""
        content = self.path.read_bytes()
        cached = self._cache
        if cached is not None and cached[0] == content:
            return cached[1], cached[2]
        cp, version = decode(content, path=self.path, boot_id=self.boot_id)
        self._cache = (content, cp, version)
        return cp, version

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
