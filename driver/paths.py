"""Paths the daemon builds from names (a claim's uid, a GPU's UUID): one component under a
root it owns, checked, and the only way such a directory is removed.

Names are validated where they enter the daemon (:mod:`gpudra.api.identifiers`); this is
the second wall, for names that come from elsewhere (a checkpoint written by another
version or corrupted, a directory listing) and for code that forgets the first. A name
that is empty, ``.``, ``..``, holds ``/`` or NUL, or is longer than a file name can be is
refused with :class:`UnsafePath`, an ``OSError``, so every caller's handling of a failed
file operation (roll back, report the claim's error) applies to it too.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpudra.api.identifiers import IdentifierError, safe_component


class UnsafePath(OSError):
    """A name would make a path outside its root, or a tree outside its root was to go."""


def child(root: str | os.PathLike[str], name: str, what: str = "name") -> str:
    """``root/name`` as a string, ``name`` proven to be one plain component of it (for
    paths built per call, where a ``Path`` object costs more than the check)."""
    try:
        safe_component(name, what)
    except IdentifierError as exc:
        raise UnsafePath(f"{exc} under {os.fspath(root)}") from None
    return f"{os.fspath(root)}/{name}"


def child_path(root: Path, name: str, what: str = "name") -> Path:
    """:func:`child` as a ``Path``."""
    return Path(child(root, name, what))


def inside(root: Path, path: Path) -> bool:
    """Whether ``path`` is strictly below ``root``, by their absolute, normalised text and
    with the symbolic links of both resolved (a link on the way must not lead out)."""
    absolute = path.absolute()
    if absolute.name in ("", ".", ".."):
        return False
    target = absolute.parent.resolve() / absolute.name
    base = root.resolve()
    return target != base and target.is_relative_to(base)


def remove_tree(root: Path, path: Path) -> None:
    """Remove the directory tree ``path``, which must be strictly below ``root``; a missing
    one is fine. A symbolic link at ``path`` is removed, never followed."""
    if not inside(root, path):
        raise UnsafePath(f"refusing to remove {path}: it is not under {root}")
    if path.is_symlink():
        path.unlink(missing_ok=True)
        return
    shutil.rmtree(path, ignore_errors=True)
