"""What checking untrusted input at the daemon's edge costs per claim (issue 27 items 1, 5).

Times, in this process, the checks every kubelet call now runs: a claim's namespace, name
and uid (``claim_problems``, valid, and refused with its message), the schema and
identifier checks of a fetched claim (``decode_claim`` on claims of one GPU, and of two
devices with an MPS config), and the bounded JSON decoding of an API answer against plain
``json.loads`` (a claim; an 86 KB body with more brackets than the bound, which takes the
depth scan). ``--old REV`` also times ``decode_claim`` as it was at that git revision, on
the same claims and in the same run (A/B: the VM's speed drifts).

    PYTHONPATH=. .venv/bin/python -m bench.trust_edge [--old f45f758] [--repeat 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudra.api import bounded_json
from gpudra.api.identifiers import claim_problems
from gpudra.kubeletplugin.claims.claim_decoding import decode_claim
from tests.integration.daemon import claim_object

UID = "0b0e3a9c-1d2e-4f30-8a4b-5c6d7e8f9a0b"
MPS = {"source": "FromClaim", "requests": [], "opaque": {"driver": "gpu.nvidia.com",
       "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                      "sharing": {"strategy": "MPS"}}}}


def claims() -> dict[str, dict[str, Any]]:
    out = {"1 GPU": claim_object("c", devices=["gpu-1"]),
           "2 devices + MPS config": claim_object("c", devices=["gpu-1", "gpu-2"],
                                                  configs=[MPS])}
    for obj in out.values():
        obj["metadata"].update(uid=UID, namespace="default")
        obj["status"]["reservedFor"] = [{"resource": "pods", "name": "pod-1", "uid": UID}]
    return out


def per_call(fn: Callable[[], object], repeat: int, number: int = 5000) -> float:
    """Microseconds per call, the best of ``repeat`` runs."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def old_decoder(rev: str) -> Callable[..., Any]:
    source = subprocess.run(["git", "show", f"{rev}:kubeletplugin/claims/claim_decoding.py"],
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_claim_decoding.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_claim_decoding", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.decode_claim  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", metavar="REV", help="also time decode_claim as of REV")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    ref = ("default", "my-claim", UID)

    hostile = ("default", "my-claim", "../../etc")
    rows = [("claim_problems, a valid claim", per_call(lambda: claim_problems(*ref),
                                                       args.repeat)),
            ("claim_problems, a path for uid", per_call(lambda: claim_problems(*hostile),
                                                        args.repeat))]
    old = old_decoder(args.old) if args.old else None
    for name, obj in claims().items():
        def new(obj: dict[str, Any] = obj) -> object:
            return decode_claim(obj, namespace="default", name="c", uid=UID,
                                driver="gpu.nvidia.com")
        rows.append((f"decode_claim, {name}", per_call(new, args.repeat)))
        if old is not None:
            def before(obj: dict[str, Any] = obj) -> object:
                return old(obj, namespace="default", name="c", uid=UID, driver="gpu.nvidia.com")
            rows.append((f"decode_claim at {args.old}, {name}", per_call(before, args.repeat)))
    body = json.dumps(claims()["2 devices + MPS config"]).encode()
    big = json.dumps({"items": [{"a": [{"b": str(i) * 5, "c": {"d": [1, 2, 3]}}
                                       for i in range(50)]} for _ in range(40)]}).encode()
    for label, data in ((f"a claim ({len(body)} B)", body), (f"a list ({len(big)} B)", big)):
        number = 5000 if len(data) < 10_000 else 50
        rows.append((f"json.loads, {label}", per_call(lambda d=data: json.loads(d),
                                                      args.repeat, number)))
        rows.append((f"bounded_json.loads, {label}", per_call(
            lambda d=data: bounded_json.loads(d), args.repeat, number)))
    width = max(len(name) for name, _ in rows)
    for name, micros in rows:
        print(f"{name:<{width}}  {micros:9.1f} µs")


if __name__ == "__main__":
    sys.exit(main())
