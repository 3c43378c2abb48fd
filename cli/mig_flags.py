"""``--dynamic-mig-gpus``, ``--dynamic-mig-profiles``, ``--dynamic-mig-placements``: which
MIG devices made on demand a node publishes (``gpudra node``, ``gpudra inventory``).

The default offers none: under a 1.36 scheduler every node that publishes dynamic MIG
(a shared counter set) makes every other node's Filter slower, so it is the admin's choice
per GPU (``gpudra.driver.mig_offer`` says what each value costs)."""

from __future__ import annotations

import argparse

from gpudra.cli.options import CliError, env, feature_gates
from gpudra.driver.mig_offer import PLACEMENTS, MigOffer, MigOfferError, parse_offer


def add_mig_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dynamic-mig-gpus", metavar="all|none|LIST",
                        default=env("DYNAMIC_MIG_GPUS"),
                        help="GPUs that offer MIG devices made on demand (class "
                             "mig.nvidia.com): all, none, or comma-separated minor numbers "
                             "or UUIDs (env DYNAMIC_MIG_GPUS; default none, or all when "
                             "--feature-gates says DynamicMIG=true, as NVIDIA's driver "
                             "reads it: under a 1.36 scheduler each node offering them "
                             "slows every node's scheduling; needs the DynamicMIG gate)")
    parser.add_argument("--dynamic-mig-profiles", metavar="all|LIST",
                        default=env("DYNAMIC_MIG_PROFILES", "all"),
                        help="the profiles they offer: all, or comma-separated names such as "
                             "1g.10gb,3g.40gb (env DYNAMIC_MIG_PROFILES; default all)")
    parser.add_argument("--dynamic-mig-placements", metavar="|".join(PLACEMENTS),
                        default=env("DYNAMIC_MIG_PLACEMENTS", "all"),
                        help="all: every placement beside the full GPU, kept apart by "
                             "shared counters; disjoint: one fixed set of placements that "
                             "never overlap and no full GPU on that GPU, no counters (env "
                             "DYNAMIC_MIG_PLACEMENTS; default all)")
    parser.add_argument("--allow-mig-mode-change", metavar="all|none|LIST",
                        default=env("ALLOW_MIG_MODE_CHANGE", "none"),
                        help="GPUs before Hopper (A100, A30) whose MIG mode may be switched "
                             "on for a MIG claim, which needs a GPU reset: all, none, or "
                             "comma-separated minor numbers or UUIDs (env "
                             "ALLOW_MIG_MODE_CHANGE; default none: such a GPU with MIG mode "
                             "off offers its full GPU only)")


def mig_offer(args: argparse.Namespace) -> MigOffer:
    """The parsed flags; a bad value is a one-line CliError naming the flag and its env."""
    gpus = args.dynamic_mig_gpus
    if gpus is None:
        # Asked for by name (a values file written for NVIDIA's chart): every GPU, as there.
        gpus = "all" if feature_gates(args).values.get("DynamicMIG") is True else "none"
    try:
        return parse_offer(gpus, args.dynamic_mig_profiles, args.dynamic_mig_placements,
                           args.allow_mig_mode_change)
    except MigOfferError as exc:
        flag = str(exc).split(":", 1)[0]
        name = flag.removeprefix("--").upper().replace("-", "_")
        raise CliError(f"{exc} (env {name})") from None
