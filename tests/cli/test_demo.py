"""``gpudra demo`` runs to completion and cleans up after itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end_and_leaves_nothing_behind():
    before = set(Path("/tmp").glob("gd-demo-*"))
    done = subprocess.run([sys.executable, "-m", "gpudra.cli.main", "demo"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "published 9 ResourceSlices" in out
    assert "208 devices" in out
    for scenario in ("single-gpu", "mig-1g-dynamic", "two-mig-same-gpu", "exclusive-compute",
                     "mps"):
        line = next(x for x in out.splitlines() if scenario in x)
        assert "→ prepared" in line, line
    assert "0 MIG devices" in out and "CDI specs left: 0" in out
    assert 'gpudra_mig_operations_total{operation="create",outcome="ok"} 3.0' in out
    assert "sockets left behind: none" in out
    assert set(Path("/tmp").glob("gd-demo-*")) == before
