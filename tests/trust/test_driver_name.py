"""The driver name names the plugin's directory, its sockets and its CDI specs: a name that
is not a DNS subdomain stops ``gpudra node`` with one line, before anything is created."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.daemon import ROOT


@pytest.mark.parametrize("name", ["../../etc", "GPU.nvidia.com", "a/b", "x" * 64])
def test_a_driver_name_that_is_not_a_dns_subdomain_stops_the_daemon(tmp_path: Path,
                                                                    name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpudra.cli.main", "node", "--driver-name", name,
         "--node-name", "node-a", "--simulate", "dgx-h100", "--sim-state", str(tmp_path / "s"),
         "--plugins-dir", str(tmp_path / "plugins"), "--registrar-dir", str(tmp_path / "reg"),
         "--cdi-root", str(tmp_path / "cdi"), "--http-address", "", "--log-format", "console"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1, done
    assert "--driver-name (env DRIVER_NAME)" in done.stdout + done.stderr
    assert "is not a valid DNS subdomain" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
