"""A directory tree of the host as two paths: where the host sees it, where we see it.

The driver root and the device root are such trees: a containerised daemon reads them under
a mount (``/driver-root``) while CDI specs and the container runtime name the host's paths
(``/run/nvidia/driver``). Symlinks are followed *inside* the tree: an absolute link in a
driver container's tree means that tree's file, not this process's.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_SYMLINK_HOPS = 40
Identity = tuple[str, int, int]
"""``(path, inode, mtime ns)`` of a directory: changes when entries are added or replaced."""


@dataclass(frozen=True)
class HostTree:
    host: Path
    """The tree as the host (and so the container runtime) sees it."""
    local: Path
    """The same tree as this process sees it."""
    _listings: dict[str, list[str]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, host: Path, local: Path | None = None) -> HostTree:
        return cls(host, local if local is not None else host)

    def host_path(self, rel: str) -> str:
        """The host's path of tree-relative ``rel`` (``/dev/nvidia0``)."""
        return str(self.host / rel.lstrip("/"))

    def local_path(self, rel: str) -> Path:
        return self.local / rel.lstrip("/")

    def forget(self) -> None:
        """Drop cached directory listings (the tree changed)."""
        self._listings.clear()

    def find(self, dirs: Sequence[str], pattern: str) -> list[tuple[str, str]]:
        """``(path, real path)`` in the tree for ``pattern``, from the first of ``dirs``
        that has it; dangling entries are skipped."""
        for d in dirs:
            found = []
            for name in fnmatch.filter(self._listing(d), pattern):
                rel = f"/{d}/{name}"
                real = self.resolve(rel)
                if real is not None:
                    found.append((rel, real))
            if found:
                return found
        return []

    def _listing(self, d: str) -> list[str]:
        if d not in self._listings:
            # Listed, not globbed: glob drops symlinks that dangle from this process's
            # point of view, which absolute links inside a driver container's tree do.
            try:
                self._listings[d] = sorted(p.name for p in self.local_path(d).iterdir())
            except OSError:
                self._listings[d] = []
        return self._listings[d]

    def resolve(self, path: str) -> str | None:
        """Follow symlinks inside the tree: absolute targets are relative to its top.

        The runtime resolves a host path on the host, where an absolute link in a driver
        container's tree would point outside it; so mounts name the real file.
        """
        pending = [p for p in path.split("/") if p]
        resolved: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part in (".", ".."):
                if part == ".." and resolved:
                    resolved.pop()
                continue
            candidate = self.local.joinpath(*resolved, part)
            if candidate.is_symlink():
                hops += 1
                if hops > _SYMLINK_HOPS:
                    return None
                target = str(candidate.readlink())
                if target.startswith("/"):
                    resolved = []
                pending = [p for p in target.split("/") if p] + pending
            elif candidate.exists():
                resolved.append(part)
            else:
                return None
        return "/" + "/".join(resolved)

    def watch(self, dirs: Iterable[str]) -> tuple[str, ...]:
        """Local paths whose :func:`identity` changes when ``dirs`` do (computed once per
        discovery: identity runs per use).

        A directory that is not there is watched through its nearest ancestor that is:
        creating it adds an entry there, which changes that ancestor's mtime. Most of the
        searched directories are missing on any one layout, so this saves a ``stat`` per
        missing directory per kubelet call.
        """
        top = str(self.local)
        return tuple(dict.fromkeys(_watchable(str(self.local_path(d)), top) for d in dirs))


def _watchable(path: str, top: str) -> str:
    """``path``, or when nothing is there its nearest ancestor that is a directory (up to
    ``top``, the tree itself, which is watched as it is even when missing)."""
    current = path
    while current != top and len(current) > len(top):
        try:
            os.lstat(current)
        except FileNotFoundError:
            current = os.path.dirname(current)  # noqa: PTH120 - paths as identity takes them
            continue
        except OSError:
            return path
        break
    if current == path:
        return path
    try:
        # A dangling link or a file where a directory should be: watch the path itself, as
        # its ancestor's mtime would not change when the link's target appears.
        return current if stat.S_ISDIR(os.stat(current).st_mode) else path  # noqa: PTH116
    except OSError:
        return path


def identity(paths: Iterable[str]) -> tuple[Identity, ...]:
    """What tells changed directories from unchanged ones, at one ``stat`` call each."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)  # noqa: PTH116 - per prepare: no Path objects
        except OSError:
            continue
        out.append((path, st.st_ino, st.st_mtime_ns))
    return tuple(out)
