"""The two commands' input checks: a bad identifier or address is one line naming the flag,
and a node without a multi-node NVLink fabric cannot join a domain."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudra.cli.main import main

UID = "6b1f0f8e-3c1a-4b7e-9d2a-5e8f7a6b5c4d"
DAEMON = ["compute-domain-daemon", "--domain-uid", UID, "--domain-namespace", "default",
          "--domain-name", "training", "--node", "tray-a", "--address", "10.0.0.1"]


@pytest.mark.parametrize(("change", "says"), [
    (("--domain-uid", "../../etc"), "--domain-uid"),
    (("--domain-namespace", "Not_A_Namespace"), "--domain-namespace"),
    (("--node", "tray/a"), "--node"),
    (("--address", "10.0.0.1; rm -rf /"), "--address (env POD_IP)"),
])
def test_compute_domain_daemon_refuses_bad_identifiers(
        change: tuple[str, str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = list(DAEMON)
    args[args.index(change[0]) + 1] = change[1]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_a_node_without_a_fabric_cannot_join(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from gpudra.driver import sim

    try:
        assert main([*DAEMON, "--simulate", "dgx-h100", "--sim-state", str(tmp_path),
                     "--sim-network", str(tmp_path / "net")]) == 1
    finally:
        sim.uninstall()
    assert "no multi-node NVLink fabric" in capsys.readouterr().err


def test_compute_domain_node_refuses_bad_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compute-domain-node", "--channels", "0"]) == 1
    assert "--channels and --daemons" in capsys.readouterr().err
