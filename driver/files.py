"""Durable file replacement: what the checkpoint and the CDI specs both rely on."""

from __future__ import annotations

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
