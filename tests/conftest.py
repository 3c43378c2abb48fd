"""Fixtures shared by the whole suite: a simulated GPU node under the real pynvml."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from gpudra.driver import sim


@pytest.fixture
def sim_state(tmp_path: Path) -> Path:
    """A fresh, empty state directory for one simulated node."""
    path = tmp_path / "sim-state"
    path.mkdir()
    return path


@pytest.fixture
def simulate(sim_state: Path) -> Iterator[Callable[..., sim.SimulatedNvml]]:
    """``simulate(profile, state_dir=sim_state)``: install the simulator and ``nvmlInit``.

    Uninstalls at teardown, so no test leaves pynvml pointing at a simulated library.
    """

    def install(profile: str, state_dir: Path | None = None) -> sim.SimulatedNvml:
        library = sim.install(profile, state_dir or sim_state)
        pynvml.nvmlInit()
        return library

    yield install
    sim.uninstall()
