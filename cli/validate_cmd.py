"""``gpudra validate``: check DeviceClasses and claims offline, like the apiserver and better.

Prints ``file:path: message`` per problem (exit status 1), or one OK line (exit status 0).
Warnings (``file:path: warning: …``) do not fail the run.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from gpudra.cli.options import env
from gpudra.scheduling.validate import (
    CHECKED_KINDS,
    object_label,
    objects,
    pod_spec,
    validate_object,
)

DEFAULT_DRIVER = "gpu.nvidia.com"


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "validate", help="check DeviceClasses and ResourceClaims (and their CEL) offline",
        description="Check DeviceClasses, ResourceClaims, ResourceClaimTemplates and the "
                    "resourceClaims of Pods against the resource.k8s.io/v1 limits, compile "
                    "every CEL selector, and check the attributes and capacities it reads "
                    "against what this driver publishes. Exit status 1 on any problem.")
    parser.add_argument("files", metavar="FILE", nargs="+", type=Path)
    parser.add_argument("--driver-name", default=env("DRIVER_NAME", DEFAULT_DRIVER),
                        help="DRA driver name (env DRIVER_NAME; default gpu.nvidia.com)")
    parser.set_defaults(run=run)


def _documents(path: Path) -> tuple[list[Any], str | None]:
    try:
        return list(yaml.safe_load_all(path.read_text())), None
    except OSError as exc:
        return [], f"{path}: {exc.strerror or exc}"
    except yaml.YAMLError as exc:
        return [], f"{path}: not valid YAML: {exc}"


def _count(n: int, kind: str) -> str:
    if n == 1:
        return f"1 {kind}"
    return f"{n} {kind}{'es' if kind.endswith('s') else 's'}"


def run(args: argparse.Namespace) -> int:
    kinds: Counter[str] = Counter()
    errors = 0
    for path in args.files:
        documents, failure = _documents(path)
        if failure is not None:
            print(failure)
            errors += 1
            continue
        items = [o for o in objects(documents)
                 if o.get("kind") in CHECKED_KINDS or pod_spec(o) is not None]
        for obj in items:
            kinds[str(obj.get("kind"))] += 1
            where = f" ({object_label(obj)})" if len(items) > 1 else ""
            for problem in validate_object(obj, driver=args.driver_name):
                severity = "warning: " if problem.warning else ""
                print(f"{path}:{problem.path}: {severity}{problem.message}{where}")
                errors += not problem.warning
    if errors:
        print(f"{errors} problem{'s' if errors != 1 else ''} found", file=sys.stderr)
        return 1
    if not kinds:
        print("OK: nothing to check (no DeviceClass, ResourceClaim, ResourceClaimTemplate or "
              "Pod with resourceClaims)")
        return 0
    summary = ", ".join(_count(n, kind) for kind, n in sorted(kinds.items()))
    print(f"OK: {summary} in {len(args.files)} file{'s' if len(args.files) != 1 else ''}")
    return 0
