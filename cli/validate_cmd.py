"""``gpudra validate``: check DeviceClasses and claims offline, like the apiserver and better.

Prints ``file:path: message`` per problem (exit status 1), or one OK line (exit status 0);
``-o json|yaml`` prints the same as one document. Warnings (``file:path: warning: …``) do not
fail the run; a file that cannot be read is exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudra.cli.options import env
from gpudra.cli.output import (
    EXIT_FOUND,
    EXIT_OK,
    EXIT_STATUS_HELP,
    EXIT_USAGE,
    UsageError,
    add_output_flag,
    emit,
)

# The checks (CEL, YAML) are imported by the functions that run them, so `validate --help`
# and `gpudra --help` do not pay for importing them.

DEFAULT_DRIVER = "gpu.nvidia.com"


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "validate", help="check DeviceClasses and ResourceClaims (and their CEL) offline",
        description="Check DeviceClasses, ResourceClaims, ResourceClaimTemplates and the "
                    "resourceClaims of Pods against the resource.k8s.io/v1 limits, compile "
                    "every CEL selector, and check the attributes and capacities it reads "
                    "against what this driver publishes.",
        epilog=EXIT_STATUS_HELP)
    parser.add_argument("files", metavar="FILE", nargs="+", type=Path,
                        help="YAML (possibly multi-document), a folder of it as kubectl apply "
                             "-f reads one, or - for standard input")
    parser.add_argument("--driver-name", default=env("DRIVER_NAME", DEFAULT_DRIVER),
                        help="DRA driver name (env DRIVER_NAME; default gpu.nvidia.com)")
    add_output_flag(parser, "the problems and what was checked, as one document")
    parser.set_defaults(run=run)


@dataclass(frozen=True)
class Finding:
    """One problem: in an object (``path`` is its field), or an unreadable file."""

    file: str
    path: str | None
    message: str
    warning: bool = False
    object: str | None = None
    several: bool = False
    """The file holds several objects: the text line names this one."""
    refused: bool = False
    """The apiserver refuses the object for it at create (else: scheduling or prepare)."""

    def line(self, wide: bool) -> str:
        if self.path is None:
            return self.message  # it names the file already
        where = f" ({self.object})" if self.object and (self.several or wide) else ""
        severity = "warning: " if self.warning else ""
        return f"{self.file}:{self.path}: {severity}{self.message}{where}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "path": self.path,
                "severity": "warning" if self.warning else "error",
                "message": self.message, "object": self.object,
                "refusedAtCreate": self.refused}


def _count(n: int, kind: str) -> str:
    if n == 1:
        return f"1 {kind}"
    return f"{n} {kind}{'es' if kind.endswith('s') else 's'}"


def _check(path: Path, driver: str, kinds: Counter[str]) -> list[Finding]:
    from gpudra.cli import manifests
    from gpudra.scheduling.validate import (
        CHECKED_KINDS,
        object_label,
        objects,
        pod_spec,
        validate_object,
    )

    try:
        documents = manifests.read_documents(path)
    except UsageError as exc:
        return [Finding(str(path), None, str(exc))]
    items = [o for o in objects(documents)
             if o.get("kind") in CHECKED_KINDS or pod_spec(o) is not None]
    findings = []
    for obj in items:
        kinds[str(obj.get("kind"))] += 1
        for problem in validate_object(obj, driver=driver):
            findings.append(Finding(str(path), problem.path, problem.message, problem.warning,
                                    object_label(obj), len(items) > 1,
                                    problem.structural and not problem.warning))
    return findings


def _summary(kinds: Counter[str], files: int, errors: int) -> str:
    if errors:
        return f"{errors} problem{'s' if errors != 1 else ''} found"
    if not kinds:
        return ("OK: nothing to check (no DeviceClass, ResourceClaim, ResourceClaimTemplate or "
                "Pod with resourceClaims)")
    checked = ", ".join(_count(n, kind) for kind, n in sorted(kinds.items()))
    return f"OK: {checked} in {files} file{'s' if files != 1 else ''}"


def _when(errors: int, refused: int) -> str:
    """When the problems would show: at ``kubectl apply``, or only later."""
    if refused == errors:
        return f"the apiserver would refuse {'it' if errors == 1 else 'them'} at create"
    if refused:
        return (f"the apiserver would refuse {refused} of them at create, the others fail at "
                "scheduling or prepare time")
    return "the apiserver would accept " + (
        "it: it fails" if errors == 1 else "them: they fail") + " at scheduling or prepare time"


def run(args: argparse.Namespace) -> int:
    from gpudra.cli import manifests

    kinds: Counter[str] = Counter()
    files = manifests.expand(args.files)
    findings = [f for path in files for f in _check(path, args.driver_name, kinds)]
    errors = sum(not f.warning for f in findings)
    unreadable = any(f.path is None for f in findings)
    code = EXIT_USAGE if unreadable else EXIT_FOUND if errors else EXIT_OK
    summary = _summary(kinds, len(files), errors)
    refused = sum(f.refused for f in findings)
    if args.output in ("json", "yaml"):
        emit({"ok": not errors, "summary": summary, "files": len(files),
              "refusedAtCreate": refused, "checked": dict(sorted(kinds.items())),
              "problems": [f.to_json() for f in findings]}, args.output)
        return code
    for finding in findings:
        print(finding.line(wide=args.output == "wide"))
    if errors:
        summary += f"; {_when(errors, refused)}"
    print(summary, file=sys.stderr if errors else sys.stdout)
    return code
