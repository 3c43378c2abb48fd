"""``gpudra wait-for-driver``, the chart's init container: exit 0 once the driver is ready,
exit 1 with the diagnosis after ``--timeout``."""

from __future__ import annotations

import pytest

from gpudra.cli.main import main
from gpudra.driver.sim.driver_root import populate_driver_root


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("DRIVER_ROOT", "DEV_ROOT", "WAIT_TIMEOUT", "LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)


def test_ready_driver_exits_zero(tmp_path):
    populate_driver_root(tmp_path / "driver", [0], layout="gke", dev_root=tmp_path / "dev")
    assert main(["wait-for-driver", f"--driver-root={tmp_path}/driver",
                 f"--dev-root={tmp_path}/dev", "--timeout=1"]) == 0


def test_missing_driver_times_out_with_the_diagnosis(tmp_path, monkeypatch, capsys):
    (tmp_path / "driver").mkdir()  # empty roots: what is missing under them, file by file
    (tmp_path / "dev").mkdir()
    monkeypatch.setenv("DRIVER_ROOT", str(tmp_path / "driver"))
    monkeypatch.setenv("DEV_ROOT", str(tmp_path / "dev"))
    assert main(["wait-for-driver", "--timeout=0.1", "--interval=0.05"]) == 1
    err = capsys.readouterr().err
    assert "NVIDIA driver not ready after 0.1s" in err
    assert f"/dev/nvidiactl not found under device root {tmp_path}/dev" in err


@pytest.mark.parametrize(("flag", "message"), [
    ("--timeout=-1", "--timeout (env WAIT_TIMEOUT): '-1': need seconds >= 0"),
    ("--interval=0", "--interval: '0': need seconds > 0"),
    ("--timeout=soon", "--timeout (env WAIT_TIMEOUT): 'soon' is not a number of seconds"),
])
def test_bad_durations_are_one_line_errors(tmp_path, capsys, flag, message):
    assert main(["wait-for-driver", flag]) == 1
    assert message in capsys.readouterr().err
