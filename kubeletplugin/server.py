"""The node daemon's two gRPC servers: DRA services and registration, one per unix socket.

Start order matters: the DRA server listens before the registration socket appears, so the
kubelet never sees a registration whose endpoint does not answer. Stop order is the
reverse: the registration socket goes first (its removal de-registers us; with a rolling
update the kubelet moves to the other instance), then in-flight DRA calls get a grace period.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import grpc
import structlog

from . import sockets
from .dra_service import ClaimCalls, DraV1beta1Servicer, DraV1Servicer
from .interfaces import ClaimPreparer
from .registration import RegistrationServicer, RegistrationState, supported_versions

log = structlog.get_logger(__name__)

DEFAULT_STOP_GRACE = 5.0


class Servicer(Protocol):
    """Something that registers its gRPC service(s) on a ``grpc.aio.Server``."""

    def add_to_server(self, server: Any) -> None: ...


class HealthServicer(Servicer, Protocol):
    """Serves ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth``: its
    ``add_to_server`` registers both, and both are advertised when one is given."""


class ServerStartError(RuntimeError):
    """A gRPC server could not listen on its socket."""


class PluginServer:
    """Serves the kubelet: DRA v1 + v1beta1 (+ health) on the DRA socket, registration on
    the registration socket. Socket names follow :mod:`.sockets`; a ``pod_uid`` makes them
    unique per pod for rolling updates."""

    def __init__(
        self,
        driver_name: str,
        registrar_dir: str | os.PathLike[str],
        plugins_dir: str | os.PathLike[str],
        pod_uid: str | None,
        preparer: ClaimPreparer,
        *,
        health_servicer: HealthServicer | None = None,
    ) -> None:
        # Paths are computed here so a name that cannot fit fails before anything starts.
        self._driver_name = driver_name
        self._plugin_data_dir = sockets.plugin_data_dir(plugins_dir, driver_name)
        self._dra_socket = sockets.dra_socket_path(plugins_dir, driver_name, pod_uid)
        self._registration_socket = sockets.registration_socket_path(
            registrar_dir, driver_name, pod_uid)
        self._preparer = preparer
        self._health = health_servicer
        self._versions = supported_versions(health=health_servicer is not None)
        self._registration = RegistrationState()
        self._dra_server: Any = None
        self._registration_server: Any = None
        self._stopping: asyncio.Task[None] | None = None

    @property
    def driver_name(self) -> str:
        return self._driver_name

    @property
    def plugin_data_dir(self) -> Path:
        """Shared by all instances of the driver on this node (checkpoint, locks)."""
        return self._plugin_data_dir

    @property
    def dra_socket_path(self) -> Path:
        return self._dra_socket

    @property
    def registration_socket_path(self) -> Path:
        return self._registration_socket

    @property
    def supported_versions(self) -> tuple[str, ...]:
        return self._versions

    @property
    def registration(self) -> RegistrationState:
        """``registration.registered`` is set once the kubelet accepted us."""
        return self._registration

    @property
    def serving(self) -> bool:
        """Started and not (being) stopped."""
        return self._dra_server is not None and self._stopping is None

    async def start(self) -> None:
        """Create the directories, replace stale sockets, start DRA then registration."""
        if self._dra_server is not None or self._stopping is not None:
            raise RuntimeError("PluginServer.start() called twice (or after stop())")
        for directory in (self._plugin_data_dir, self._registration_socket.parent):
            directory.mkdir(parents=True, exist_ok=True)
        calls = ClaimCalls(self._preparer)
        dra_servicers: list[Servicer] = [DraV1Servicer(calls), DraV1beta1Servicer(calls)]
        if self._health is not None:
            dra_servicers.append(self._health)
        self._dra_server = await _serve(self._dra_socket, dra_servicers)
        registration = RegistrationServicer(
            self._driver_name, str(self._dra_socket), self._versions, self._registration)
        try:
            self._registration_server = await _serve(self._registration_socket, [registration])
        except BaseException:
            await _shutdown(self._dra_server, self._dra_socket, grace=None)
            self._dra_server = None
            raise
        log.info("serving the kubelet", driver=self._driver_name,
                 dra_socket=str(self._dra_socket),
                 registration_socket=str(self._registration_socket),
                 supported_versions=list(self._versions))

    async def stop(self, grace: float | None = DEFAULT_STOP_GRACE) -> None:
        """Stop serving: registration at once, DRA calls in flight get ``grace`` seconds.

        Idempotent and safe to call concurrently; a cancelled caller does not cut the
        shutdown short.
        """
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._stop(grace), name="gpudra-plugin-stop")
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float | None) -> None:
        registration_server, self._registration_server = self._registration_server, None
        dra_server, self._dra_server = self._dra_server, None
        if registration_server is not None:
            await _shutdown(registration_server, self._registration_socket, grace=None)
        self._registration.record(registered=False, error=None)
        if dra_server is not None:
            await _shutdown(dra_server, self._dra_socket, grace=grace)
            log.info("stopped serving the kubelet", driver=self._driver_name)

    async def __aenter__(self) -> PluginServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()


async def _serve(socket: Path, servicers: Sequence[Servicer]) -> Any:
    """A started ``grpc.aio`` server listening on ``socket`` (stale file removed first)."""
    _remove_stale(socket)
    # Created here, inside a coroutine, so the server belongs to the running loop.
    server = grpc.aio.server()
    for servicer in servicers:
        servicer.add_to_server(server)
    try:
        server.add_insecure_port(f"unix:{socket}")
    except RuntimeError as exc:
        await server.stop(None)
        raise ServerStartError(f"cannot listen on unix socket {socket}: {exc}") from exc
    await server.start()
    return server


async def _shutdown(server: Any, socket: Path, *, grace: float | None) -> None:
    try:
        await server.stop(grace)
    finally:
        _remove(socket)


def _remove(socket: Path) -> None:
    # grpc unlinks its socket on stop; make sure, since a leftover socket file in the
    # registry dir makes the kubelet keep retrying a dead plugin.
    socket.unlink(missing_ok=True)


def _remove_stale(socket: Path) -> None:
    """Remove a leftover socket file (a crashed predecessor's); refuse to touch a directory."""
    if socket.is_dir() and not socket.is_symlink():
        raise ServerStartError(f"socket path {socket} is a directory")
    if socket.is_symlink() or socket.exists():
        log.info("removing stale socket file", path=str(socket))
        socket.unlink(missing_ok=True)
