"""Parse trees of CEL expressions kept on disk between runs, found by the expression's text.

An interactive ``gpudra explain`` parses a handful of selectors, and loading Lark's tables
and building its lexer for them is most of the parsing cost. Each tree is one
small JSON file (not a pickle: a bad file can hold a wrong tree, never code) named by a hash
of the text, which it also holds and which must match. The directory's name is a hash of
the grammar, the parser code and Lark's version, so an upgrade starts afresh. Files are
written atomically; one that cannot be read or decoded is a miss (the text is parsed again
and the file rewritten). The directory is used only when this user owns it and nobody else
may write to it; Lark's table cache (a pickle) only when the file itself is a plain file of
this user's that nobody else may write (:func:`private_file`).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import lark

if TYPE_CHECKING:
    from gpudra.scheduling.cel.grammar import Node

FORMAT: Final = 1
"""Bump when the file layout or the tree encoding changes."""
LIMIT: Final = 512
"""Files kept per directory; beyond it the older half is removed."""
_META_FIELDS: Final = frozenset({
    "empty", "line", "column", "start_pos", "end_line", "end_column", "end_pos",
    "container_line", "container_column", "container_start_pos", "container_end_line",
    "container_end_column", "container_end_pos"})
_TOKEN_FIELDS: Final = 8
"""A token's fields: type, value, start_pos, line, column, end_line, end_column, end_pos."""


def private_directory(path: Path) -> bool:
    """Create ``path`` (mode 0700) if needed; whether it is ours alone to read and write.

    The cache holds a pickle that Lark loads, so nobody else may be able to put files there
    or swap the directory: ``path`` itself must be a real directory (not a symlink to one)
    of ours, writable by us only, in a parent that only we or root can change, or that is
    sticky (as ``/tmp``: others cannot rename what we own there).
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(path)
        parent = os.lstat(path.parent)
    except OSError:
        return False
    me = os.geteuid()
    parent_safe = parent.st_uid in (me, 0) and (
        not parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or parent.st_mode & stat.S_ISVTX)
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == me
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and bool(parent_safe)
            and os.access(path, os.R_OK | os.W_OK | os.X_OK))


def private_file(path: Path) -> bool:
    """Whether the file at ``path`` may be loaded (a pickle, by Lark) and written through.

    Only a plain file of ours that nobody else may write: the directory being private is
    not enough (a symlink or a hard-linked file planted there, or a file made under a
    permissive umask, would be followed or trusted). Anything else there is removed (the
    name, never what a symlink points to), so the caller builds the file afresh; ``False``
    when it cannot be removed (then the caller does without the file).
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        return True
    try:
        path.unlink()
    except OSError:
        return False
    return True


def make_private(path: Path) -> None:
    """After a library wrote ``path`` (under whatever umask): ours alone to write."""
    try:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() \
                and stat.S_IMODE(info.st_mode) & 0o077:
            path.chmod(0o600)
    except OSError:
        pass


class TreeCache:
    """Parse trees in one private directory, by expression text."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, text: str) -> Path:
        return self.directory / (hashlib.sha256(text.encode()).hexdigest() + ".json")

    def get(self, text: str) -> Node | None:
        """The tree stored for ``text``; None when there is none or it cannot be used."""
        try:
            fd = os.open(self._path(text), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as file:  # a symlink planted here is a miss
                document = json.loads(file.read())
            if not isinstance(document, dict) or document.get("expression") != text:
                return None
            return decode(document["tree"])
        except (OSError, ValueError, TypeError, KeyError, RecursionError):
            return None

    def put(self, text: str, tree: Node) -> None:
        """Store the tree of ``text``; a failure only means the next run parses again."""
        try:
            data = json.dumps({"expression": text, "tree": encode(tree)},
                              separators=(",", ":")).encode()
            fd, scratch = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                Path(scratch).replace(self._path(text))
            except BaseException:
                Path(scratch).unlink(missing_ok=True)
                raise
            self._prune()
        except (OSError, ValueError, RecursionError):
            pass

    def _prune(self) -> None:
        """Keep the directory small: past :data:`LIMIT` files, remove the older half."""
        entries = list(os.scandir(self.directory))
        if len(entries) <= LIMIT:
            return
        by_age = sorted(entries, key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
        for entry in by_age[:len(by_age) // 2]:
            Path(entry.path).unlink(missing_ok=True)


def encode(node: Node | lark.Token) -> list[Any]:
    """A tree as nested lists: ``[data, meta, children]``, a token as its eight fields."""
    if isinstance(node, lark.Token):
        return [node.type, node.value, node.start_pos, node.line, node.column,
                node.end_line, node.end_column, node.end_pos]
    # A rule's name: a plain str from cached LALR tables, a Token from freshly built ones;
    # both compare equal, and decoding gives the plain str.
    if not isinstance(node.data, str):
        raise ValueError("unexpected tree label")
    meta = None
    if node._meta is not None:  # Lark sets it only with positions; keep it absent otherwise
        meta = {k: v for k, v in vars(node._meta).items() if k in _META_FIELDS}
    return [str(node.data), meta, [encode(child) for child in node.children]]


def decode(value: Any) -> Node:
    """The tree :func:`encode` made; ValueError when ``value`` is not one."""
    node = _decode(value)
    if not isinstance(node, lark.Tree):
        raise ValueError("not a tree")
    return node


def _decode(value: Any) -> Node | lark.Token:
    if not isinstance(value, list):
        raise ValueError("not a node")
    if len(value) == _TOKEN_FIELDS:
        kind, text, *positions = value
        if not (isinstance(kind, str) and isinstance(text, str)
                and all(p is None or type(p) is int for p in positions)):
            raise ValueError("bad token")
        return lark.Token(kind, text, *positions)
    if len(value) != 3:
        raise ValueError("bad node")
    data, meta, children = value
    if not isinstance(data, str) or not isinstance(children, list):
        raise ValueError("bad tree")
    tree: Node = lark.Tree(data, [_decode(child) for child in children])
    if meta is not None:
        if not isinstance(meta, dict) or not set(meta) <= _META_FIELDS or not all(
                v is None or type(v) in (int, bool) for v in meta.values()):
            raise ValueError("bad positions")
        for field, position in meta.items():
            setattr(tree.meta, field, position)
    return tree
