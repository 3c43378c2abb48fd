"""Every path the daemon builds from a name stays under its root, and nothing outside a
root is ever removed: the second wall behind the identifiers' checks (issue 27 item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudra.driver import cdi
from gpudra.driver.mps import MpsManager
from gpudra.driver.paths import UnsafePath, child, child_path, inside, remove_tree
from gpudra.driver.sim.commands import SimulatedCommandRunner
from tests.trust.conftest import tree

ESCAPES = ["..", ".", "", "../x", "a/../../b", "/etc", "x/", "a\0b", "x" * 300]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    target = tmp_path / "victim"
    (target / "deeper").mkdir(parents=True)
    (target / "deeper" / "keep.txt").write_text("keep\n")
    return target


@pytest.mark.parametrize("name", ESCAPES)
def test_a_name_that_is_not_one_plain_component_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafePath):
        child(tmp_path, name)
    with pytest.raises(UnsafePath):
        child_path(tmp_path, name)
    assert child_path(tmp_path, "ok-name") == tmp_path / "ok-name"


def test_remove_tree_removes_only_what_is_strictly_below_its_root(tmp_path: Path,
                                                                  victim: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "mine").mkdir()
    (root / "link").symlink_to(victim)  # a link inside the root that leads out of it
    before = tree(victim)
    for outside in (victim, root, root / "..", root / ".." / "victim", root / "link" / "deeper"):
        assert not inside(root, outside)
        with pytest.raises(UnsafePath):
            remove_tree(root, outside)
    remove_tree(root, root / "link")  # the link goes, never what it points at
    assert not (root / "link").exists()
    remove_tree(root, root / "mine")
    assert not (root / "mine").exists()
    remove_tree(root, root / "never-was")  # nothing to remove is fine
    assert tree(victim) == before


@pytest.mark.parametrize("uid", [str(Path("/tmp")), "../victim", "../../" * 10 + "tmp"])
def test_mps_never_builds_or_removes_a_directory_outside_its_base(tmp_path: Path,
                                                                  victim: Path,
                                                                  uid: str) -> None:
    manager = MpsManager(SimulatedCommandRunner(tmp_path / "sim"), tmp_path / "mps")
    uid = str(victim) if uid == "/tmp" else uid
    before = tree(victim)
    with pytest.raises(UnsafePath):
        manager.stop(uid)  # a key read back from a corrupt or foreign checkpoint
    with pytest.raises(UnsafePath):
        manager.start(uid, [], [])
    assert tree(victim) == before


def test_cdi_spec_paths_stay_in_the_cdi_root(tmp_path: Path) -> None:
    spec = {"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [{"name": "x-gpu-0", "containerEdits": {"env": ["A=1"]}}]}
    with pytest.raises(cdi.CdiError, match="cannot be a file name"):
        cdi.write_spec(tmp_path, spec, claim_uid="a\0b")
    with pytest.raises(cdi.CdiError, match="cannot be a file name"):
        cdi.remove_spec(tmp_path, "gpu.nvidia.com", "a\0b")
    with pytest.raises(UnsafePath):
        cdi.spec_path(tmp_path, "gpu.nvidia.com", "x" * 300)
    # '/' in a uid becomes '_' (CDI's transient spec names), and the name has a prefix:
    # still one file in the root
    for uid in ("a/../../b", ".."):
        path = cdi.write_spec(tmp_path, spec, claim_uid=uid)
        assert path.parent == tmp_path and json.loads(path.read_text())["kind"] == spec["kind"]
        assert cdi.remove_spec(tmp_path, "gpu.nvidia.com", uid)
