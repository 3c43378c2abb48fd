"""``gpudra demo`` runs to completion and cleans up after itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # from an unrelated directory: the demo must not depend on where it is started
    return subprocess.run([sys.executable, "-m", "gpudra.cli.main", "demo", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


def test_demo_runs_end_to_end_and_leaves_nothing_behind(tmp_path):
    done = demo(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "published 9 ResourceSlices" in out
    assert "209 devices" in out  # 208 and GPU 7's shared device
    shares = [x for x in out.splitlines() if "a share of GPU 7" in x]
    assert len(shares) == 2 and all("→ prepared gpu-7-shared share" in x for x in shares)
    assert "MPS limits 0=16384M, 25% of the SMs" in shares[0]
    assert "MPS limits 0=40960M, 50% of the SMs" in shares[1]
    assert "→ one MPS control daemon for the shared GPU" in out
    for scenario in ("single-gpu", "mig-1g-dynamic", "two-mig-same-gpu", "exclusive-compute",
                     "mps"):
        line = next(x for x in out.splitlines() if scenario in x)
        assert "→ prepared" in line, line
    top = out.splitlines()[out.splitlines().index("   gpudra top (with simulated load on the "
                                                  "devices):") + 1:][:7]
    # MPS: where each shared GPU's control daemon runs (the demo's node shares one under MPS)
    assert top[0].split() == ["NAMESPACE", "CLAIM", "POD", "DEVICE", "SM%", "MEMORY", "POWER",
                              "IDLE", "MPS"]
    assert top[1].split()[1:5] == ["two-slices-one-gpu", "two-slices-one-gpu",
                                   "gpu-1-mig-1g10gb-19-3", "(1g.10gb)"]  # busiest first; GPM
    # figures for MIG; the POD column from the claim's reservedFor, as the scheduler sets it
    assert [row.split()[1] for row in top[1:]].count("two-slices-one-gpu") == 2
    assert "0 MIG devices" in out and "CDI specs left: 0" in out
    assert 'gpudra_mig_operations_total{operation="create",outcome="ok"} 3.0' in out
    assert "sockets left behind: none" in out
    # Its own directory only: another demo (another test run) may be using /tmp meanwhile.
    base = out.split("everything under ", 1)[1].split()[0]
    assert base.startswith("/tmp/gd-demo-") and not Path(base).exists()
    assert list(tmp_path.iterdir()) == []


def test_demo_stops_at_once_and_quotes_the_log_when_the_node_daemon_dies(tmp_path):
    done = demo(tmp_path, "--profile", "no-such-node")
    assert done.returncode == 1
    assert "the node process exited with status 1 before the ResourceSlices appeared" in \
        done.stderr
    assert "unknown node profile 'no-such-node'" in done.stderr
    base = done.stdout.split("everything under ", 1)[1].split()[0]
    assert base.startswith("/tmp/gd-demo-") and not Path(base).exists()
