"""The node daemon's two gRPC servers: DRA services and registration, one per unix socket.

Both are grpcio's public synchronous server, ``grpc.server`` with a thread pool, not
``grpc.aio``:

- **The handlers block.** A prepare or unprepare runs driver code (NVML, files, the
  checkpoint's durable commit) from request to answer. The synchronous server runs it in a
  pool thread as it stands; under ``grpc.aio`` every call would go from the event loop to a
  worker thread and back, and the loop, which also publishes slices and writes statuses,
  would carry the kubelet's I/O too.
- **Health streams are served** by a thread each, for their life. The DRA server's pool
  has :attr:`HealthServicer.max_streams` threads beyond :data:`CALL_THREADS`, and the
  health service refuses streams past that limit, so streams never take the threads
  claim calls need.
- **Stop with grace works as the daemon needs**: ``Server.stop(grace)`` refuses new calls
  at once, lets calls in flight answer for ``grace`` seconds, then cancels them and sets an
  event once every call ended. A cancelled handler's thread goes on (gRPC cannot stop
  driver code half way), so the stop then waits a bounded time for the pool's threads.
- **The kubelet's calls can be cancelled** (its 45 s deadline, or gone): the handler's
  ``context.is_active()`` turns False, which the preparer asks before device work
  (``wanted``), and a call cancelled while it waited for a pool thread never runs its
  handler (gRPC checks before reading the request).

The registration socket has a server and a small pool of its own, so its answers never wait
behind claim calls or for start-up; what the kubelet tells it goes to the event loop's
registration state.

Start order matters: the DRA server listens before the registration socket appears, so the
kubelet never sees a registration whose endpoint does not answer. Stop order is the
reverse: the registration socket goes first (its removal de-registers us; with a rolling
update the kubelet moves to the other instance), then in-flight DRA calls get a grace period,
then their work a bounded time to finish.

A pool's threads are not daemon threads: should one still be stuck in device work when the
daemon exits with an error, the interpreter waits for it (a clean stop exits at once, see
``gpudra.cli.node_cmd``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

import grpc
import structlog

from gpudra.driver import files
from gpudra.kubeletplugin.serving import sockets
from gpudra.kubeletplugin.serving.dra_service import ClaimCalls, DraV1beta1Servicer, DraV1Servicer
from gpudra.kubeletplugin.serving.grpc_types import RpcServer, Servicer
from gpudra.kubeletplugin.serving.interfaces import ClaimPreparer
from gpudra.kubeletplugin.serving.registration import (
    RegistrationServicer,
    RegistrationState,
    supported_versions,
)

log = structlog.get_logger(__name__)

DEFAULT_STOP_GRACE = 5.0
STOP_EVENT_MARGIN = 1.0
"""Seconds past the grace a stop waits for gRPC to say every call ended."""
REGISTRATION_THREADS = 2
"""The registration server's pool: the kubelet's ``GetInfo`` and its notification."""
DEFAULT_WORK_WAIT = 5.0
"""At stop, after the grace period: how long call threads still working (a MIG create, an
MPS start) may finish before the daemon goes on without them."""
CALL_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""Claim calls on different GPUs proceed in parallel up to this many (the default
executor's limit); more wait for a thread. The pool has the health servicer's
``max_streams`` threads more, so open streams never leave claim calls without one (claim
calls stuck on busy GPUs can still keep a new stream waiting for a thread)."""


class HealthServicer(Servicer, Protocol):
    """Serves ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth``: its
    ``add_to_server`` registers both, and both are advertised when one is given."""

    @property
    def max_streams(self) -> int:
        """Streams served at once, each holding a call thread for its life; the server
        keeps that many threads beyond :data:`CALL_THREADS`."""
        ...


class ServerStartError(RuntimeError):
    """A gRPC server could not listen on its socket."""


@dataclass(frozen=True)
class _Served:
    """A started gRPC server, the pool its handlers run in, and its socket."""

    server: RpcServer
    pool: ThreadPoolExecutor
    socket: Path


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
        self._dra: _Served | None = None
        self._registration_served: _Served | None = None
        self._stopping: asyncio.Task[None] | None = None
        self._calls_finished = True

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
    def calls_finished(self) -> bool:
        """After :meth:`stop`: every call's work ended (False: a call thread still works
        and may, e.g., hold the checkpoint lock)."""
        return self._calls_finished

    @property
    def serving(self) -> bool:
        """Started and not (being) stopped."""
        return self._dra is not None and self._stopping is None

    async def start(self) -> None:
        """Create the directories, replace stale sockets, start DRA then registration."""
        if self._dra is not None or self._stopping is not None:
            raise RuntimeError("PluginServer.start() called twice (or after stop())")
        # The driver's own directory (the kubelet's parents keep their modes), closed to
        # others even when an older build made it under a permissive umask.
        files.make_dirs(self._plugin_data_dir)
        files.restrict(self._plugin_data_dir, files.DIR_MODE)
        files.make_dirs(self._registration_socket.parent)
        calls = ClaimCalls(self._preparer)
        dra_servicers: list[Servicer] = [DraV1Servicer(calls), DraV1beta1Servicer(calls)]
        if self._health is not None:
            dra_servicers.append(self._health)
        threads = CALL_THREADS + (self._health.max_streams if self._health is not None else 0)
        self._dra = _serve(self._dra_socket, dra_servicers, threads, "gpudra-call")
        self._calls_finished = False  # until a stop has seen them end
        registration = RegistrationServicer(
            self._driver_name, str(self._dra_socket), self._versions, self._registration,
            asyncio.get_running_loop())
        try:
            self._registration_served = _serve(
                self._registration_socket, [registration], REGISTRATION_THREADS,
                "gpudra-registration")
        except BaseException:
            dra, self._dra = self._dra, None
            await _stop_server(dra, grace=None, work_wait=0.0)
            raise
        log.info("serving the kubelet", driver=self._driver_name,
                 dra_socket=str(self._dra_socket),
                 registration_socket=str(self._registration_socket),
                 supported_versions=list(self._versions))

    async def stop(self, grace: float | None = DEFAULT_STOP_GRACE, *,
                   work_wait: float = DEFAULT_WORK_WAIT) -> None:
        """Stop serving: registration at once, DRA calls in flight get ``grace`` seconds to
        answer, and their work ``work_wait`` more to end (see :attr:`calls_finished`).

        Idempotent and safe to call concurrently; a cancelled caller does not cut the
        shutdown short.
        """
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._stop(grace, work_wait),
                                                 name="gpudra-plugin-stop")
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float | None, work_wait: float) -> None:
        registration, self._registration_served = self._registration_served, None
        dra, self._dra = self._dra, None
        try:
            if registration is not None:
                await _stop_server(registration, grace=None, work_wait=STOP_EVENT_MARGIN)
            self._registration.record(registered=False, error=None)
        finally:
            if dra is not None:
                started = time.monotonic()
                self._calls_finished = await _stop_server(dra, grace=grace,
                                                          work_wait=work_wait)
                if not self._calls_finished:
                    log.warning("kubelet calls still working after the stop's wait",
                                waited_seconds=round(time.monotonic() - started, 1))
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


def _serve(socket: Path, servicers: Sequence[Servicer], threads: int, name: str) -> _Served:
    """A started ``grpc.server`` on ``socket`` running up to ``threads`` handlers at once;
    if it cannot listen, nothing is left running."""
    _remove_stale(socket)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
    server: RpcServer = grpc.server(pool)
    try:
        for servicer in servicers:
            servicer.add_to_server(server)
        try:
            with sockets.binding(socket):
                server.add_insecure_port(f"unix:{socket}")
        except RuntimeError as exc:
            raise ServerStartError(f"cannot listen on unix socket {socket}: {exc}") from exc
    except BaseException:
        server.stop(None)
        pool.shutdown(wait=False)
        raise
    server.start()
    return _Served(server, pool, socket)


async def _stop_server(served: _Served, *, grace: float | None, work_wait: float) -> bool:
    """Stop ``served`` (its calls cancelled after ``grace``), remove its socket, then wait
    up to ``work_wait`` seconds for its pool's threads; False if they still work."""
    loop = asyncio.get_running_loop()
    try:
        stopped = served.server.stop(grace)
        # Bounded: gRPC sets it from its serving thread, which could be gone.
        await loop.run_in_executor(None, stopped.wait, (grace or 0.0) + STOP_EVENT_MARGIN)
    finally:
        _remove(served.socket)
    # gRPC's cancellation at the end of the grace does not stop a handler's thread. The
    # pool's shutdown waits for its threads in a daemon thread, so that this wait is bounded.
    ended = threading.Event()

    def shut_down() -> None:
        served.pool.shutdown(wait=True)
        ended.set()

    threading.Thread(target=shut_down, name="gpudra-pool-shutdown", daemon=True).start()
    return await loop.run_in_executor(None, ended.wait, work_wait)


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
