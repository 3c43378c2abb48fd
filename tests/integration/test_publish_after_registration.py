"""Slices are published only once the kubelet can prepare: after its first
``NotifyRegistrationStatus(plugin_registered=true)``; a kubelet that never comes is named in
the log and ``/readyz``; a kubelet restart unpublishes nothing. ``gpudra node`` as a real
process, the kubelet emulated over the real sockets."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator

import grpc
import pytest

from gpudra.api.proto import registration_pb2, registration_pb2_grpc
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import BackgroundKubelet, KubeletEmulator
from tests.integration.daemon import DRIVER, Daemon, free_port, http_get

WAITING = "ResourceSlices not published: waiting for the kubelet to register this plugin"


@pytest.fixture
def node(fake_api: FakeApiServer) -> Iterator[Callable[..., Daemon]]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    started: list[Daemon] = []

    def make(*extra: str, kubelet: bool = False) -> Daemon:
        daemon = Daemon(fake_api.url, extra_args=["--http-address", f"127.0.0.1:{free_port()}",
                                                  *extra], kubelet=kubelet)
        started.append(daemon)
        return daemon.start()

    yield make
    for daemon in started:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
        daemon.stop_kubelet()
        shutil.rmtree(daemon.base, ignore_errors=True)


def readyz(daemon: Daemon) -> tuple[int, str]:
    return http_get(int(daemon.extra_args[1].rpartition(":")[2]), "/readyz")


def slices(api: FakeApiServer) -> list[str]:
    return sorted(s["metadata"]["name"] for s in api.list("ResourceSlice"))


def complete(api: FakeApiServer) -> bool:
    found = api.list("ResourceSlice")
    return bool(found) and len(found) == found[0]["spec"]["pool"]["resourceSliceCount"]


async def wait_for(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    """Wait for an event of the daemon's; fail with ``what`` if it never comes."""
    try:
        async with asyncio.timeout(seconds):
            while not predicate():  # noqa: ASYNC110 (the daemon is another process)
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(what) from None


async def test_nothing_is_published_until_the_kubelet_registers_the_plugin(node, fake_api):
    daemon = node()  # running: sockets served, client loaded; no kubelet
    await asyncio.sleep(1.0)  # well past when a publisher that did not wait would publish
    assert slices(fake_api) == []
    status, body = readyz(daemon)
    assert status == 503
    assert body == f"not registered with the kubelet yet\n{WAITING}\n"
    async with await KubeletEmulator.discover(daemon.registrar):
        # How soon (the ≤ 2 s budget) is bench/node_daemon.py's to measure, not a test's.
        await wait_for(lambda: complete(fake_api), 5, "not published after registration")
        await wait_for(lambda: readyz(daemon) == (200, "ok\n"), 5, "never ready")


async def test_a_kubelet_that_never_registers_is_named_and_nothing_is_published(node, fake_api):
    daemon = node("--registration-timeout", "0.5")

    def warned() -> bool:
        return any(e["event"].startswith("the kubelet has not registered this plugin")
                   for e in daemon.events())

    await wait_for(warned, 10, "no log line about the missing registration")
    [warning] = [e for e in daemon.events()
                 if e["event"].startswith("the kubelet has not registered")]
    assert warning["level"] == "warning"
    assert warning["registration_socket"] == str(daemon.registrar / f"{DRIVER}-reg.sock")
    status, body = readyz(daemon)
    assert status == 503
    assert body == (f"not registered with the kubelet after 0.5 s: is the kubelet running, and "
                    f"does it watch {daemon.registrar}?\n{WAITING}\n")
    assert slices(fake_api) == []
    assert daemon.process is not None and daemon.process.poll() is None  # waits, not exits
    # The kubelet comes up at last: published at once.
    with BackgroundKubelet(daemon.registrar):
        await wait_for(lambda: complete(fake_api), 5, "not published after a late registration")
        await wait_for(lambda: readyz(daemon) == (200, "ok\n"), 5, "never ready")
    assert "the kubelet registered this plugin at last; publishing" in daemon.output()


async def test_a_kubelet_restart_unpublishes_nothing(node, fake_api):
    daemon = node(kubelet=True)
    await wait_for(lambda: complete(fake_api), 10, "never published")
    await wait_for(lambda: readyz(daemon) == (200, "ok\n"), 5, "never ready")
    published = slices(fake_api)
    fake_api.reset_calls()

    daemon.stop_kubelet()
    # The restarted kubelet refuses us first (a NotifyRegistrationStatus with an error) …
    socket = daemon.registrar / f"{DRIVER}-reg.sock"
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await registration_pb2_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                registration_pb2.RegistrationStatus(plugin_registered=False,
                                                    error="kubelet restarting"), timeout=5)
    status, body = readyz(daemon)
    assert (status, body) == (503, "the kubelet refused the registration: kubelet restarting\n")
    # … then registers us again.
    with BackgroundKubelet(daemon.registrar) as kubelet:
        await wait_for(lambda: bool(kubelet.registered), 5, "not registered again")
        await wait_for(lambda: readyz(daemon) == (200, "ok\n"), 5, "not ready again")
        await asyncio.sleep(0.5)  # room for a (wrong) unpublish or rewrite to happen
    assert slices(fake_api) == published
    assert fake_api.writes("resourceslices") == 0
