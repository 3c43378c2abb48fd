"""``gpudra sim`` drives the GPU recovery action the simulated driver reports: with an XID,
on its own (or a driver without the field), and a GPU reset that clears it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudra.cli.main import main
from gpudra.driver import sim


def recovery_actions(state: Path) -> list[int | None]:
    return [g["recovery_action"] for g in sim.SimControl(state).snapshot()["gpus"]]


def test_xid_recovery_action_and_reset(tmp_path, capsys):
    state = tmp_path / "sim"
    sim.install("l4-x4", state)
    try:
        assert main(["sim", "xid", "--gpu", "1", "--xid", "48", "--recovery-action",
                     "gpu-reset", "--sim-state", str(state)]) == 0
        assert recovery_actions(state) == [0, 1, 0, 0]
        assert main(["sim", "recovery-action", "--gpu", "2", "--action", "node-reboot",
                     "--sim-state", str(state)]) == 0
        assert "reports recovery action node-reboot" in capsys.readouterr().out
        assert main(["sim", "reset-gpu", "--gpu", "1", "--sim-state", str(state)]) == 0
        assert recovery_actions(state) == [0, 0, 2, 0]
        assert main(["sim", "recovery-action", "--gpu", "3", "--action", "unsupported",
                     "--sim-state", str(state)]) == 0
        assert recovery_actions(state)[3] is None
        # an XID cannot carry an action the driver does not report
        assert main(["sim", "xid", "--gpu", "3", "--xid", "48", "--recovery-action",
                     "gpu-reset", "--sim-state", str(state)]) == 1
        assert "--recovery-action: GPU 3's driver does not offer" in capsys.readouterr().err
    finally:
        sim.uninstall()


def test_bad_actions_are_usage_errors(tmp_path, capsys):
    state = tmp_path / "sim"
    sim.install("l4-x4", state)
    try:
        with pytest.raises(SystemExit) as usage:
            main(["sim", "recovery-action", "--gpu", "0", "--action", "reboot-please",
                  "--sim-state", str(state)])
        assert usage.value.code == 2
        assert "'reboot-please' is not a recovery action" in capsys.readouterr().err
        with pytest.raises(SystemExit) as usage:
            main(["sim", "xid", "--gpu", "0", "--xid", "48", "--recovery-action",
                  "unsupported", "--sim-state", str(state)])
        assert usage.value.code == 2
        assert recovery_actions(state) == [0, 0, 0, 0]  # nothing changed
    finally:
        sim.uninstall()
