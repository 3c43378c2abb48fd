"""A GPU taken out of ``--shareable-gpus`` while shares of it are prepared keeps its shared
device published (the scheduler counts those shares only through it) until they are gone;
the next restart then withdraws it. Through the real daemon and the test API server."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import Daemon
from tests.integration.test_hardware_changes import log_lines, published
from tests.integration.test_share_status import share_claim


@pytest.fixture
def daemons(fake_api: FakeApiServer) -> Iterator[Callable[..., Daemon]]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    made: list[Daemon] = []

    def make(shareable: str, base: Any = None) -> Daemon:
        kwargs = {} if base is None else {"base": base}
        daemon = Daemon(fake_api.url, extra_args=["--shareable-gpus", shareable], **kwargs)
        made.append(daemon)
        return daemon.start()

    yield make
    for daemon in made:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
        for pid in sim_daemons(daemon.plugins):  # a failed test must not leave MPS behind
            os.kill(pid, signal.SIGKILL)


def shared_devices(api: FakeApiServer) -> set[str]:
    return {name for name in published(api) if name.endswith("-shared")}


def until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.05)


async def test_a_gpu_with_prepared_shares_keeps_its_shared_device(daemons, fake_api):
    first = daemons("all")
    until(lambda: len(shared_devices(fake_api)) == 8)
    ref = share_claim(fake_api, "share-a")  # a share of gpu-0
    async with await KubeletEmulator.discover(first.registrar) as kubelet:
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
    assert first.stop() == 0

    # The admin stops sharing: every other GPU's shared device goes, gpu-0's stays.
    mark = len(first.output())
    second = daemons("none", base=first.base)
    until(lambda: shared_devices(fake_api) == {"gpu-0-shared"})
    warnings = [line for line in log_lines(second, mark) if line.get("level") == "warning"
                and "holds prepared shares" in line.get("event", "")]
    assert len(warnings) == 1 and warnings[0]["shares"] == 1, second.output()[mark:]
    async with await KubeletEmulator.discover(second.registrar) as kubelet:
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert second.stop() == 0

    # No shares left: the next start withdraws it.
    third = daemons("none", base=first.base)
    until(lambda: not shared_devices(fake_api) and "gpu-0" in published(fake_api))
    assert "Traceback" not in third.output()
