"""The node daemon's two gRPC servers: DRA services and registration, one per unix socket.

On the DRA socket each kubelet call runs from request to answer in one thread, device work
included: the thread that polled its request from gRPC's completion queue
(:mod:`.core_server`), or, with a grpcio lacking that core API, one of the synchronous
server's call threads (:mod:`.call_threads`). The registration socket has a server of its
own (it stops first, below) on the DRA server's completion queue and threads: another
queue's threads would take part in polling the DRA socket (see
:class:`.core_server.CallQueue`). Its answers do not wait for start-up, and what the
kubelet tells it goes to the event loop's registration state.

Start order matters: the DRA server listens before the registration socket appears, so the
kubelet never sees a registration whose endpoint does not answer. Stop order is the
reverse: the registration socket goes first (its removal de-registers us; with a rolling
update the kubelet moves to the other instance), then in-flight DRA calls get a grace period,
then their work (which gRPC's cancellation does not stop) a bounded time to finish.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import grpc
import structlog

from . import core_server, sockets
from .call_threads import CallThreads
from .dra_service import ClaimCalls, DraV1beta1Servicer, DraV1Servicer
from .interfaces import ClaimPreparer
from .registration import RegistrationServicer, RegistrationState, supported_versions

log = structlog.get_logger(__name__)

DEFAULT_STOP_GRACE = 5.0
STOP_EVENT_MARGIN = 1.0
"""Seconds past the grace a stop waits for gRPC to say every call ended."""
REGISTRATION_THREADS = 2
"""Threads of the registration socket's server beside gRPC's synchronous server (else it
shares the DRA server's)."""
DEFAULT_WORK_WAIT = 5.0
"""At stop, after the grace period: how long call threads still working (a MIG create, an
MPS start) may finish before the daemon goes on without them."""
CALL_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""Claim calls on different GPUs proceed in parallel up to this many (the default
executor's limit); more wait for a thread. The pool has the health servicer's
``max_streams`` threads more, so open streams never leave claim calls without one (claim
calls stuck on busy GPUs can still keep a new stream waiting for a thread)."""


class Servicer(Protocol):
    """Something that registers its gRPC service(s), with synchronous handlers, on a
    ``grpc.Server`` or a :class:`.core_server.CallServer`."""

    def add_to_server(self, server: Any) -> None: ...


class HealthServicer(Servicer, Protocol):
    """Serves ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth``: its
    ``add_to_server`` registers both, and both are advertised when one is given."""

    @property
    def max_streams(self) -> int:
        """Streams served at once, each holding a call thread for its life; the server
        keeps that many threads beyond :data:`CALL_THREADS`."""
        ...


class CallWaiter(Protocol):
    """What waits for the DRA server's call threads at stop."""

    def close(self, timeout: float | None = None) -> bool: ...


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
        self._call_threads: CallWaiter | None = None
        self._registration_server: Any = None
        self._registration_threads: CallWaiter | None = None
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
        self._dra_server, self._call_threads = _serve_calls(
            self._dra_socket, dra_servicers,
            CALL_THREADS + (self._health.max_streams if self._health is not None else 0))
        self._calls_finished = False  # until a stop has seen them end
        registration = RegistrationServicer(
            self._driver_name, str(self._dra_socket), self._versions, self._registration,
            asyncio.get_running_loop())
        try:
            self._registration_server, self._registration_threads = _serve_registration(
                self._registration_socket, [registration], beside=self._dra_server)
        except BaseException:
            await self._stop_calls(self._dra_server, grace=None, work_wait=0.0)
            self._dra_server = None
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
        registration_server, self._registration_server = self._registration_server, None
        registration_threads, self._registration_threads = self._registration_threads, None
        dra_server, self._dra_server = self._dra_server, None
        try:
            if registration_server is not None:
                await _stop_server(registration_server, self._registration_socket,
                                   registration_threads, grace=None,
                                   work_wait=STOP_EVENT_MARGIN)
            self._registration.record(registered=False, error=None)
        finally:
            if dra_server is not None:
                await self._stop_calls(dra_server, grace=grace, work_wait=work_wait)
                log.info("stopped serving the kubelet", driver=self._driver_name)

    async def _stop_calls(self, server: Any, *, grace: float | None, work_wait: float) -> None:
        """Stop the DRA server, remove its socket, then wait for the call threads."""
        threads, self._call_threads = self._call_threads, None
        started = time.monotonic()
        self._calls_finished = await _stop_server(server, self._dra_socket, threads,
                                                  grace=grace, work_wait=work_wait)
        if not self._calls_finished:
            log.warning("kubelet calls still working after the stop's wait",
                        waited_seconds=round(time.monotonic() - started, 1))

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


def _serve_calls(socket: Path, servicers: Sequence[Servicer], max_threads: int,
                 ) -> tuple[Any, CallWaiter]:
    """A started gRPC server on ``socket`` running up to ``max_threads`` calls at once, and
    what waits for its threads at stop: :class:`.core_server.CallServer`, or gRPC's
    synchronous server where the installed grpcio lacks the core API it needs."""
    _remove_stale(socket)
    if core_server.available():
        server: Any = core_server.CallServer(max_threads)
        waiter: CallWaiter = server
    else:
        log.warning("grpcio lacks the core API of the DRA socket's server: using gRPC's "
                    "synchronous server (about 0.15 ms more per call)")
        waiter = threads = CallThreads(max_threads)
        server = grpc.server(threads)  # any Executor serves: gRPC only calls submit()
    _start(server, waiter, socket, servicers)
    return server, waiter


def _serve_registration(socket: Path, servicers: Sequence[Servicer], *, beside: Any,
                        ) -> tuple[Any, CallWaiter | None]:
    """A started server on ``socket`` on the completion queue and threads of ``beside`` (a
    :class:`.core_server.CallServer`), and None: its threads are ``beside``'s. Beside
    gRPC's synchronous server, one of those with two threads of its own, and them."""
    _remove_stale(socket)
    waiter: CallWaiter | None = None
    if isinstance(beside, core_server.CallServer):
        server: Any = core_server.CallServer(queue=beside.queue)
    else:
        waiter = threads = CallThreads(REGISTRATION_THREADS, name="gpudra-registration")
        server = grpc.server(threads)
    _start(server, waiter, socket, servicers)
    return server, waiter


def _start(server: Any, threads: CallWaiter | None, socket: Path,
           servicers: Sequence[Servicer]) -> None:
    """Start ``server`` serving ``servicers`` on ``socket``; if it cannot listen, stop it
    and its own ``threads`` (if any) before the error goes on."""
    try:
        _listen(server, socket, servicers)
    except ServerStartError:
        server.stop(None)
        if threads is not None:
            threads.close(0.0)
        raise
    server.start()


def _listen(server: Any, socket: Path, servicers: Sequence[Servicer]) -> None:
    """Register ``servicers`` on ``server`` (either kind) and bind it to ``socket``."""
    for servicer in servicers:
        servicer.add_to_server(server)
    try:
        server.add_insecure_port(f"unix:{socket}")
    except RuntimeError as exc:
        raise ServerStartError(f"cannot listen on unix socket {socket}: {exc}") from exc


async def _stop_server(server: Any, socket: Path, threads: CallWaiter | None, *,
                       grace: float | None, work_wait: float) -> bool:
    """Stop ``server`` (its calls cancelled after ``grace``), remove its socket, then wait
    up to ``work_wait`` seconds for its own ``threads``, if any; False if they still work."""
    loop = asyncio.get_running_loop()
    try:
        stopped = server.stop(grace)  # a threading.Event, set once every RPC ended
        # Bounded: gRPC sets it from its serving thread, which could be gone.
        await loop.run_in_executor(None, stopped.wait, (grace or 0.0) + STOP_EVENT_MARGIN)
    finally:
        _remove(socket)
    if threads is None:
        return True
    # gRPC's cancellation at the end of the grace does not stop a call's thread.
    return await loop.run_in_executor(None, threads.close, work_wait)


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
