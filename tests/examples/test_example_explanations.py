"""What ``explain`` teaches about the examples: the values behind a refusal, and pods that
ask for ``nvidia.com/gpu`` through a DeviceClass's ``extendedResourceName``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudra.cli.main import main
from gpudra.driver import sim

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def _detach() -> None:
    yield
    sim.uninstall()


def test_gpu_by_memory_selects_an_80gb_h100(capsys):
    code = main(["explain", str(EXAMPLES / "gpu-by-memory" / "claim.yaml"), "--simulate",
                 "dgx-h100"])
    assert code == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "ALLOCATABLE on node dgx-h100-0: gpu -> gpu-0")


def test_asking_for_80gi_is_explained_with_the_memory_an_h100_reports(tmp_path, capsys):
    text = (EXAMPLES / "gpu-by-memory" / "claim.yaml").read_text()
    assert 'quantity("80G")' in text
    path = tmp_path / "claim.yaml"
    path.write_text(text.replace('quantity("80G")', 'quantity("80Gi")'))
    # With dynamic MIG, as the README shows it (the MIG devices widen the count column).
    assert main(["explain", str(path), "--simulate", "dgx-h100",
                 "--dynamic-mig-gpus", "all"]) == 1
    out = capsys.readouterr().out.splitlines()
    at = out.index("        8  request selector #0 is false")
    assert out[at + 1] == ('           device.capacity["gpu.nvidia.com"].memory.compareTo('
                           'quantity("80Gi")) >= 0')
    assert out[at + 2] == "           memory 79.6Gi (81559Mi) < 80Gi"
    readme = (EXAMPLES / "gpu-by-memory" / "README.md").read_text()
    assert "memory 79.6Gi (81559Mi) < 80Gi" in readme


def test_the_extended_resource_pod_gets_a_gpu(capsys):
    code = main(["explain", str(EXAMPLES / "extended-resource"), "--simulate", "dgx-h100",
                 "-o", "json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0, document["verdict"]
    (result,) = document["results"]
    assert [(r["request"], r["device"]) for r in result["devices"]["results"]] == [
        ("container-0-request-0", "gpu-0")]
    assert document["claims"] == ["classic-gpu-pod-extended-resources"]
