"""The kubelet's device health stream: ``v1.DRAResourceHealth`` and ``v1alpha1``.

``NodeWatchResources`` is a server stream the kubelet keeps open (and reopens every 5 s
when it ends). Each response is the complete device list of this node's pool, because
devices missing from it turn Unknown; one is sent when the stream opens, on every
:meth:`HealthService.notify`, and every ``resend_interval`` seconds so timestamps stay
fresher than ``health_check_timeout``. A stream opened before the daemon knows its devices
sends nothing until it does (:meth:`HealthService.set_source`): an empty or partial list
would turn devices Unknown. Both versions share one implementation; only the message
classes differ.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import structlog

from gpudra.api.proto import (
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from gpudra.driver.health import DeviceHealth

log = structlog.get_logger(__name__)

MESSAGE_MAX = 1024
"""The kubelet truncates longer messages (1.36+); we do it first, the same way."""
DEFAULT_RESEND_INTERVAL = 30.0
DEFAULT_HEALTH_CHECK_TIMEOUT = 60

HealthSource = Callable[[], Sequence[DeviceHealth]]


class _HealthModule(Protocol):
    """``health_v1_pb2`` or ``health_v1alpha1_pb2`` (identical messages)."""

    HEALTHY: Any
    UNHEALTHY: Any
    UNKNOWN: Any
    NodeWatchResourcesResponse: Any
    DeviceHealth: Any
    DeviceIdentifier: Any


def truncate(message: str) -> str:
    if len(message) <= MESSAGE_MAX:
        return message
    return message[:MESSAGE_MAX - 3] + "..."


class HealthService:
    """Serves both health API versions from ``source`` (called for every response); None:
    streams wait until :meth:`set_source` gives it.

    Call :meth:`notify` on the event loop when health changed.
    """

    def __init__(
        self,
        pool_name: str,
        source: HealthSource | None = None,
        *,
        resend_interval: float = DEFAULT_RESEND_INTERVAL,
        health_check_timeout: int = DEFAULT_HEALTH_CHECK_TIMEOUT,
    ) -> None:
        if resend_interval <= 0:
            raise ValueError("resend_interval must be > 0 seconds")
        self._pool = pool_name
        self._source = source
        self._resend_interval = resend_interval
        self._timeout = health_check_timeout
        self._wakeups: set[asyncio.Event] = set()
        self._known = asyncio.Event()  # set once there is a source to send (or closed)
        if source is not None:
            self._known.set()
        self._closed = False

    @property
    def open_streams(self) -> int:
        return len(self._wakeups)

    def add_to_server(self, server: Any) -> None:
        """Register ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth``."""
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
            _V1Servicer(self), server)
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
            _V1alpha1Servicer(self), server)

    def set_source(self, source: HealthSource) -> None:
        """Start sending from ``source`` (call on the event loop, once the devices and
        their health are known); streams already open send their first response now."""
        self._source = source
        self._known.set()

    def notify(self) -> None:
        """Send the current health on every open stream now (call on the event loop)."""
        for wakeup in self._wakeups:
            wakeup.set()

    def close(self) -> None:
        """End every stream, open or opened later (the daemon is stopping; call on the
        event loop). A stream never ends by itself, so a server stopping with a grace
        period would otherwise wait all of it out."""
        self._closed = True
        self._known.set()
        self.notify()

    async def stream(self, version: str, pb: _HealthModule, context: Any) -> None:
        """Write responses to ``context`` until the kubelet goes away (then we are cancelled)
        or :meth:`close`.

        ``context.write`` rather than an async generator: cancellation lands in an ``await``
        of this coroutine, so the ``finally`` always runs and no stream outlives its call.
        """
        wakeup = asyncio.Event()
        self._wakeups.add(wakeup)
        log.info("kubelet opened a health stream", version=version, streams=self.open_streams)
        try:
            await self._known.wait()
            while not self._closed:
                wakeup.clear()
                await context.write(self._response(pb))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._resend_interval):
                        await wakeup.wait()
        finally:
            self._wakeups.discard(wakeup)
            log.info("health stream closed", version=version, streams=self.open_streams)

    def _response(self, pb: _HealthModule) -> Any:
        assert self._source is not None  # stream() waits for it
        status = {"Healthy": pb.HEALTHY, "Unhealthy": pb.UNHEALTHY, "Unknown": pb.UNKNOWN}
        return pb.NodeWatchResourcesResponse(devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=self._pool, device_name=health.device),
                health=status[health.status],
                last_updated_time=int(health.last_updated),
                health_check_timeout_seconds=self._timeout,
                message=truncate(health.message),
            )
            for health in self._source()
        ])


class _V1Servicer(health_v1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, service: HealthService) -> None:
        self._service = service

    async def NodeWatchResources(
        self, request: health_v1_pb2.NodeWatchResourcesRequest, context: Any
    ) -> None:
        await self._service.stream("v1", health_v1_pb2, context)


class _V1alpha1Servicer(health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, service: HealthService) -> None:
        self._service = service

    async def NodeWatchResources(
        self, request: health_v1alpha1_pb2.NodeWatchResourcesRequest, context: Any
    ) -> None:
        await self._service.stream("v1alpha1", health_v1alpha1_pb2, context)
