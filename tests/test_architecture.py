"""The layer table of DESIGN.md, executable: which gpudra layer may import which."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {
    "api": set(),
    "driver": {"api"},
    "kube": {"api"},
    "controller": {"api", "driver", "kube"},
    "kubeletplugin": {"api", "driver", "kube", "controller"},
    "scheduling": {"api", "driver", "kube", "controller"},
    "testing": {"api"},
    "cli": {"api", "driver", "kube", "controller", "kubeletplugin", "scheduling", "testing"},
}


def _imported_layers(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "gpudra" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_imports_only_what_it_may(layer):
    offenders = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        bad = _imported_layers(path) - LAYERS[layer] - {layer}
        if bad:
            names = ", ".join(f"gpudra.{name}" for name in sorted(bad))
            offenders.append(f"{path.relative_to(ROOT)} imports {names}")
    assert not offenders, "\n".join(offenders)


def test_only_the_nvml_seam_and_simulator_import_pynvml():
    allowed = {ROOT / "driver" / "nvml.py"}
    offenders = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            if path in allowed or (ROOT / "driver" / "sim") in path.parents:
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                        node.module or ""]
                    if any(n.split(".")[0] == "pynvml" for n in names):
                        offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_every_subpackage_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = {folder: package for package, folder in config["package-dir"].items()}
    expected = set()
    for folder, package in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            expected.add(".".join([package, *rel.parts]))
    assert expected - listed == set(), "add these to [tool.setuptools] packages"


def _readme_layout() -> dict[str, tuple[str, set[str]]]:
    """The README's layout table: folder -> (import name, layers it may import)."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Layout", 1)[1].split("\n\n", 2)[1]
    rows: dict[str, tuple[str, set[str]]] = {}
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        folder, package, may = cells[0].strip("`/"), cells[1].strip("`"), cells[3]
        allowed = set() if may in ("", "—") else {
            name.strip().strip("`") for name in may.split(",")}
        rows[folder] = (package, allowed)
    return rows


def test_readme_layout_table_matches_the_layers_and_the_tree():
    rows = _readme_layout()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = {folder: package for package, folder in config["package-dir"].items()}
    code = {folder: row[0] for folder, row in rows.items() if row[0]}
    assert code == mapping, "README layout table and pyproject package-dir disagree"
    for folder in code:
        allowed = rows[folder][1]
        expected = LAYERS.get(folder, set())  # data-only packages: deploy, examples
        if allowed == {"everything"}:
            assert expected == set(LAYERS) - {folder}
        else:
            assert allowed == expected, f"README says {folder} may import {sorted(allowed)}"
    top = {p.name for p in ROOT.iterdir()
           if p.is_dir() and not p.name.startswith(".") and not p.name.endswith(".egg-info")
           and p.name not in ("build", "dist")}
    assert top == set(rows), "README layout table and top-level folders disagree"
