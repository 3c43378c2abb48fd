"""``gpudra`` console script: subcommands for the node daemon, inventory, tooling and demo."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpudra.cli.options import CliError

# Subcommand → module. Only the module of the command being run is imported, so the node
# daemon does not pay for the CEL and allocator imports of `explain` at start-up.
COMMANDS = {
    "inventory": "inventory_cmd",
    "explain": "explain_cmd",
    "validate": "validate_cmd",
    "node": "node_cmd",
    "sim": "sim_cmd",
    "demo": "demo_cmd",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpudra",
        description="Kubernetes DRA driver for NVIDIA GPUs (with a simulated GPU node).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"gpudra.cli.{module}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    first = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS else None)
    args = parser.parse_args(words)
    try:
        result: int = args.run(args)
    except CliError as exc:
        print(f"gpudra {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gpudra inventory | head`
        sys.stderr.close()
        return 0
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
