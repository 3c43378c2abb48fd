"""``-o table|wide|json|yaml`` on every command that prints objects, structured errors under
``-o json|yaml``, and the exit statuses: 0 ok, 1 not allocatable / invalid input found,
2 usage error or unreadable input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpudra.cli.main import main
from gpudra.driver import sim

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLAIM = EXAMPLES / "mps" / "claim.yaml"
TYPO = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: typo}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: "device.attributes['gpu.nvidia.com'].productNmae == 'x'"}
"""


@pytest.fixture(autouse=True)
def _detach():
    yield
    sim.uninstall()


def run(capsys, *words: str) -> tuple[int, str, str]:
    try:
        code = main(list(words))
    except SystemExit as done:  # argparse's own usage errors, without -o json|yaml
        code = int(done.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- explain ----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_explain_documents(fmt, capsys):
    code, out, _ = run(capsys, "explain", str(CLAIM), "--simulate", "dgx-h100", "-o", fmt)
    document = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert code == 0
    assert document["subject"] == "ResourceClaim mps-gpu"
    assert document["allocatable"] is True
    assert document["node"] == "dgx-h100-0"
    assert {"verdict", "results", "requests", "nodes", "hints"} <= set(document)


def test_explain_wide_adds_one_row_per_node(capsys):
    code, out, _ = run(capsys, "explain", str(CLAIM), "--simulate", "dgx-h100", "--nodes", "2",
                       "-o", "wide")
    lines = out.splitlines()
    assert code == 0
    header = lines.index("  NODE        FITS  DEVICES OR REASON")
    assert lines[header + 1:header + 3] == ["  dgx-h100-0  yes   gpu -> gpu-0",
                                            "  dgx-h100-1  yes   gpu -> gpu-0"]
    assert lines[-1].startswith("ALLOCATABLE on node dgx-h100-0")
    code, table, _ = run(capsys, "explain", str(CLAIM), "--simulate", "dgx-h100", "--nodes", "2")
    assert [line for line in lines if line not in table.splitlines()] == lines[header:header + 3]


def test_explain_not_allocatable_is_exit_status_1_with_a_document(capsys):
    code, out, _ = run(capsys, "explain", str(EXAMPLES / "gpu-by-product" / "claim.yaml"),
                       "--simulate", "dgx-a100", "-o", "json")
    assert code == 1
    assert json.loads(out)["allocatable"] is False


def test_explain_several_files_and_folders(capsys):
    code, out, _ = run(capsys, "explain", str(EXAMPLES / "mps"),
                       str(EXAMPLES / "mig-1g-dynamic" / "claim.yaml"), "--simulate", "dgx-h100",
                       "--dynamic-mig-gpus", "all", "-o", "json")
    assert code == 0
    subjects = [item["subject"] for item in json.loads(out)["items"]]
    assert "ResourceClaim mig-1g" in subjects
    assert any(s.startswith("Pod ") for s in subjects)


def test_explain_reads_standard_input(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(CLAIM.read_text()))
    code, out, _ = run(capsys, "explain", "-", "--simulate", "dgx-h100", "-o", "json")
    assert code == 0
    assert json.loads(out)["subject"] == "ResourceClaim mps-gpu"


def test_explain_namespace_flag_fills_in_missing_namespaces(capsys):
    code, out, _ = run(capsys, "explain", str(CLAIM), "--simulate", "dgx-h100", "-n", "ml",
                       "-o", "json")
    assert code == 0
    assert json.loads(out)["subject"] == "ResourceClaim ml/mps-gpu"


# --- errors: structured under -o json|yaml, one line otherwise ---------------------------

@pytest.mark.parametrize(("words", "code", "message"), [
    (["explain", "missing.yaml", "--simulate", "dgx-h100"], 2, "missing.yaml: No such file"),
    (["explain", str(CLAIM), "--simulate", "dgx-h100", "--nodes", "0"], 2,
     "--nodes must be at least 1"),
    (["explain", str(CLAIM), "--simulate", "nope"], 2, "--simulate: unknown node profile"),
    (["explain", str(CLAIM), "--simulate", "dgx-h100", "--kubeconfig", "x"], 2,
     "--simulate reads no cluster"),
    (["explain", str(CLAIM), "--simulate", "dgx-h100", "--node", "elsewhere"], 2,
     "--node: unknown node(s) elsewhere"),
    (["explain", str(CLAIM), "--simulate", "dgx-h100", "--nodes", "many"], 2,
     "argument --nodes: invalid int value: 'many'"),
    (["inventory", "--simulate", "dgx-h100", "--feature-gates", "Bogus=true"], 2,
     "--feature-gates: "),
    (["validate"], 2, "the following arguments are required: FILE"),
], ids=["missing-file", "nodes-0", "profile", "two-sources", "unknown-node", "argparse",
        "feature-gates", "no-file"])
@pytest.mark.parametrize("fmt", ["json", "yaml", "table"])
def test_errors(words, code, message, fmt, capsys):
    got, out, err = run(capsys, *words, "-o", fmt)
    assert got == code
    if fmt == "table":
        assert message in err
        assert err.count("\n") == 1
        assert out == ""
        return
    document = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert document["error"]["command"] == words[0]
    assert message in document["error"]["message"]
    assert document["error"]["exitCode"] == code
    assert err == ""


def test_usage_errors_without_o_keep_argparse_behaviour(capsys):
    with pytest.raises(SystemExit) as done:
        main(["explain", str(CLAIM), "--nodes", "many"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("gpudra explain: error: argument --nodes: invalid int value: 'many'")
    assert err.count("\n") == 1


def test_invalid_input_is_exit_status_1(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(TYPO.replace("name: gpu\n", "name: GPU!\n"))
    code, out, _ = run(capsys, "explain", str(path), "--simulate", "dgx-h100", "-o", "json")
    assert code == 1
    assert "the apiserver would refuse this input" in json.loads(out)["error"]["message"]


# --- validate ---------------------------------------------------------------------------

def test_validate_json_shape(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO)
    code, out, _ = run(capsys, "validate", str(path), str(CLAIM), "-o", "json")
    document = json.loads(out)
    assert code == 1
    assert document["ok"] is False
    assert document["files"] == 2
    assert document["checked"] == {"ResourceClaim": 2}
    assert document["summary"] == "1 problem found"
    (problem,) = document["problems"]
    assert problem["file"] == str(path)
    assert problem["path"] == "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert problem["severity"] == "error"
    assert problem["object"] == "ResourceClaim typo"
    assert "did you mean 'productName'?" in problem["message"]


def test_validate_yaml_ok_and_exit_0(capsys):
    folders = sorted(str(p) for p in EXAMPLES.iterdir() if p.is_dir())
    code, out, _ = run(capsys, "validate", *folders, "-o", "yaml")
    document = yaml.safe_load(out)
    assert code == 0
    assert document["ok"] is True
    assert document["problems"] == []
    assert document["summary"].startswith("OK: ")


def test_validate_wide_names_the_object_on_every_line(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO)
    _, table, _ = run(capsys, "validate", str(path))
    _, wide, _ = run(capsys, "validate", str(path), "-o", "wide")
    assert not table.strip().endswith("(ResourceClaim typo)")
    assert wide.strip() == table.strip() + " (ResourceClaim typo)"


def test_validate_unreadable_file_is_exit_status_2_after_checking_the_rest(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO)
    code, out, _ = run(capsys, "validate", str(tmp_path / "nope.yaml"), str(path), "-o", "json")
    document = json.loads(out)
    assert code == 2
    assert [p["path"] for p in document["problems"]] == [
        None, "spec.devices.requests[0].exactly.selectors[0].cel.expression"]


def test_validate_empty_folder_is_a_usage_error(tmp_path, capsys):
    code, _, err = run(capsys, "validate", str(tmp_path))
    assert code == 2
    assert "no .yaml, .yml, .json files in this folder" in err


# --- inventory --------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_inventory_documents_are_resource_slice_lists(fmt, capsys):
    code, out, _ = run(capsys, "inventory", "--simulate", "l4-x4", "-o", fmt)
    document = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert code == 0
    assert document["kind"] == "List"
    assert {item["kind"] for item in document["items"]} == {"ResourceSlice"}


def test_inventory_wide_adds_columns(capsys):
    _, table, _ = run(capsys, "inventory", "--simulate", "l4-x4")
    _, wide, _ = run(capsys, "inventory", "--simulate", "l4-x4", "-o", "wide")
    assert table.splitlines()[0].split() == ["DEVICE", "TYPE", "PRODUCT/PROFILE", "MEMORY",
                                             "NUMA", "NVLINK", "UUID"]
    assert wide.splitlines()[0].split() == ["DEVICE", "TYPE", "PRODUCT/PROFILE", "MEMORY",
                                            "NUMA", "NVLINK", "SMS", "ARCH", "CC", "PCI", "BUS",
                                            "UUID", "TAINTS"]
    assert "  58   Ada Lovelace  8.9.0  0000:00:03.0  GPU-" in wide.splitlines()[1]
