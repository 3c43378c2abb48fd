"""Under ``umask 000`` everything the real ``gpudra node`` process creates has a mode of
its own: directories 0700/0750 (the MPS pipe and log dirs that containers bind-mount
0755), files 0600, CDI specs 0644 in a 0755 root; nothing is writable by others.

The kubelet sockets and their directories are another test's (test_socket_modes); the
simulated node's trees (``sim*``) stand for the host's driver and hardware, which a real
daemon does not create.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import DRIVER, Daemon, create_claim, node_daemon

GV = "resource.nvidia.com/v1beta1"
MPS = {"opaque": {"driver": DRIVER, "parameters": {
    "apiVersion": GV, "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}},
    "requests": ["gpu"], "source": "FromClaim"}


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    with node_daemon(fake_api) as made:
        yield made


def modes(root: Path) -> dict[str, int]:
    """Relative path -> permission bits of everything under ``root`` but sockets and the
    simulated node's trees."""
    found = {".": stat.S_IMODE(root.lstat().st_mode)}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0].startswith("sim") or path.suffix == ".sock" or path.is_socket():
            continue
        if path.is_fifo():
            continue  # the MPS control FIFO: the control daemon's, as on a real node
        found[str(rel)] = stat.S_IMODE(path.lstat().st_mode)
    return found


def _all_modes(root: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(root.lstat().st_mode)}
    found.update({str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode)
                  for p in root.rglob("*")})
    return found


async def test_everything_the_daemon_creates_has_its_own_mode_under_umask_000(
        daemon, fake_api):
    with umask(0):  # the daemon and the processes it starts inherit it
        daemon.start()
        mps = create_claim(fake_api, "mps", devices=["gpu-1"], configs=[MPS])
        mig = create_claim(fake_api, "mig", devices=["gpu-0-mig-1g10gb-19-6"], request="mig")
        async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
            results = await kubelet.prepare([mps, mig])
            assert [results[r.uid]["error"] for r in (mps, mig)] == ["", ""], daemon.output()
            data = modes(daemon.plugins / DRIVER)
            cdi = modes(daemon.cdi_root)
            hardware = {k: v for k, v in _all_modes(daemon.sim_state).items()}
            assert (await kubelet.unprepare([mps, mig]))[mps.uid]["error"] == ""
    everything = {**{f"data/{k}": v for k, v in data.items()},
                  **{f"cdi/{k}": v for k, v in cdi.items()}}
    assert {p: oct(m) for p, m in everything.items() if m & 0o002} == {}  # none world-writable
    mps_dir = f"mps/{mps.uid}"
    expected = {
        ".": 0o750,
        "gpu-locks": 0o700,
        "mps": 0o750,
        mps_dir: 0o750,
        f"{mps_dir}/pipe": 0o755,
        f"{mps_dir}/log": 0o755,
        f"{mps_dir}/shm": 0o700,
        f"{mps_dir}/control.pid": 0o600,
    }
    assert {k: oct(data[k]) for k in expected} == {k: oct(v) for k, v in expected.items()}
    for name, mode in data.items():
        if name.endswith(".lock") or name.startswith("checkpoint"):
            assert mode == 0o600, (name, oct(mode))
        if name.startswith(f"{mps_dir}/log/"):
            assert mode == 0o644, (name, oct(mode))  # the control daemon's, umask 022
    assert any(n.startswith("gpu-locks/") for n in data) and any(
        n.startswith("checkpoint") for n in data)
    assert cdi["."] == 0o755
    # The simulated hardware's state, which the daemon (through NVML) changes too.
    assert hardware["."] == 0o750 and hardware["state.json"] == 0o640
    assert hardware["state.lock"] == 0o600
    assert {p: oct(m) for p, m in hardware.items() if m & 0o002} == {}
    specs = {k: v for k, v in cdi.items() if k.endswith(".json")}
    assert len(specs) == 2 and set(specs.values()) == {0o644}
