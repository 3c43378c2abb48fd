"""A version number of hundreds of digits (in a selector's ``semver()``, or a slice's
``version`` attribute) is an error, as in Kubernetes (blang/semver keeps each number in a
uint64), and is never printed whole. The real ``gpudra explain`` process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLAIM = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: huge-version
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: >-
              device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("%s"))
"""


def explain(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpudra.cli.main", "explain", str(path), "--simulate", "dgx-h100",
         "--sim-state", str(path.parent / "sim")],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False)


@pytest.mark.parametrize(("version", "message"), [
    ("9" * 400 + ".0.0", "Major number of 400 digits is out of range (at most 2^64-1)"),
    ("1." + "9" * 5000 + ".0", "Minor number of 5000 digits is out of range"),
    ("18446744073709551616.0.0", "Major number 18446744073709551616 is out of range"),
], ids=["400-digits", "5000-digits", "2^64"])
def test_a_huge_version_number_is_an_error_named_not_printed(tmp_path, version, message):
    path = tmp_path / "claim.yaml"
    path.write_text(CLAIM % version)
    done = explain(path)
    assert done.returncode == 1, done.stderr
    assert message in done.stdout, done.stdout
    assert "Traceback" not in done.stderr
    assert "9" * 100 not in done.stdout + done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) < 400


def test_the_largest_version_number_still_compares(tmp_path):
    path = tmp_path / "claim.yaml"
    path.write_text(CLAIM % "18446744073709551615.0.0")
    done = explain(path)
    assert "is not greater than 18446744073709551615.0.0" in done.stdout, done.stdout
