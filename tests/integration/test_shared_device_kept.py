"""A GPU taken out of ``--shareable-gpus`` while shares of it are prepared keeps its shared
device published (the scheduler counts those shares only through it) until they are gone;
the next restart then withdraws it. Through the real daemon and the test API server."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import Daemon
from tests.integration.test_hardware_changes import (  # noqa: F401 (a fixture)
    daemons,
    log_lines,
    published,
    wait_for,
)
from tests.integration.test_shares import share_claim


@pytest.fixture
def sharing(daemons: Callable[..., Daemon]) -> Iterator[Callable[..., Daemon]]:  # noqa: F811
    """``sharing(shareable, base=None)``: a started daemon with ``--shareable-gpus``."""
    made: list[Daemon] = []

    def make(shareable: str, base: Path | None = None) -> Daemon:
        kwargs = {} if base is None else {"base": base}
        daemon = daemons("dgx-h100", extra_args=["--shareable-gpus", shareable], **kwargs)
        made.append(daemon)
        return daemon.start()

    yield make
    for daemon in made:  # a failed test must not leave MPS control daemons behind
        for pid in sim_daemons(daemon.plugins):
            os.kill(pid, signal.SIGKILL)


def shared_devices(api: FakeApiServer) -> set[str]:
    return {name for name in published(api) if name.endswith("-shared")}


async def test_a_gpu_with_prepared_shares_keeps_its_shared_device(sharing, fake_api):
    first = sharing("all")
    wait_for(lambda: len(shared_devices(fake_api)) == 8)
    ref = share_claim(fake_api, "share-a")  # a share of gpu-0
    async with await KubeletEmulator.discover(first.registrar) as kubelet:
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
    assert first.stop() == 0

    # The admin stops sharing: every other GPU's shared device goes, gpu-0's stays.
    mark = len(first.output())
    second = sharing("none", base=first.base)
    wait_for(lambda: shared_devices(fake_api) == {"gpu-0-shared"})
    warnings = [line for line in log_lines(second, mark) if line.get("level") == "warning"
                and "holds prepared shares" in line.get("event", "")]
    assert len(warnings) == 1 and warnings[0]["shares"] == 1, second.output()[mark:]
    async with await KubeletEmulator.discover(second.registrar) as kubelet:
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert second.stop() == 0

    # No shares left: the next start withdraws it.
    third = sharing("none", base=first.base)
    wait_for(lambda: not shared_devices(fake_api) and "gpu-0" in published(fake_api))
    assert "Traceback" not in third.output()
