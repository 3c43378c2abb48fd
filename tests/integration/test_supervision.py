"""A publisher that dies is restarted, named in /readyz while down, and fatal when it keeps
dying: ``gpudra node`` as a real process, the death injected by ``GPUDRA_FAIL_AT``."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Iterator

import pytest

from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon, free_port, http_get

DIED = "publisher: not running: died with InjectedFault: injected fault at " \
       "publisher:after-round (GPUDRA_FAIL_AT)"


@pytest.fixture
def node(fake_api: FakeApiServer) -> Iterator[Callable[[str], Daemon]]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    started: list[Daemon] = []

    def make(fail_at: str) -> Daemon:
        daemon = Daemon(fake_api.url, extra_args=["--http-address", f"127.0.0.1:{free_port()}"],
                        env={"GPUDRA_FAIL_AT": fail_at})
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
        shutil.rmtree(daemon.base, ignore_errors=True)


def port(daemon: Daemon) -> int:
    return int(daemon.extra_args[1].rpartition(":")[2])


def readyz(daemon: Daemon) -> tuple[int, str]:
    try:
        return http_get(port(daemon), "/readyz")
    except OSError:  # not listening yet
        return 0, ""


async def wait_for(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_a_publisher_that_keeps_dying_is_named_in_readyz_then_stops_the_daemon(node):
    daemon = node("publisher:after-round")  # every round
    daemon.start(wait=False)
    answers: list[tuple[int, str]] = []

    def publisher_reported_down() -> bool:
        answers.append(readyz(daemon))
        return DIED in answers[-1][1]

    await wait_for(publisher_reported_down, 20, f"readyz never named the publisher: {answers}")
    assert answers[-1][0] == 503
    assert daemon.process is not None
    assert daemon.process.wait(30) == 1  # gave up: the pod restarts, the node is not silent
    # one fatal-error line, JSON like the rest of the log (--log-format json)
    assert daemon.fatal_errors() == ["root task publisher not running: gave up after 5 deaths "
                                     "within 60 s, the last with InjectedFault: injected fault "
                                     "at publisher:after-round (GPUDRA_FAIL_AT)"], daemon.output()
    assert daemon.output().count('"root task died; restarting"') == 4
    assert daemon.sockets() == []  # shut down in order: the kubelet sees us leave


async def test_a_dead_publisher_is_restarted_and_publishes_again(node, fake_api):
    daemon = node("publisher:after-round=2").start()  # dies after each of its first 2 rounds
    await wait_for(lambda: daemon.output().count('"restarting root task"') == 2, 20,
                   "the publisher was not restarted twice")
    assert daemon.output().count('"root task died; restarting"') == 2
    async with await KubeletEmulator.discover(daemon.registrar):
        await wait_for(lambda: readyz(daemon) == (200, "ok\n"), 10, "never ready")
    # Alive, not just marked so: a wiped pool is published again.
    names = sorted(s["metadata"]["name"] for s in fake_api.list("ResourceSlice"))
    assert names
    for name in names:
        fake_api.delete("ResourceSlice", name)
    await wait_for(lambda: sorted(s["metadata"]["name"] for s in fake_api.list("ResourceSlice"))
                   == names, 10, "the wiped slices were not re-created")
    assert daemon.output().count('"root task died; restarting"') == 2
    assert daemon.stop() == 0
