"""The YAML a command reads, named like ``kubectl apply -f``: files, folders, or ``-``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpudra.cli.output import UsageError

# What kubectl reads from a folder (not recursively).
SUFFIXES = (".yaml", ".yml", ".json")
STDIN = Path("-")


def expand(paths: Sequence[Path]) -> list[Path]:
    """Each folder replaced by its manifest files, sorted; files and ``-`` kept as given."""
    files: list[Path] = []
    for path in paths:
        if path != STDIN and path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
            if not found:
                raise UsageError(f"{path}: no {', '.join(SUFFIXES)} files in this folder")
            files.extend(found)
        else:
            files.append(path)
    return files


def read_documents(path: Path) -> list[Any]:
    """Every YAML document of one file (``-``: standard input); unreadable: UsageError."""
    try:
        text = sys.stdin.read() if path == STDIN else path.read_text()
        return list(yaml.safe_load_all(text))
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not a text file ({exc.reason})") from exc
