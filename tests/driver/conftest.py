"""Fixtures of the device-layer tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.driver import sim
from tests.driver.node_fixture import SimNode, start_node


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    """A simulated node with default options (modules needing others define their own)."""
    n = start_node(tmp_path)
    yield n
    n.close()
    sim.uninstall()
