"""The installed distribution's version, for ``gpudra --version`` and start-up logs.

Read from the distribution's metadata file, found on ``sys.path`` where
``importlib.metadata`` finds it, without importing that module: with the ``email``,
``zipfile`` and ``csv`` modules it imports, it would add to the node daemon's memory for
the one line the daemon logs at start.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

NAME = "gpudra"
UNKNOWN = "0+unknown"
"""When run from a checkout that was never installed."""


def _metadata_files() -> Iterator[Path]:
    """``<name>-<version>.dist-info/METADATA`` or ``<name>[-…].egg-info/PKG-INFO`` in each
    ``sys.path`` folder, in ``sys.path`` order (what importlib.metadata looks for)."""
    for entry in sys.path:
        try:
            names = sorted(child.name for child in Path(entry or ".").iterdir())
        except OSError:  # missing, or a zip file (none holds our metadata)
            continue
        for name in names:
            stem, _, suffix = name.lower().rpartition(".")
            if suffix in ("dist-info", "egg-info") and (
                    stem == NAME or stem.startswith(f"{NAME}-")):
                yield Path(entry or ".", name, "METADATA" if suffix == "dist-info" else "PKG-INFO")


def version() -> str:
    for path in _metadata_files():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        for line in text.splitlines():
            if not line:
                break  # the headers end at the first empty line; the description follows
            key, _, value = line.partition(":")
            if key.strip().lower() == "version":
                return value.strip()
    return UNKNOWN
