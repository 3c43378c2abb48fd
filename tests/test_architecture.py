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
