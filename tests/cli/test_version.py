"""``gpudra --version`` and the daemon's start-up line: the version importlib.metadata
reports, read without importing it."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from gpudra.cli import version as version_module
from gpudra.cli.version import UNKNOWN, version


def test_the_version_is_the_one_importlib_metadata_reports():
    assert version() == metadata.version("gpudra")


def test_reading_it_does_not_import_importlib_metadata():
    code = ("import sys\nfrom gpudra.cli.version import version\nprint(version())\n"
            "print('importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout.split()
    assert out == [metadata.version("gpudra"), "False"]


def test_dist_info_egg_info_and_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    dist = tmp_path / "a" / "gpudra-1.2.3.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.4\nName: gpudra\nVersion: 1.2.3\n\n"
                                   "Version: 9 (in the description, not a header)\n")
    egg = tmp_path / "b" / "gpudra.egg-info"
    egg.mkdir(parents=True)
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: gpudra\nVersion: 4.5\n")
    (tmp_path / "c" / "gpudra_extras-7.0.dist-info").mkdir(parents=True)  # another project
    monkeypatch.setattr(version_module.sys, "path", [str(tmp_path / "c"), str(tmp_path / "a"),
                                                     str(tmp_path / "b")])
    assert version() == "1.2.3"
    monkeypatch.setattr(version_module.sys, "path", [str(tmp_path / "b"), str(tmp_path / "a")])
    assert version() == "4.5"
    monkeypatch.setattr(version_module.sys, "path", [str(tmp_path / "c"), "/nonexistent"])
    assert version() == UNKNOWN
