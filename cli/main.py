"""``gpudra`` console script: subcommands for the node daemon, inventory, tooling and demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpudra.cli import demo_cmd, explain_cmd, inventory_cmd, node_cmd, sim_cmd, validate_cmd
from gpudra.cli.options import CliError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpudra",
        description="Kubernetes DRA driver for NVIDIA GPUs (with a simulated GPU node).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inventory_cmd.add_parser(sub)
    explain_cmd.add_parser(sub)
    validate_cmd.add_parser(sub)
    node_cmd.add_parser(sub)
    sim_cmd.add_parser(sub)
    demo_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
