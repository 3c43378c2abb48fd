"""How commands print: ``-o table|wide|json|yaml``, aligned tables, structured errors and
the exit statuses every command shares."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, Final, Literal, TextIO

from gpudra.cli.options import CliError

OutputFormat = Literal["table", "wide", "json", "yaml"]
OUTPUT_FORMATS: Final[tuple[OutputFormat, ...]] = ("table", "wide", "json", "yaml")
STRUCTURED: Final = ("json", "yaml")

EXIT_OK: Final = 0
EXIT_FOUND: Final = 1
"""Not allocatable, invalid input found, or the command failed (cluster, NVML, daemon)."""
EXIT_USAGE: Final = 2
"""A usage error or unreadable input: a wrong flag or value, a missing file, not YAML."""

EXIT_STATUS_HELP: Final = (
    "exit status: 0 ok; 1 not allocatable, invalid input found, or the command failed; "
    "2 usage error or unreadable input")


class UsageError(CliError):
    """A wrong flag or value, or input that cannot be read: exit status 2."""

    exit_code = EXIT_USAGE


def exit_code(error: CliError) -> int:
    return int(getattr(error, "exit_code", EXIT_FOUND))


def add_output_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``-o/--output``; ``what`` says what json and yaml print."""
    parser.add_argument("-o", "--output", choices=OUTPUT_FORMATS, default="table",
                        help=f"table (default), wide (more columns), or json|yaml: {what}")


def requested_format(words: Sequence[str]) -> str | None:
    """The ``-o`` value in raw arguments, before (or when) argparse cannot parse them."""
    for i, word in enumerate(words):
        if word in ("-o", "--output") and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--output="):
            return word.partition("=")[2]
        if word.startswith("-o") and not word.startswith("--") and len(word) > 2:
            return word[2:]
    return None


def emit(document: Any, fmt: str, out: TextIO | None = None) -> None:
    """A document as JSON (indented) or YAML (keys in document order)."""
    out = out or sys.stdout
    if fmt == "json":
        json.dump(document, out, indent=2)
        out.write("\n")
    else:
        import yaml  # here: every command imports this module, few print YAML

        # Documents share objects (one attribute dict for many devices); PyYAML would print
        # them as &id001 anchors and *id001 aliases, which kubectl users do not expect and
        # some tools refuse. Every object is written out in full instead.
        class Dumper(yaml.SafeDumper):
            def ignore_aliases(self, data: Any) -> bool:
                return True

        yaml.dump(document, out, Dumper=Dumper, sort_keys=False)


def error_document(command: str | None, message: str, code: int) -> dict[str, Any]:
    """What ``-o json|yaml`` prints instead of the one-line error."""
    return {"error": {"command": command, "message": message, "exitCode": code}}


def report_error(command: str | None, message: str, code: int, fmt: str | None,
                 prog: str = "gpudra") -> None:
    """The error as a document on stdout under ``-o json|yaml``, else one line on stderr."""
    if fmt in STRUCTURED:
        emit(error_document(command, message, code), fmt)
    else:
        print(f"{prog} {command}: {message}" if command else f"{prog}: {message}",
              file=sys.stderr)


def plain_text(docstring: str | None) -> str:
    """A module docstring as ``--help`` text: reStructuredText markup removed."""
    text = re.sub(r":(?:class|func|meth|mod|attr):`~?([^`]+)`", r"\1", docstring or "")
    return text.replace("``", "").strip()


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, kubectl style; no trailing blanks."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]]
