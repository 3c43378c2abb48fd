"""Durable file replacement and appends: what the checkpoint and the CDI specs rely on."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def atomic_write(path: Path, content: bytes, *, tmp: Path, mode: int = 0o600,
                 durable: bool = True) -> None:
    """Replace ``path`` so that a crash at any point leaves the old or the new content.

    ``tmp`` must be in the same directory (rename is atomic only within a filesystem).
    ``durable=False`` skips both fsyncs: the caller syncs the directory itself, once for
    many files (:func:`fsync_directory`), when a power cut needs no more than that.
    """
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make a rename or create in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_durably(fd: int, content: bytes) -> None:
    """Append ``content`` with one ``write`` to an ``O_APPEND`` file, then ``fdatasync``.

    One write so that concurrent readers see the record whole or not yet; ``fdatasync``
    (not ``fsync``) because the size it must persist with the data is all the metadata a
    reader needs. A short write (disk full) raises: the caller removes what did land.
    """
    written = os.write(fd, content)
    if written != len(content):
        raise OSError(errno.ENOSPC, f"short write: {written} of {len(content)} bytes")
    os.fdatasync(fd)
