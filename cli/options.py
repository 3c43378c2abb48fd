"""Flags shared by several subcommands, each with an environment-variable fallback."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from gpudra.driver.featuregates import FeatureGateError, FeatureGates, parse_feature_gates

if TYPE_CHECKING:
    from gpudra.driver.nvml import Nvml


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 1, no traceback."""


def env(name: str, default: str | None = None) -> str | None:
    """A flag's environment fallback, as text. Values that need parsing (numbers, lists)
    stay text in the parser and are parsed with the command's other checks, so a bad
    value is a one-line error naming the flag, from the flag or the environment alike."""
    return os.environ.get(name, default)


def add_driver_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--driver-name", default=env("DRIVER_NAME", "gpu.nvidia.com"),
                        help="DRA driver name (env DRIVER_NAME; default gpu.nvidia.com)")
    parser.add_argument("--node-name", default=env("NODE_NAME"),
                        help="this node's name (env NODE_NAME; default the host name)")
    parser.add_argument("--feature-gates", default=env("FEATURE_GATES", ""),
                        help="comma-separated Name=true|false (env FEATURE_GATES)")


def add_simulation_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--simulate", metavar="PROFILE", default=env("SIMULATE"),
                        help="use a simulated GPU node instead of real NVML (env SIMULATE)")
    parser.add_argument("--sim-state", metavar="DIR", type=Path, default=env("SIM_STATE"),
                        help="directory holding the simulated node's state (env SIM_STATE)")


def feature_gates(args: argparse.Namespace) -> FeatureGates:
    try:
        return parse_feature_gates(args.feature_gates)
    except FeatureGateError as exc:
        raise CliError(f"--feature-gates: {exc}") from exc


def node_name(args: argparse.Namespace) -> str:
    """``--node-name``, else the host name; lower case, as Kubernetes names are."""
    return str(args.node_name or os.uname().nodename).lower()


def check_simulate_profile(args: argparse.Namespace) -> None:
    """Refuse an unknown ``--simulate`` profile with the list of known ones."""
    if args.simulate:
        from gpudra.driver import sim

        if args.simulate not in sim.node_profiles():
            known = ", ".join(sim.node_profiles())
            raise CliError(f"--simulate: unknown node profile {args.simulate!r} "
                           f"(known: {known})")


@contextmanager
def nvml_session(args: argparse.Namespace) -> Iterator[Nvml]:
    """NVML for this command: real, or simulated with state in --sim-state (else a temp dir)."""
    # Imported here: every command imports this module, and NVML (pynvml, structlog) is
    # slow to import, which `gpudra validate` and `--help` do not need.
    from gpudra.driver.nvml import NvmlUnavailable, open_nvml

    with tempfile.TemporaryDirectory(prefix="gpudra-sim-") as scratch:
        state = args.sim_state or Path(scratch)
        check_simulate_profile(args)
        try:
            nvml = open_nvml(simulate=args.simulate, sim_state=state,
                             driver_root=getattr(args, "driver_root", None))
        except NvmlUnavailable as exc:
            raise CliError(str(exc)) from exc
        try:
            yield nvml
        finally:
            nvml.shutdown()
            if args.simulate:
                from gpudra.driver import sim

                sim.uninstall()
