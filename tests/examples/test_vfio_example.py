"""examples/vfio-passthrough explained on a simulated node: with the PassthroughSupport gate
its template gets a vfio device; without it there is none, and explain says why. (The VM
itself is run through the real daemon by tests/integration/test_vfio.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudra.cli.main import main
from gpudra.driver import sim

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vfio-passthrough"


@pytest.fixture(autouse=True)
def _detach() -> None:
    yield
    sim.uninstall()


def test_with_the_gate_the_vm_gets_a_vfio_device(capsys):
    code = main(["explain", str(EXAMPLE), "--simulate", "dgx-h100",
                 "--feature-gates", "PassthroughSupport=true"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0, out
    assert out[-1] == "ALLOCATABLE on node dgx-h100-0: gpu -> gpu-vfio-0"
    readme = (EXAMPLE / "README.md").read_text()
    assert "gpu -> gpu-vfio-0" in readme


def test_without_the_gate_no_device_is_a_vfio_device(capsys):
    code = main(["explain", str(EXAMPLE / "claim-template.yaml"), "--simulate", "dgx-h100",
                 "-o", "json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1 and not document["allocatable"]
    assert "type 'gpu' != 'vfio'" in json.dumps(document)


def test_the_inventory_lists_each_gpu_twice_with_one_counter_set_each(capsys):
    assert main(["inventory", "--simulate", "dgx-h100", "--feature-gates",
                 "PassthroughSupport=true", "-o", "json"]) == 0
    slices = json.loads(capsys.readouterr().out)["items"]
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    kinds = sorted(d["attributes"]["type"]["string"] for d in devices)
    assert kinds == ["gpu"] * 8 + ["vfio"] * 8
    sets = [c for s in slices for c in s["spec"].get("sharedCounters", [])]
    assert len(sets) == 8
