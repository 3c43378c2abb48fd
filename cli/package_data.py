"""The YAML that ships beside the code: the chart's DeviceClasses and the examples.

``deploy/`` and ``examples/`` install as the data-only packages ``gpudra.deploy`` and
``gpudra.examples`` (see pyproject.toml), so the commands that read them work from a wheel
as well as from a checkout, with one copy of each file in the repository.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gpudra.cli.options import CliError


def folder(package: str) -> Path:
    """The directory a data-only package is installed in (the source folder when editable)."""
    spec = importlib.util.find_spec(package)
    # These packages have no __init__.py, so they are namespace packages. On Python 3.11
    # importlib.resources.files() refuses a namespace path holding anything but
    # directories, and setuptools' editable install adds a placeholder entry to it: take
    # the first real directory instead.
    found = [Path(p) for p in (spec.submodule_search_locations or []) if Path(p).is_dir()] \
        if spec is not None else []
    if not found:
        raise CliError(f"package data {package} is missing from this installation of gpudra")
    return found[0]


def device_class_files() -> list[Path]:
    """The chart's plain DeviceClass manifests, by file name."""
    return sorted((folder("gpudra.deploy") / "deviceclasses").glob("*.yaml"))


def example(path: str) -> Path:
    """One file of ``examples/``, e.g. ``mps/claim.yaml``."""
    return folder("gpudra.examples") / path
