"""Fixtures shared by the whole suite: a simulated GPU node under the real pynvml."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from gpudra.driver import sim
from tests import mps_leaks


@pytest.fixture(autouse=True, scope="session")
def _private_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The CEL caches (``$XDG_CACHE_HOME/gpudra``) of this run, in-process and in the
    processes it starts, go to a directory of its own, not the developer's home."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))
    yield
    if saved is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(autouse=True)
def _no_leaked_mps_daemons() -> Iterator[None]:
    """Every process the test starts carries a mark of its own; at teardown (after the
    test's other fixtures) simulated MPS control daemons with that mark are stopped, and the
    test fails if one had outlived its directory (see :mod:`tests.mps_leaks`)."""
    mark = uuid.uuid4().hex
    saved = os.environ.get(mps_leaks.MARK_ENV)
    os.environ[mps_leaks.MARK_ENV] = mark
    yield
    if saved is None:
        os.environ.pop(mps_leaks.MARK_ENV, None)
    else:
        os.environ[mps_leaks.MARK_ENV] = saved
    leaked = mps_leaks.stop_all(mark)
    if leaked:
        pytest.fail(mps_leaks.describe(leaked))


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
