"""The ``pluginregistration.Registration`` service: how the kubelet finds the DRA socket.

The kubelet discovers the registration socket, calls ``GetInfo``, validates the answer and
reports the outcome with ``NotifyRegistrationStatus``. Its connection monitor keeps calling
``GetInfo`` (every 10 s, 10 s timeout, de-registering after two failures), so ``GetInfo``
answers from values fixed at construction and never waits for anything. The first
``NotifyRegistrationStatus(plugin_registered=true)`` is what the daemon waits for before it
publishes (:mod:`.publish_gate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence

import grpc
import structlog

from gpudra.api.proto import (
    DRA_ADVERTISED_PREFERRED,
    DRA_PLUGIN_TYPE,
    HEALTH_V1_ADVERTISED,
    HEALTH_V1ALPHA1_ADVERTISED,
    registration_pb2,
    registration_pb2_grpc,
)
from gpudra.kubeletplugin.serving.grpc_types import CallContext, RpcServer

log = structlog.get_logger(__name__)


def supported_versions(*, health: bool) -> tuple[str, ...]:
    """``PluginInfo.supported_versions``: v1 first (the kubelet takes the first it knows)."""
    versions: tuple[str, ...] = DRA_ADVERTISED_PREFERRED
    if health:
        # A 1.37 kubelet prefers v1 health when both are listed; 1.34-1.36 know only v1alpha1.
        versions += (HEALTH_V1_ADVERTISED, HEALTH_V1ALPHA1_ADVERTISED)
    return versions


class RegistrationState:
    """What the kubelet told us about our registration (for publishing and readiness)."""

    def __init__(self) -> None:
        self.registered = asyncio.Event()
        """Set while the kubelet's last word was "registered"."""
        self.confirmed = asyncio.Event()
        """Set at the first "registered" and never cleared: once the kubelet could call us,
        what we published stays published, whatever a restarted kubelet says next."""
        self.error: str | None = None

    def record(self, *, registered: bool, error: str | None) -> None:
        """Remember one ``NotifyRegistrationStatus`` from the kubelet."""
        self.error = error
        if registered:
            self.registered.set()
            self.confirmed.set()
        else:
            self.registered.clear()


class RegistrationServicer(registration_pb2_grpc.RegistrationServicer):
    """Answers the kubelet's plugin watcher, in the server's call threads; what the
    kubelet says goes to ``state`` on ``loop``."""

    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        versions: Sequence[str],
        state: RegistrationState,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._driver_name = driver_name
        self._endpoint = endpoint
        self._versions = tuple(versions)
        self._state = state
        self._loop = loop

    def add_to_server(self, server: RpcServer) -> None:
        """Register on a synchronous ``grpc.Server``."""
        registration_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            self, server)

    def _record(self, *, registered: bool, error: str | None) -> None:
        # The state's events belong to the loop. A closed loop: the daemon is exiting.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(
                functools.partial(self._state.record, registered=registered, error=error))

    def GetInfo(
        self, request: registration_pb2.InfoRequest, context: CallContext
    ) -> registration_pb2.PluginInfo:
        return registration_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=self._driver_name,
            endpoint=self._endpoint,
            supported_versions=self._versions,
        )

    def NotifyRegistrationStatus(
        self, request: registration_pb2.RegistrationStatus, context: CallContext
    ) -> registration_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            self._record(registered=True, error=None)
            log.info("registered with the kubelet", driver=self._driver_name,
                     endpoint=self._endpoint)
            return registration_pb2.RegistrationStatusResponse()
        error = request.error or "no reason given"
        self._record(registered=False, error=error)
        log.error("kubelet rejected the registration", driver=self._driver_name,
                  endpoint=self._endpoint, error=error)
        # Like the Go helper: a plain error, which gRPC reports as UNKNOWN.
        context.abort(grpc.StatusCode.UNKNOWN, f"failed registration process: {error}")
        raise AssertionError("unreachable: context.abort raises")
