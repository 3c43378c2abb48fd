"""The real ``gpudra node`` on a simulated DGX H100 against the API-server stand-in, one
per test module (start-up is most of a test's time), and what these tests compare."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import Daemon, node_daemon


@pytest.fixture(scope="module")
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory tree outside every root of the daemon, which nothing may change; MPS
    control daemons a bad claim might have started in it are killed afterwards."""
    root = tmp_path_factory.mktemp("sentinel")
    for sub in ("victim", "victim/deeper", "other"):
        (root / sub).mkdir()
        (root / sub / "keep.txt").write_text(f"{sub} must survive\n")
    yield root
    for pid in sim_daemons(root):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def node(api: FakeApiServer) -> Iterator[Daemon]:
    with node_daemon(api) as daemon:
        daemon.start()
        try:
            yield daemon
        finally:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.stop()
            for pid in sim_daemons(daemon.base):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def kubelet(node: Daemon) -> AsyncIterator[KubeletEmulator]:
    async with await KubeletEmulator.discover(node.registrar) as emulator:
        yield emulator


def tree(root: Path) -> dict[str, Any]:
    """Every entry under ``root``: kind, mode and content hash (files), link target."""
    found: dict[str, Any] = {}
    for path in sorted([root, *root.rglob("*")]):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = ("link", str(path.readlink()))
        elif path.is_dir():
            found[rel] = ("dir", path.stat().st_mode)
        else:
            found[rel] = ("file", path.stat().st_mode,
                          hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def hardware(daemon: Daemon) -> list[dict[str, Any]]:
    """The simulated GPUs as the hardware has them: MIG mode, compute mode, GPU and compute
    instances (not the event log or the serial counter)."""
    state = json.loads((daemon.sim_state / "state.json").read_text())
    return [{key: gpu[key] for key in ("mig_current", "mig_pending", "compute_mode",
                                       "gpu_instances", "lost", "present")}
            for gpu in state["gpus"]]


def cdi_specs(daemon: Daemon) -> list[str]:
    return sorted(p.name for p in daemon.cdi_root.glob("*.json"))
