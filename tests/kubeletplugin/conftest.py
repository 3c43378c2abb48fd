"""Fixtures for the kubelet gRPC face: short socket dirs, a test preparer, a server, a kubelet."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpudra.api.claims import ClaimRef, PreparedDevice
from gpudra.api.proto import health_v1_pb2, health_v1_pb2_grpc
from gpudra.kubeletplugin.serving.health_service import HealthService
from gpudra.kubeletplugin.serving.interfaces import PrepareOutcome, always
from gpudra.kubeletplugin.serving.server import PluginServer
from gpudra.testing.kubelet_emulator import KubeletEmulator

DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class Dirs:
    registrar: Path
    plugins: Path


@pytest.fixture
def dirs() -> Iterator[Dirs]:
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path is often too deep.
    root = Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp"))
    try:
        yield Dirs(registrar=root / "reg", plugins=root / "plugins")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def claim(n: int) -> ClaimRef:
    return ClaimRef(namespace="ns", name=f"claim-{n}", uid=f"uid-{n}")


def gpu(n: int, *requests: str, share_id: str | None = None) -> PreparedDevice:
    return PreparedDevice(
        request_names=requests or ("gpu",),
        pool="node-a",
        device=f"gpu-{n}",
        cdi_device_ids=(f"k8s.gpu.nvidia.com/claim=uid-{n}-gpu-{n}",),
        share_id=share_id,
    )


class TestPreparer:
    """A :class:`ClaimPreparer` double: canned outcomes, records calls, can stall or fail.

    Runs in the server's call threads, as the real one: ``gate`` and ``entered`` are
    threading events (wait for ``entered`` off the event loop: ``asyncio.to_thread``)."""

    __test__ = False  # not a test class, despite the name

    def __init__(self) -> None:
        self.outcomes: dict[str, PrepareOutcome] = {}
        self.unprepare_errors: dict[str, str | None] = {}
        self.prepared: list[list[ClaimRef]] = []
        self.unprepared: list[list[ClaimRef]] = []
        self.gate: threading.Event | None = None  # when given, calls wait until it is set
        self.entered = threading.Event()
        self.error: Exception | None = None
        self.omit: set[str] = set()  # uids left out of the answer
        self.extra: dict[str, PrepareOutcome] = {}  # answers for uids nobody asked about

    def prepare(self, claims: Sequence[ClaimRef], *,
                wanted: Callable[[], bool] = always) -> Mapping[str, PrepareOutcome]:
        self.prepared.append(list(claims))
        self._maybe_wait_or_fail()
        answer = {
            c.uid: self.outcomes.get(c.uid, PrepareOutcome(devices=(gpu(0),)))
            for c in claims if c.uid not in self.omit
        }
        return {**answer, **self.extra}

    def unprepare(self, claims: Sequence[ClaimRef], *,
                  wanted: Callable[[], bool] = always) -> Mapping[str, str | None]:
        self.unprepared.append(list(claims))
        self._maybe_wait_or_fail()
        return {c.uid: self.unprepare_errors.get(c.uid) for c in claims if c.uid not in self.omit}

    def _maybe_wait_or_fail(self) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)  # bounded: a test that forgets to set it still ends
        if self.error is not None:
            raise self.error


@pytest.fixture
def preparer() -> TestPreparer:
    return TestPreparer()


@pytest.fixture
async def server(dirs: Dirs, preparer: TestPreparer) -> AsyncIterator[PluginServer]:
    plugin = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, preparer)
    await plugin.start()
    try:
        yield plugin
    finally:
        await plugin.stop(grace=0)


@pytest.fixture
async def kubelet(server: PluginServer, dirs: Dirs) -> AsyncIterator[KubeletEmulator]:
    async with await KubeletEmulator.discover(dirs.registrar) as emulator:
        yield emulator


@contextlib.asynccontextmanager
async def health_server(dirs: Dirs, preparer: TestPreparer, service: HealthService,
                        ) -> AsyncIterator[tuple[PluginServer, Any]]:
    """A started server with ``service`` on its DRA socket, and a channel to that socket;
    stopped (grace 0) on the way out, if the test did not stop it first."""
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, preparer,
                          health_servicer=service)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{server.dra_socket_path}") as channel:
            yield server, channel
    finally:
        await server.stop(grace=0)


def watch(channel: Any) -> Any:
    """A v1 ``NodeWatchResources`` call on ``channel``, as the kubelet opens it."""
    return health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        health_v1_pb2.NodeWatchResourcesRequest())


async def eventually(condition: Callable[[], bool], within: float = 2.0) -> bool:
    """Whether ``condition`` holds within ``within`` seconds (looked at every 10 ms)."""
    for _ in range(int(within / 0.01)):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()
