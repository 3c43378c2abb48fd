"""A kubelet stand-in: discovers, registers and calls a DRA plugin over its real sockets.

It does what the kubelet's plugin watcher and DRA manager do, as a gRPC client:

- finds ``*-reg.sock`` in the registrar dir (names starting with ``.`` are ignored);
- ``GetInfo`` and validates it: type ``DRAPlugin``, a driver name, the first service of the
  plugin's ``supported_versions`` that this kubelet supports (in the plugin's order), an
  endpoint not already registered; a failure is reported back with
  ``NotifyRegistrationStatus(plugin_registered=False)``, like the kubelet does;
- connects to the endpoint, then ``NotifyRegistrationStatus(plugin_registered=True)``;
- sends each call to the most recently registered instance of the driver (rolling updates),
  with the kubelet's 45 s per-call timeout, and rejects responses the kubelet would reject
  (a requested claim missing, or a claim that was not requested).

``discover()`` registers what is there once; ``watch()`` (or :class:`BackgroundKubelet`,
from synchronous code) keeps registering sockets as they appear or are replaced, retrying a
failed one each second, like the kubelet's plugin watcher and reconciler. A daemon that
waits for registration before publishing needs one of those running.

Emulate a 1.32/1.33 kubelet (v1beta1 only) with ``services=(DRA_V1BETA1_ADVERTISED,)``.

Hostile mode (:meth:`KubeletEmulator.send_raw`, :func:`raw_claims`): a request with any
fields at all, empty, huge, path-shaped, not UTF-8, repeated or unknown, written on the wire
by hand (protobuf's own classes refuse some of these), and the plain answer back, without
the kubelet's checks of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from gpudra.api.claims import ClaimRef
from gpudra.api.proto import (
    DRA_PLUGIN_TYPE,
    DRA_V1_ADVERTISED,
    DRA_V1BETA1_ADVERTISED,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from gpudra.testing.kubelet_health import (
    KUBELET_HEALTH_SERVICES,
    HealthStreamError,
    HealthWatch,
    pick_service,
)

KUBELET_SERVICES = (DRA_V1_ADVERTISED, DRA_V1BETA1_ADVERTISED)
CALL_TIMEOUT = 45.0  # the kubelet's defaultClientCallTimeout
GET_INFO_TIMEOUT = 10.0  # the plugin watcher's getInfoTimeout
CONNECT_TIMEOUT = 5.0
RECONCILE_PERIOD = 1.0  # the plugin manager's reconciler retries a failed registration
WATCH_INTERVAL = 0.01  # the kubelet is told by inotify; polling this often is close enough

_MODULES = {
    DRA_V1_ADVERTISED: (dra_v1_pb2, dra_v1_pb2_grpc),
    DRA_V1BETA1_ADVERTISED: (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}

PrepareResponse = dict[str, dict[str, Any]]
UnprepareResponse = dict[str, dict[str, str]]


class RegistrationError(Exception):
    """The kubelet would refuse this plugin."""


class KubeletError(Exception):
    """The kubelet would fail the call because of the plugin's response."""


@dataclass
class PluginInstance:
    """One registered plugin socket and the connection to its DRA endpoint."""

    driver: str
    endpoint: str
    service: str  # the chosen supported_versions entry, e.g. "v1.DRAPlugin"
    registration_socket: Path
    info: registration_pb2.PluginInfo
    channel: Any = field(repr=False)
    stub: Any = field(repr=False)
    socket_id: tuple[int, int] | None = field(default=None, repr=False)
    """(inode, mtime) of the registration socket when registered: a replaced socket (the
    plugin restarted) is a new plugin."""


class KubeletEmulator:
    """See the module docstring. Use as ``async with await KubeletEmulator.discover(dir)``."""

    def __init__(
        self,
        registrar_dir: str | Path,
        *,
        services: Sequence[str] = KUBELET_SERVICES,
        call_timeout: float = CALL_TIMEOUT,
    ) -> None:
        self.registrar_dir = Path(registrar_dir)
        self.services = tuple(services)
        self.call_timeout = call_timeout
        self.instances: list[PluginInstance] = []  # registration order, like the kubelet
        self.failures: dict[Path, str] = {}  # watch(): sockets whose registration failed

    @classmethod
    async def discover(
        cls,
        registrar_dir: str | Path,
        *,
        services: Sequence[str] = KUBELET_SERVICES,
        call_timeout: float = CALL_TIMEOUT,
    ) -> KubeletEmulator:
        """Register every plugin socket in ``registrar_dir``; at least one must exist."""
        kubelet = cls(registrar_dir, services=services, call_timeout=call_timeout)
        try:
            if not await kubelet.rescan():
                raise RegistrationError(f"no *-reg.sock in {kubelet.registrar_dir}")
        except BaseException:
            await kubelet.close()
            raise
        return kubelet

    async def rescan(self) -> list[PluginInstance]:
        """Forget plugins whose socket is gone or replaced, register new sockets; return the
        new ones."""
        await self._forget_gone()
        return [await self.register(path) for path in self._new_sockets()]

    async def watch(self, *, interval: float = WATCH_INTERVAL,
                    retry: float = RECONCILE_PERIOD) -> None:
        """Register plugin sockets as they appear or are replaced, until cancelled.

        A registration that fails (refused, or the socket does not answer) is kept in
        ``failures`` and tried again ``retry`` seconds later, as the kubelet does.
        """
        failed_at: dict[Path, float] = {}
        while True:
            await self._forget_gone()
            for path in self._new_sockets():
                if time.monotonic() - failed_at.get(path, -retry) < retry:
                    continue
                try:
                    await self.register(path)
                except (RegistrationError, grpc.aio.AioRpcError, OSError) as exc:
                    failed_at[path] = time.monotonic()
                    self.failures[path] = str(exc)
                else:
                    failed_at.pop(path, None)
                    self.failures.pop(path, None)
            await asyncio.sleep(interval)

    async def _forget_gone(self) -> None:
        for instance in [i for i in self.instances
                         if _socket_id(i.registration_socket) != i.socket_id]:
            self.instances.remove(instance)
            await instance.channel.close()

    def _new_sockets(self) -> list[Path]:
        """Registration sockets not registered yet, oldest first."""
        known = {instance.registration_socket for instance in self.instances}
        found = []
        for path in self.registrar_dir.glob("*-reg.sock"):
            socket_id = _socket_id(path)
            if not path.name.startswith(".") and path not in known and socket_id is not None:
                found.append((socket_id[1], path.name, path))
        return [path for _, _, path in sorted(found)]

    async def register(self, registration_socket: str | Path) -> PluginInstance:
        """The plugin watcher's handshake with one registration socket."""
        socket = Path(registration_socket)
        socket_id = _socket_id(socket)
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            registration = _registration_stub(channel)
            info = await registration.GetInfo(
                registration_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT)
            try:
                service = self._validate(info)
                instance = await self._connect(info, service, socket)
            except RegistrationError as exc:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    # The plugin answers a refusal with an error status; the kubelet ignores it.
                    await registration.NotifyRegistrationStatus(
                        registration_pb2.RegistrationStatus(
                            plugin_registered=False, error=str(exc)),
                        timeout=GET_INFO_TIMEOUT,
                    )
                raise
            try:
                await registration.NotifyRegistrationStatus(
                    registration_pb2.RegistrationStatus(plugin_registered=True),
                    timeout=GET_INFO_TIMEOUT,
                )
            except BaseException:
                await instance.channel.close()
                raise
        instance.socket_id = socket_id
        self.instances.append(instance)
        return instance

    async def get_info(self, instance: PluginInstance | None = None) -> registration_pb2.PluginInfo:
        """Re-send ``GetInfo`` like the kubelet's connection monitor does every 10 s."""
        target = instance or self.instance()
        async with grpc.aio.insecure_channel(f"unix:{target.registration_socket}") as channel:
            info: registration_pb2.PluginInfo = await _registration_stub(channel).GetInfo(
                registration_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT)
        return info

    def instance(self, driver: str | None = None) -> PluginInstance:
        """The instance the kubelet would call: the most recently registered one."""
        candidates = [i for i in self.instances if driver is None or i.driver == driver]
        if not candidates:
            raise KubeletError(f"DRA driver {driver or '(any)'} is not registered")
        if driver is None and len({i.driver for i in candidates}) > 1:
            raise KubeletError("several drivers are registered: pass driver=")
        return candidates[-1]

    async def prepare(
        self, claims: Iterable[ClaimRef], *, driver: str | None = None
    ) -> PrepareResponse:
        """``NodePrepareResources``; returns ``{uid: {"devices": [...], "error": str}}``."""
        instance = self.instance(driver)
        pb2 = _MODULES[instance.service][0]
        claims = list(claims)
        response = await instance.stub.NodePrepareResources(
            pb2.NodePrepareResourcesRequest(claims=[_claim(pb2, c) for c in claims]),
            timeout=self.call_timeout,
        )
        _check_claims("NodePrepareResources", claims, response)
        return {
            uid: {"devices": [_device(d) for d in result.devices], "error": result.error}
            for uid, result in response.claims.items()
        }

    async def unprepare(
        self, claims: Iterable[ClaimRef], *, driver: str | None = None
    ) -> UnprepareResponse:
        """``NodeUnprepareResources``; returns ``{uid: {"error": str}}``."""
        instance = self.instance(driver)
        pb2 = _MODULES[instance.service][0]
        claims = list(claims)
        response = await instance.stub.NodeUnprepareResources(
            pb2.NodeUnprepareResourcesRequest(claims=[_claim(pb2, c) for c in claims]),
            timeout=self.call_timeout,
        )
        _check_claims("NodeUnprepareResources", claims, response)
        return {uid: {"error": result.error} for uid, result in response.claims.items()}

    async def send_raw(self, method: str, request: bytes, *,
                       driver: str | None = None) -> RawAnswer:
        """Hostile mode: send ``request`` (wire bytes, e.g. :func:`raw_claims`) as
        ``method`` (``NodePrepareResources`` or ``NodeUnprepareResources``) and return the
        answer as it came, a gRPC error status included; nothing of it is checked."""
        instance = self.instance(driver)
        pb2 = _MODULES[instance.service][0]
        service = pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
        response_type = getattr(pb2, f"{method}Response")
        call = instance.channel.unary_unary(
            f"/{service}/{method}", request_serializer=None,
            response_deserializer=response_type.FromString)
        try:
            response = await call(request, timeout=self.call_timeout)
        except grpc.aio.AioRpcError as exc:
            return RawAnswer(exc.code(), exc.details() or "", {})
        claims = {uid: {"error": result.error,
                        "devices": [_device(d) for d in getattr(result, "devices", ())]}
                  for uid, result in response.claims.items()}
        return RawAnswer(grpc.StatusCode.OK, "", claims)

    def watch_health(self, *, driver: str | None = None,
                     services: Sequence[str] = KUBELET_HEALTH_SERVICES,
                     clock: Callable[[], float] = time.time) -> HealthWatch:
        """Open the DRA health stream of the instance the kubelet would call, with the
        service the kubelet picks (``services``: its preference; see
        :mod:`gpudra.testing.kubelet_health`). Close it with :meth:`HealthWatch.close`."""
        instance = self.instance(driver)
        service = pick_service(instance.info.supported_versions, services)
        if service is None:
            raise HealthStreamError(
                f"the plugin lists no health service this kubelet knows "
                f"({list(instance.info.supported_versions)} vs {list(services)})")
        return HealthWatch(instance.channel, service, clock=clock)

    async def close(self) -> None:
        while self.instances:
            await self.instances.pop().channel.close()

    async def __aenter__(self) -> KubeletEmulator:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def _validate(self, info: registration_pb2.PluginInfo) -> str:
        """The kubelet's checks of ``PluginInfo``; returns the DRA service to use."""
        if info.type != DRA_PLUGIN_TYPE:
            raise RegistrationError(f"plugin type {info.type!r} is not {DRA_PLUGIN_TYPE!r}")
        if not info.name:
            raise RegistrationError("plugin name (the DRA driver name) is empty")
        if not info.supported_versions:
            raise RegistrationError("empty list of supported versions")
        # validateSupportedServices: the plugin's order decides, not the kubelet's.
        service: str | None = next(
            (s for s in info.supported_versions if s in self.services), None)
        if service is None:
            raise RegistrationError(
                f"none of services supported by the plugin {list(info.supported_versions)} "
                f"are supported by the kubelet {list(self.services)}")
        if any(i.driver == info.name and i.endpoint == info.endpoint for i in self.instances):
            raise RegistrationError(
                f"DRA plugin {info.name}: endpoint {info.endpoint} already registered")
        return service

    async def _connect(
        self, info: registration_pb2.PluginInfo, service: str, socket: Path
    ) -> PluginInstance:
        channel = grpc.aio.insecure_channel(f"unix:{info.endpoint}")
        try:
            # Stricter than the kubelet (which connects lazily): an advertised endpoint that
            # does not answer is a plugin bug worth failing on right here.
            await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT)
        except BaseException as exc:
            await channel.close()
            if isinstance(exc, TimeoutError):
                raise RegistrationError(f"endpoint {info.endpoint} does not answer") from exc
            raise
        stub = _MODULES[service][1].DRAPluginStub(channel)
        return PluginInstance(info.name, info.endpoint, service, socket, info, channel, stub)


@dataclass(frozen=True)
class RawAnswer:
    """What a plugin answered to a hostile request: the gRPC status, its details, and the
    per-claim entries (``{uid: {"error": str, "devices": [...]}}``) when it was OK."""

    code: Any
    details: str
    claims: dict[str, dict[str, Any]]


def _field(number: int, value: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def raw_claim(namespace: str | bytes = b"", uid: str | bytes = b"", name: str | bytes = b"",
              *, extra: bytes = b"") -> bytes:
    """A ``Claim`` message on the wire (v1 and v1beta1 share it: namespace 1, uid 2,
    name 3); bytes are written as they are (not UTF-8, NUL), ``extra`` appended (unknown or
    repeated fields)."""
    def data(value: str | bytes) -> bytes:
        return value.encode() if isinstance(value, str) else value

    return (_field(1, data(namespace)) + _field(2, data(uid)) + _field(3, data(name))
            + extra)


def raw_claims(claims: Iterable[bytes], *, extra: bytes = b"") -> bytes:
    """A ``NodePrepareResourcesRequest`` / ``NodeUnprepareResourcesRequest`` (``claims`` is
    field 1 of both) holding the given :func:`raw_claim` messages."""
    return b"".join(_field(1, claim) for claim in claims) + extra


class BackgroundKubelet:
    """A kubelet that registers plugins in ``registrar_dir`` from a thread of its own, for
    synchronous code (test helpers, the demo) that starts a daemon as a process.

    Start and stop it like a kubelet: ``start()`` (which creates ``registrar_dir``, as the
    kubelet does) and ``stop()``, or ``with``. It makes no DRA calls; a
    :class:`KubeletEmulator` in the caller's event loop does those. It also stops once
    ``registrar_dir`` is removed (a test's temporary directory was cleaned up).
    """

    def __init__(self, registrar_dir: str | Path, *,
                 services: Sequence[str] = KUBELET_SERVICES) -> None:
        self.registrar_dir = Path(registrar_dir)
        self._services = tuple(services)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._registered: list[str] = []
        self._failures: dict[Path, str] = {}

    def start(self) -> BackgroundKubelet:
        if self._thread is not None:
            raise RuntimeError("BackgroundKubelet.start() called twice")
        self.registrar_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()),
                                        name=f"kubelet:{self.registrar_dir}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def registered(self) -> list[str]:
        """Endpoints registered now, in registration order."""
        with self._lock:
            return list(self._registered)

    @property
    def failures(self) -> dict[Path, str]:
        """Registration sockets whose last registration failed, and why."""
        with self._lock:
            return dict(self._failures)

    def __enter__(self) -> BackgroundKubelet:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    async def _run(self) -> None:
        kubelet = KubeletEmulator(self.registrar_dir, services=self._services)
        watching = asyncio.create_task(kubelet.watch(), name="plugin-watcher")
        try:
            while not self._stop.is_set() and not watching.done():
                with self._lock:
                    self._registered = [i.endpoint for i in kubelet.instances]
                    self._failures = dict(kubelet.failures)
                if not self.registrar_dir.exists():
                    break
                await asyncio.sleep(WATCH_INTERVAL)
        finally:
            watching.cancel()
            [outcome] = await asyncio.gather(watching, return_exceptions=True)
            if outcome is not None and not isinstance(outcome, asyncio.CancelledError):
                with self._lock:  # a bug in the watcher: say so instead of going quiet
                    self._failures[self.registrar_dir] = f"plugin watcher died: {outcome!r}"
            await kubelet.close()


def _socket_id(path: Path) -> tuple[int, int] | None:
    """(inode, mtime) of a socket file; None when it is not there."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _registration_stub(channel: Any) -> Any:
    return registration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]


def _claim(pb2: Any, claim: ClaimRef) -> Any:
    return pb2.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid)


def _device(device: Any) -> dict[str, Any]:
    return {
        "request_names": list(device.request_names),
        "pool_name": device.pool_name,
        "device_name": device.device_name,
        "cdi_device_ids": list(device.cdi_device_ids),
        # proto3 optional, v1 only: absent and "" are different things on the wire.
        "share_id": device.share_id if "share_id" in device.DESCRIPTOR.fields_by_name
        and device.HasField("share_id") else None,
    }


def _check_claims(method: str, claims: Sequence[ClaimRef], response: Any) -> None:
    """What the kubelet's DRA manager fails the call on."""
    requested = {claim.uid for claim in claims}
    unknown = sorted(set(response.claims) - requested)
    if unknown:
        raise KubeletError(f"{method}: response contains claims that were not requested: "
                           f"{unknown}")
    missing = requested - set(response.claims)
    if missing:
        raise KubeletError(f"{method}: skipped {len(missing)} ResourceClaims: {sorted(missing)}")
