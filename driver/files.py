"""Files and directories the daemon creates: explicit modes, durable replacement, appends.

The one place that decides modes. A mode passed to ``mkdir`` or ``open`` is filtered
through the process's umask, so under ``umask 000`` a default ``mkdir`` is 0777 and a
``write_text`` 0666; everything created here gets exactly the mode asked for (``chmod`` or
``fchmod`` after the create), whatever the umask. Errors name the file: ``os.write`` and
``fsync`` raise without one (disk full says only "No space left on device").
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

DIR_MODE = 0o750
"""The daemon's own directories (data dir, MPS claim dirs): group may look, nobody else."""
PRIVATE_DIR_MODE = 0o700
"""Directories only the daemon uses (lock files)."""
FILE_MODE = 0o600
"""The daemon's own files (checkpoint, journal, lock files, pid files)."""
CHILD_UMASK = 0o022
"""The umask of the processes the daemon starts (MPS control daemons, nvidia-smi): what
they create is never writable by others, whatever umask the daemon was started with, and
stays readable where workloads read it (the MPS logs their containers mount read-only)."""


def named(exc: OSError, path: Path | str) -> OSError:
    """``exc`` with ``path`` as its file name when it names none (a failed write, fsync)."""
    if exc.filename is not None:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), os.fspath(path)).with_traceback(
        exc.__traceback__)


def make_dirs(path: Path, mode: int = DIR_MODE) -> None:
    """Create ``path`` and its missing parents, each of those with exactly ``mode``.

    An existing directory keeps its mode (a parent such as the kubelet's plugins dir is
    not ours to change); one made meanwhile by another instance is left alone too.
    """
    missing: list[Path] = []
    at = path
    while not at.is_dir() and at != at.parent:
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:
            if not directory.is_dir():  # a file (or a dangling symlink) is in the way
                raise NotADirectoryError(
                    errno.ENOTDIR, "is in the way of a directory the daemon needs: move it "
                    "aside and restart", os.fspath(directory)) from None
            continue
        except OSError as exc:
            raise named(exc, directory) from None
        directory.chmod(mode)


def restrict(path: Path, mode: int) -> None:
    """Take from ``path`` (a directory or file of ours) any permission beyond ``mode``: one
    an older build made under a permissive umask. Another owner's, or a symlink, is left
    alone."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
        return
    if stat.S_IMODE(info.st_mode) & ~mode:
        path.chmod(stat.S_IMODE(info.st_mode) & mode)


def open_created(path: str | Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open(path, flags | O_CREAT | O_CLOEXEC)`` whose file has exactly ``mode``,
    also when it existed with a wider one; errors name the file (``open`` names it).

    ``O_NOFOLLOW``: a symlink planted in our place would have this root daemon write and
    ``fchmod`` whatever it points to; it fails (``ELOOP``) instead.
    """
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
    except OSError as exc:
        os.close(fd)
        raise named(exc, path) from None
    return fd


def write_all(fd: int, content: bytes, path: Path | str) -> None:
    """Write all of ``content`` to ``fd``; an error (disk full) names ``path``."""
    view = memoryview(content)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise named(exc, path) from None


def atomic_write(path: Path, content: bytes, *, tmp: Path, mode: int = FILE_MODE,
                 durable: bool = True, sync_rename: bool = True) -> None:
    """Replace ``path`` so that a crash at any point leaves the old or the new content.

    ``tmp`` must be in the same directory (rename is atomic only within a filesystem).
    ``durable=False`` skips both fsyncs: the caller syncs the directory itself, once for
    many files (:func:`fsync_directory`), when a power cut needs no more than that.
    ``sync_rename=False`` syncs the content before the rename, so that no crash leaves a
    torn file, but not the directory after it: a power cut may then bring back the old
    file, whole (the filesystem's own commit, or the next directory fsync, makes the
    rename durable). The file gets exactly ``mode``; an error names ``path`` (or ``tmp``
    where the create fails).
    """
    fd = open_created(tmp, os.O_WRONLY | os.O_TRUNC, mode)
    try:
        try:
            write_all(fd, content, path)
            if durable:
                os.fsync(fd)
        except OSError as exc:
            raise named(exc, path) from None
        finally:
            os.close(fd)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable and sync_rename:
        fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make a rename or create in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        raise named(exc, directory) from None
    finally:
        os.close(fd)


def append_durably(fd: int, content: bytes, path: Path | str | None = None) -> None:
    """Append ``content`` with one ``write`` to an ``O_APPEND`` file, then ``fdatasync``.

    One write so that concurrent readers see the record whole or not yet; ``fdatasync``
    (not ``fsync``) because the size it must persist with the data is all the metadata a
    reader needs. A short write (disk full) raises: the caller removes what did land.
    ``path``, when given, is named in the error.
    """
    where = os.fspath(path) if path is not None else None
    try:
        written = os.write(fd, content)
        if written != len(content):
            raise OSError(errno.ENOSPC, f"short write: {written} of {len(content)} bytes")
        os.fdatasync(fd)
    except OSError as exc:
        raise (named(exc, where) if where is not None else exc) from None
