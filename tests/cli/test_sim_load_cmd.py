"""``gpudra sim load`` on a simulated node's state directory."""

from __future__ import annotations

import pynvml
import pytest

from gpudra.cli.main import main
from gpudra.driver import sim


def test_load_on_a_gpu_for_a_while(simulate, sim_state, capsys):
    simulate("dgx-h100")
    control = sim.SimControl(sim_state)
    assert main(["sim", "load", "--sim-state", str(sim_state), "--gpu", "0", "--sm", "80",
                 "--memory", "20Gi", "--for", "1m"]) == 0
    [load] = control.snapshot()["gpus"][0]["loads"]
    assert (load["mig_uuid"], load["sm_percent"], load["memory_bytes"]) == (None, 80, 20 * 2**30)
    assert load["until"] is not None
    assert capsys.readouterr().out == (
        f"load on GPU 0 ({control.gpu_uuid(0)}): 80 % SM, 20.0 GiB for 60s\n")
    assert pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(0)).gpu == 80


def test_load_on_a_mig_device_replaces_the_previous_one(simulate, sim_state):
    simulate("dgx-a100-static-mig")
    control = sim.SimControl(sim_state)
    mig_uuid = control.snapshot()["gpus"][1]["gpu_instances"][0]["compute_instances"][0]["uuid"]
    for sm in ("30", "70"):
        assert main(["sim", "load", "--sim-state", str(sim_state), "--gpu", "1",
                     "--mig-uuid", mig_uuid, "--sm", sm]) == 0
    [load] = control.snapshot()["gpus"][1]["loads"]
    assert (load["mig_uuid"], load["sm_percent"], load["until"]) == (mig_uuid, 70, None)


@pytest.mark.parametrize(("args", "message"), [
    (["--sm", "120"], "--sm: must be within 0-100"),
    (["--sm", "10", "--memory", "lots"], "--memory: "),
    (["--sm", "10", "--for", "soon"], "--for: 'soon' is not a duration"),
])
def test_bad_values_name_the_flag(simulate, sim_state, capsys, args, message):
    simulate("l4-x4")
    with pytest.raises(SystemExit) as exc:
        main(["sim", "load", "--sim-state", str(sim_state), "--gpu", "0", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_gpu_in_mig_mode_needs_a_mig_device(simulate, sim_state, capsys):
    simulate("dgx-a100-static-mig")
    assert main(["sim", "load", "--sim-state", str(sim_state), "--gpu", "0", "--sm", "5"]) != 0
    assert "--gpu: GPU 0 is in MIG mode: load needs a MIG device" in capsys.readouterr().err
