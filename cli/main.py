"""``gpudra`` console script: subcommands for the node daemon, inventory, tooling and demo."""

from __future__ import annotations

import argparse
import importlib
import io
import sys
from collections.abc import Sequence
from contextlib import redirect_stderr
from pathlib import Path
from typing import NoReturn

from gpudra.cli.options import CliError
from gpudra.cli.output import (
    EXIT_STATUS_HELP,
    STRUCTURED,
    UsageError,
    exit_code,
    report_error,
    requested_format,
)

# Subcommand → module. Only the module of the command being run is imported, so the node
# daemon does not pay for the CEL and allocator imports of `explain` at start-up.
COMMANDS = {
    "inventory": "inventory_cmd",
    "explain": "explain_cmd",
    "validate": "validate_cmd",
    "node": "node_cmd",
    "controller": "controller_cmd",
    "compute-domain-node": "compute_domain_node_cmd",
    "compute-domain-daemon": "compute_domain_daemon_cmd",
    "wait-for-driver": "wait_for_driver_cmd",
    "mps-control-daemon": "mps_daemon_cmd",
    "sim": "sim_cmd",
    "top": "top_cmd",
    "demo": "demo_cmd",
    "completion": "completion",
}


def program_name(argv0: str) -> str:
    """``kubectl gpudra`` when kubectl runs us as its plugin ``kubectl-gpudra``."""
    return "kubectl gpudra" if Path(argv0).name.startswith("kubectl-gpudra") else "gpudra"


class _Version(argparse.Action):
    """``--version``: the distribution's metadata is read only when asked (importing
    ``importlib.metadata`` would slow every command)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from gpudra.cli.version import version

        print(f"gpudra {version()}")  # to stdout, as argparse's own version action does
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """A usage error is one line naming the flag, not the usage: ``gpudra node``'s usage is a
    screenful, and a crash-looping pod's log would show only its end."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None, prog: str = "gpudra") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Kubernetes DRA driver for NVIDIA GPUs (with a simulated GPU node).",
        epilog=EXIT_STATUS_HELP,
    )
    parser.add_argument("--version", action=_Version,
                        help="show program's version number and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"gpudra.cli.{module}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    prog = program_name(sys.argv[0])
    first = next((w for w in words if not w.startswith("-")), None)
    command = first if first in COMMANDS else None
    fmt = requested_format(words)
    try:
        parser = build_parser(command, prog)
        args = _parse(parser, words, structured=fmt in STRUCTURED)
        command = args.command
        result: int = args.run(args)
    except CliError as exc:
        report_error(command, str(exc), exit_code(exc), fmt, prog)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gpudra inventory | head`
        sys.stderr.close()
        return 0
    return result


def _parse(parser: argparse.ArgumentParser, words: list[str],
           structured: bool) -> argparse.Namespace:
    """Parse; under ``-o json|yaml`` a usage error becomes a UsageError (a document)."""
    if not structured:
        return parser.parse_args(words)
    captured = io.StringIO()
    try:
        with redirect_stderr(captured):
            return parser.parse_args(words)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        lines = captured.getvalue().strip().splitlines() or ["usage error"]
        raise UsageError(lines[-1].partition(": error: ")[2] or lines[-1]) from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
