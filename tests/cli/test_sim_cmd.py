"""``gpudra sim xid``, ``gpu-lost`` and the hardware changes on a simulated node's state
directory."""

from __future__ import annotations

import pytest

from gpudra.cli.main import main
from gpudra.driver import sim


@pytest.fixture
def control(simulate, sim_state) -> sim.SimControl:
    simulate("dgx-a100-static-mig")
    return sim.SimControl(sim_state)


def test_xid_on_a_gpu(control, sim_state, capsys):
    assert main(["sim", "xid", "--sim-state", str(sim_state), "--gpu", "2", "--xid", "79"]) == 0
    [event] = control.snapshot()["events"]
    assert (event["gpu"], event["xid"], event["gpu_instance_id"]) == (2, 79, None)
    uuid = control.node.gpus[2].uuid
    assert capsys.readouterr().out == f"raised XID 79 on GPU 2 ({uuid})\n"


def test_xid_on_a_mig_device(control, sim_state):
    gi = control.snapshot()["gpus"][1]["gpu_instances"][0]
    mig_uuid = gi["compute_instances"][0]["uuid"]
    assert main(["sim", "xid", "--sim-state", str(sim_state), "--gpu", "1", "--xid", "94",
                 "--mig-uuid", mig_uuid]) == 0
    [event] = control.snapshot()["events"]
    assert (event["xid"], event["gpu_instance_id"]) == (94, gi["id"])


def test_sim_state_from_the_environment(control, sim_state, monkeypatch):
    monkeypatch.setenv("SIM_STATE", str(sim_state))
    assert main(["sim", "gpu-lost", "--gpu", "3"]) == 0
    assert control.snapshot()["gpus"][3]["lost"] is True
    assert main(["sim", "gpu-lost", "--gpu", "3", "--recover"]) == 0
    assert control.snapshot()["gpus"][3]["lost"] is False


@pytest.mark.parametrize(("args", "error"), [
    (["xid", "--gpu", "9", "--xid", "79"], "--gpu: no GPU 9 on this 8-GPU node"),
    (["xid", "--gpu", "1", "--xid", "79", "--mig-uuid", "MIG-nope"],
     "--mig-uuid: GPU 1 has no MIG device MIG-nope"),
    (["gpu-lost", "--gpu", "8"], "--gpu: no GPU 8 on this 8-GPU node"),
    (["insert-gpu", "--gpu", "2"], "--gpu: GPU 2 is in its slot already"),
    (["remove-gpu", "--gpu", "8"], "--gpu: no GPU 8 on this 8-GPU node"),
])
def test_bad_targets_name_the_flag_and_change_nothing(control, sim_state, capsys, args, error):
    before = control.snapshot()
    assert main(["sim", *args, "--sim-state", str(sim_state)]) == 1
    assert capsys.readouterr().err == f"gpudra sim: {error}\n"
    assert control.snapshot() == before


def test_remove_insert_and_replace_a_gpu(control, sim_state, capsys):
    uuid = control.gpu_uuid(2)
    state = ["--sim-state", str(sim_state), "--gpu", "2"]
    assert main(["sim", "remove-gpu", *state]) == 0
    assert capsys.readouterr().out == f"GPU 2 ({uuid}) removed\n"
    assert control.snapshot()["gpus"][2]["present"] is False
    assert main(["sim", "gpu-lost", *state]) == 1
    assert "--gpu: GPU 2 is removed" in capsys.readouterr().err
    assert main(["sim", "insert-gpu", *state]) == 0
    assert capsys.readouterr().out == f"GPU 2 ({uuid}) is back in its slot\n"
    assert main(["sim", "replace-gpu", *state]) == 0
    new = control.gpu_uuid(2)
    assert new != uuid
    assert capsys.readouterr().out == f"GPU 2: {uuid} replaced by {new}\n"
    assert control.snapshot()["gpus"][2]["gpu_instances"] == []


def test_a_directory_without_a_simulated_node(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SIM_STATE", raising=False)
    # Usage errors (exit 2): the state directory is an argument, as a file is to kubectl.
    assert main(["sim", "xid", "--gpu", "0", "--xid", "79"]) == 2
    assert "--sim-state: required" in capsys.readouterr().err
    assert main(["sim", "xid", "--sim-state", str(tmp_path), "--gpu", "0", "--xid", "79"]) == 2
    assert "--sim-state: no simulated node in" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "flag"), [
    (["xid", "--gpu", "0", "--xid", "0"], "--xid"),
    (["xid", "--gpu", "-1", "--xid", "79"], "--gpu"),
    (["xid", "--gpu", "0", "--xid", "abc"], "--xid"),
    (["xid", "--gpu", "0"], "--xid"),
])
def test_bad_numbers_are_usage_errors(args, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", *args])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err
