"""The kubelet's device health stream: ``v1.DRAResourceHealth`` and ``v1alpha1``.

``NodeWatchResources`` is a server stream the kubelet keeps open (and reopens every 5 s
when it ends). Each response is the complete device list of this node's pool, because
devices missing from it turn Unknown; one is sent when the stream opens, on every
:meth:`HealthService.notify`, and every ``resend_interval`` seconds so timestamps stay
fresher than ``health_check_timeout``. A stream opened before the daemon knows its devices
sends nothing until it does (:meth:`HealthService.set_source`): an empty or partial list
would turn devices Unknown. Both versions share one implementation; only the message
classes differ.

The DRA socket's handlers are synchronous, so an open stream holds one of its threads
for its whole life. The kubelet keeps one stream open, two for a moment while it
reconnects; the server must keep :attr:`HealthService.max_streams` threads beyond those
its claim calls need, and streams past that limit are refused (RESOURCE_EXHAUSTED; the
kubelet retries), so no client can take the threads the kubelet's claim calls need. A
stream whose client went away ends at once (``context.add_callback`` wakes it) and gives
its thread back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import grpc
import structlog

from gpudra.api.proto import (
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from gpudra.driver.health import DeviceHealth
from gpudra.kubeletplugin.serving.grpc_types import CallContext, RpcServer

log = structlog.get_logger(__name__)

MESSAGE_MAX = 1024
"""The kubelet truncates longer messages (1.36+); we do it first, the same way."""
DEFAULT_RESEND_INTERVAL = 30.0
DEFAULT_HEALTH_CHECK_TIMEOUT = 60
DEFAULT_MAX_STREAMS = 4
"""The kubelet's one stream, a second while it reconnects, and room for a debugging client."""

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


class _Call:
    """One stream's RPC, as its waiting thread sees it."""

    __slots__ = ("ended",)

    def __init__(self) -> None:
        self.ended = False  # the client left (or gRPC ended the call): stop at once


class HealthService:
    """Serves both health API versions from ``source`` (called for every response, in the
    stream's server thread); None: streams wait until :meth:`set_source` gives it.

    :meth:`notify`, :meth:`set_source` and :meth:`close` may be called from any thread.
    """

    def __init__(
        self,
        pool_name: str,
        source: HealthSource | None = None,
        *,
        resend_interval: float = DEFAULT_RESEND_INTERVAL,
        health_check_timeout: int = DEFAULT_HEALTH_CHECK_TIMEOUT,
        max_streams: int = DEFAULT_MAX_STREAMS,
    ) -> None:
        if resend_interval <= 0:
            raise ValueError("resend_interval must be > 0 seconds")
        if max_streams < 1:
            raise ValueError("max_streams must be at least 1")
        self._pool = pool_name
        self._source = source
        self._resend_interval = resend_interval
        self._timeout = health_check_timeout
        self._max_streams = max_streams
        # One condition for every stream: a change wakes them all, and each compares the
        # generation it last sent with the current one, so no wake-up is lost between a
        # response and the next wait.
        self._changed = threading.Condition()
        self._generation = 0  # bumped by notify() and set_source()
        self._streams = 0
        self._closed = False

    @property
    def open_streams(self) -> int:
        with self._changed:
            return self._streams

    @property
    def max_streams(self) -> int:
        """Streams served at once, each holding a server thread; more are refused."""
        return self._max_streams

    def add_to_server(self, server: RpcServer) -> None:
        """Register ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth`` on a
        synchronous ``grpc.Server``."""
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
            _V1Servicer(self), server)
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
            _V1alpha1Servicer(self), server)

    def set_source(self, source: HealthSource) -> None:
        """Start sending from ``source`` (once the devices and their health are known);
        streams already open send their first response now."""
        with self._changed:
            self._source = source
            self._generation += 1
            self._changed.notify_all()

    def notify(self) -> None:
        """Send the current health on every open stream now."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def close(self) -> None:
        """End every stream, open or opened later (the daemon is stopping). A stream never
        ends by itself, so a server stopping with a grace period would otherwise wait all
        of it out."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def stream(self, version: str, pb: _HealthModule, context: CallContext) -> Iterator[Any]:
        """Responses for one ``NodeWatchResources`` call until the kubelet goes away or
        :meth:`close`; runs in (and holds) one server thread."""
        with self._changed:
            refused = self._streams >= self._max_streams
            if not refused:
                self._streams += 1
            streams = self._streams
        if refused:
            log.warning("health stream refused: too many open", version=version,
                        streams=streams)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{streams} health streams are open already")
        call = _Call()
        if not context.add_callback(lambda: self._ended(call)):
            call.ended = True  # the call ended before the callback could be added
        log.info("kubelet opened a health stream", version=version, streams=streams)
        try:
            sent: int | None = None  # the generation last sent; None: nothing yet
            while (next_up := self._wait(call, sent)) is not None:
                source, sent = next_up
                # The callback only runs once no send of this call is pending; ask too.
                if not context.is_active():
                    return
                yield self._response(pb, source)  # the source runs outside the lock
        finally:
            with self._changed:
                self._streams -= 1
                streams = self._streams
            log.info("health stream closed", version=version, streams=streams)

    def _wait(self, call: _Call, sent: int | None) -> tuple[HealthSource, int] | None:
        """The source and generation to send next, once due; None: end the stream."""
        with self._changed:
            if sent is None:  # the first response, as soon as there is a source
                self._changed.wait_for(
                    lambda: self._closed or call.ended or self._source is not None)
            else:  # a change, or the resend interval without one
                self._changed.wait_for(
                    lambda: self._closed or call.ended or self._generation != sent,
                    self._resend_interval)
            if self._closed or call.ended or self._source is None:
                return None
            return self._source, self._generation

    def _ended(self, call: _Call) -> None:
        """gRPC's callback when the call ends (client gone, server stopping): wake it."""
        with self._changed:
            call.ended = True
            self._changed.notify_all()

    def _response(self, pb: _HealthModule, source: HealthSource) -> Any:
        status = {"Healthy": pb.HEALTHY, "Unhealthy": pb.UNHEALTHY, "Unknown": pb.UNKNOWN}
        return pb.NodeWatchResourcesResponse(devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=self._pool, device_name=health.device),
                health=status[health.status],
                last_updated_time=int(health.last_updated),
                health_check_timeout_seconds=self._timeout,
                message=truncate(health.message),
            )
            for health in source()
        ])


class _V1Servicer(health_v1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, service: HealthService) -> None:
        self._service = service

    def NodeWatchResources(
        self, request: health_v1_pb2.NodeWatchResourcesRequest, context: CallContext
    ) -> Iterator[health_v1_pb2.NodeWatchResourcesResponse]:
        return self._service.stream("v1", health_v1_pb2, context)


class _V1alpha1Servicer(health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, service: HealthService) -> None:
        self._service = service

    def NodeWatchResources(
        self, request: health_v1alpha1_pb2.NodeWatchResourcesRequest, context: CallContext
    ) -> Iterator[health_v1alpha1_pb2.NodeWatchResourcesResponse]:
        return self._service.stream("v1alpha1", health_v1alpha1_pb2, context)
