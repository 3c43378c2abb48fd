"""Hardware-safe MIG defaults: an A100/A30 (switching MIG mode needs a GPU reset) whose MIG
mode is off offers no MIG devices made on demand unless the admin allows the switch on that
GPU; a claim for one is refused naming the claim, with the hardware untouched; ``explain``
says why. Hopper switches without a reset and needs no opt-in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudra.cli.main import main
from gpudra.driver import sim
from gpudra.driver.claims import ClaimError
from gpudra.driver.device_model import ModelOptions
from gpudra.driver.mig_offer import MigOfferError, parse_offer
from tests.driver.node_fixture import SimNode, claim, start_node

UID = "22222222-2222-4222-8222-222222222222"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def nodes(tmp_path: Path):
    """Opens a simulated node; NVML is one per process, so the previous one is closed."""
    current: list[SimNode] = []

    def open_node(profile: str, mode_change: str | None = None, name: str = "n") -> SimNode:
        while current:
            current.pop().close()
        options = ModelOptions(mig=parse_offer("all", None, None, mode_change))
        current.append(start_node(tmp_path / name, profile, options=options))
        return current[0]

    yield open_node
    while current:
        current.pop().close()
    sim.uninstall()


def mig_parents(node: SimNode) -> set[str]:
    return {d.group for d in node.state.index.devices.devices if d.type == "mig"}


def test_an_a100_with_mig_off_offers_only_its_full_gpu_by_default(nodes):
    node = nodes("dgx-a100")
    assert mig_parents(node) == set()
    assert [d.name for d in node.state.index.devices.devices] == [f"gpu-{i}" for i in range(8)]


def test_the_admin_allows_the_switch_per_gpu(nodes):
    by_minor = nodes("dgx-a100", "1,6", name="a")
    assert mig_parents(by_minor) == {"gpu-1", "gpu-6"}
    uuid = by_minor.control.gpu_uuid(3)
    by_uuid = nodes("dgx-a100", uuid, name="b")
    assert mig_parents(by_uuid) == {"gpu-3"}
    everywhere = nodes("dgx-a100", "all", name="c")
    assert mig_parents(everywhere) == {f"gpu-{i}" for i in range(8)}


def test_an_a100_whose_mig_mode_is_on_needs_no_switch(nodes):
    first = nodes("dgx-a100", name="x")
    first.nvml.set_mig_mode(first.control.gpu_uuid(2), True)  # the admin did it (idle GPU)
    again = nodes("dgx-a100", name="x")
    assert mig_parents(again) == {"gpu-2"}


def test_hopper_switches_without_a_reset_and_needs_no_opt_in(nodes):
    node = nodes("dgx-h100")
    assert mig_parents(node) == {f"gpu-{i}" for i in range(8)}


def test_a_claim_for_a_switch_the_node_will_not_make_is_refused_and_changes_nothing(nodes):
    node = nodes("dgx-a100")
    before = node.control.snapshot()["gpus"]
    with pytest.raises(ClaimError) as info:
        node.state.prepare(claim(UID, "gpu-0-mig-1g5gb-19-0", request="mig"))
    message = str(info.value)
    assert f"claim default/claim-{UID[:8]}:{UID}" in message or UID in message
    assert "--allow-mig-mode-change" in message and "gpu-0-mig-1g5gb-19-0" in message
    assert node.control.snapshot()["gpus"] == before  # MIG mode still off, nothing created
    assert list(node.cdi_root.glob("*")) == []


def test_allowed_it_switches_and_prepares(nodes):
    node = nodes("dgx-a100", "0")
    node.state.prepare(claim(UID, "gpu-0-mig-1g5gb-19-0", request="mig"))
    gpu = node.control.snapshot()["gpus"][0]
    assert gpu["mig_mode"]["current"] == 1 and len(gpu["gpu_instances"]) == 1


def test_a_bad_list_names_the_flag():
    with pytest.raises(MigOfferError, match="--allow-mig-mode-change: 'x' is not a GPU"):
        parse_offer("all", None, None, "x")


def test_the_node_flag_and_its_environment_fallback(capsys, monkeypatch):
    code = main(["inventory", "--simulate", "a30-x4", "--dynamic-mig-gpus", "all",
                 "--allow-mig-mode-change", "zero"])
    assert code == 2
    assert "--allow-mig-mode-change: 'zero'" in capsys.readouterr().err
    monkeypatch.setenv("ALLOW_MIG_MODE_CHANGE", "2")
    assert main(["inventory", "--simulate", "a30-x4", "--dynamic-mig-gpus", "all",
                 "-o", "json"]) == 0
    slices = json.loads(capsys.readouterr().out)["items"]
    names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert {n.split("-mig-")[0] for n in names if "-mig-" in n} == {"gpu-2"}


def test_explain_says_the_node_will_not_switch_mig_mode(capsys):
    args = ["explain", str(EXAMPLES / "two-mig-same-gpu"), "--simulate", "dgx-a100",
            "--dynamic-mig-gpus", "all", "-o", "json"]
    assert main(args) == 1
    out = json.loads(capsys.readouterr().out)
    (hint,) = [h for h in out["hints"] if "MIG mode" in h]
    assert "gpu-0" in hint and "--allow-mig-mode-change" in hint and "reset" in hint
    assert main([*args, "--allow-mig-mode-change", "0"]) == 0
    assert not [h for h in json.loads(capsys.readouterr().out)["hints"] if "MIG mode" in h]
    # a full-GPU claim on the same node gets no such hint: it asked for no MIG device
    assert main(["explain", str(EXAMPLES / "single-gpu"), "--simulate", "dgx-a100", "-o",
                 "json"]) == 0
    assert not [h for h in json.loads(capsys.readouterr().out)["hints"] if "MIG mode" in h]
