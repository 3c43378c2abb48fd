"""The node daemon: kubelet plugin + ResourceSlice publisher + probes, wired and supervised.

Start order: what can be checked without side effects (the API-server configuration, the
HTTP port) → HTTP probes (``/readyz`` says which step start-up is at) → NVML → checkpoint
and start-up reconciliation → inventory → gRPC sockets → API client → publishing,
once the kubelet has confirmed our registration (:mod:`.publish_gate`). Stop (``stop`` set,
e.g. by SIGTERM): stop accepting calls, let in-flight ones finish, remove our sockets, stop
publishing, return. The publisher is a supervised root task: restarted with back-off when
it dies, named in ``/readyz`` while it is down, and fatal (:class:`DaemonError`) when it
keeps dying.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from gpudra.api.claims import ClaimRef
from gpudra.driver.checkpoint_codec import CheckpointError
from gpudra.driver.health_monitor import HealthMonitor
from gpudra.driver.nvml import Nvml, NvmlUnavailable, open_nvml
from gpudra.driver.usage import IdleTracker
from gpudra.driver.usage_sampler import ClaimPods, UsageSampler
from gpudra.kubeletplugin.api_access import ApiAccessError, api_session, check_api_access
from gpudra.kubeletplugin.grpc_probe import answers_get_info
from gpudra.kubeletplugin.health_service import HealthService
from gpudra.kubeletplugin.http_probes import ProbeServer
from gpudra.kubeletplugin.interfaces import ClaimPreparer, PrepareOutcome
from gpudra.kubeletplugin.node_config import NodeConfig
from gpudra.kubeletplugin.node_state import (
    build_device_state,
    pick_up_answering_gpus,
    watched_gpus,
)
from gpudra.kubeletplugin.preparer import Preparer
from gpudra.kubeletplugin.publish_gate import PublishGate
from gpudra.kubeletplugin.server import PluginServer
from gpudra.kubeletplugin.supervisor import RootTaskFailed, Supervisor

if TYPE_CHECKING:  # the API client's modules load after registration (_import_client_modules)
    from gpudra.driver.checkpoint_model import ClaimRecord
    from gpudra.driver.device_state import DeviceState
    from gpudra.driver.usage import IdleTransition
    from gpudra.kubeletplugin.claim_status import ClaimStatusWriter
    from gpudra.kubeletplugin.events import IdleEvents

log = structlog.get_logger("gpudra.node")

MONITOR_STOP_WAIT = 0.02
"""Seconds shutdown waits for the XID watcher thread before leaving NVML open."""
USAGE_STOP_WAIT = 2.0
"""Seconds shutdown waits for a usage sampling pass in progress."""


class DaemonError(Exception):
    """The daemon cannot start or go on; the message is one line for the operator."""


async def serve(config: NodeConfig, stop: asyncio.Event) -> None:
    """Run the daemon until ``stop`` is set (also during start-up: SIGTERM is honoured
    while devices are still being discovered, and nothing is left behind).

    Raises :class:`DaemonError` when start-up fails or a root task keeps dying.
    """
    runtime = _Runtime(supervisor=Supervisor(config.restarts))
    stopping = asyncio.create_task(stop.wait(), name="stop")
    try:
        startup = asyncio.create_task(_start(config, runtime), name="startup")
        if await _unless_stopped(startup, stopping):
            failed = asyncio.create_task(runtime.supervisor.failed(), name="supervision")
            try:
                await _unless_stopped(failed, stopping)
            except RootTaskFailed as exc:
                raise DaemonError(str(exc)) from exc
        log.info("shutting down")
    finally:
        stopping.cancel()
        await runtime.close(config.shutdown_grace)


async def _unless_stopped(work: asyncio.Task[None], stopping: asyncio.Task[Any]) -> bool:
    """Wait for ``work`` (True; its error is raised) or for ``stopping`` (False; ``work``
    is cancelled and awaited)."""
    done, _ = await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        work.result()
        return True
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return False


@dataclass
class _Runtime:
    """What the daemon has started so far; closed in reverse order, whatever happened.

    The probe thread reads it: ``step`` says what start-up is doing (None once running).
    """

    supervisor: Supervisor
    step: str | None = "starting"
    server: PluginServer | None = None
    nvml: Nvml | None = None
    api: Any = None
    monitor: HealthMonitor | None = None
    probes: ProbeServer | None = None
    gate: PublishGate | None = None
    publisher: Any = None  # SlicePublisher, imported with the API client
    usage: UsageSampler | None = None
    """Per-claim usage sampling and the idle tracker (None: ``--usage-interval 0``)."""
    on_idle: Callable[[IdleTransition], None] | None = None
    """The idle tracker's listener: claim ``Idle`` conditions and idle Events."""

    def not_live(self) -> list[str]:
        """``/healthz``: the registration socket answers ``GetInfo`` (the loop is not stuck)."""
        server = self.server
        if server is None or (self.step is not None and not server.serving):
            return [f"starting: {self.step}"]
        if answers_get_info(server.registration_socket_path):
            return []
        return ["the registration socket does not answer GetInfo"]

    def not_ready(self) -> list[str]:
        """``/readyz``: one line per reason the node cannot take claims yet."""
        problems = [] if self.step is None else [f"starting: {self.step}"]
        if self.gate is not None:
            problems += self.gate.problems()
        publisher = self.publisher
        if (publisher is not None and self.gate is not None and self.gate.open
                and not publisher.synced.is_set()):
            error = publisher.stats()["last_error"]
            problems.append("ResourceSlices not published yet"
                            + (f" (last error: {error})" if error else ""))
        return problems + self.supervisor.problems()

    async def close(self, grace: float) -> None:
        if self.server is not None:
            await self.server.stop(grace)  # sockets go first: the kubelet sees us leave
        await self.supervisor.stop()
        if self.probes is not None:
            self.probes.stop()
        if self.usage is not None:  # before NVML shuts down under it; a pass takes ms
            await _in_daemon_thread(self.usage.stop, USAGE_STOP_WAIT)
        watcher_stopped = True
        if self.monitor is not None:
            # The XID watcher notices within one NVML wait slice (250 ms); the daemon need
            # not wait that long to exit, only to shut NVML down under the watcher.
            stopping = asyncio.ensure_future(_in_daemon_thread(self.monitor.stop))
            done, _ = await asyncio.wait({stopping}, timeout=MONITOR_STOP_WAIT)
            watcher_stopped = bool(done)
        if self.api is not None:
            await self.api.close()
        if self.nvml is not None and watcher_stopped:
            self.nvml.shutdown()
        # else: the watcher may be inside nvmlEventSetWait, where nvmlShutdown is not safe;
        # the process is ending, and the kernel releases what NVML holds.


async def _start(config: NodeConfig, runtime: _Runtime) -> None:
    # What can fail without side effects fails first, before the kubelet ever sees us.
    try:
        connection = check_api_access(config.kubeconfig)
    except ApiAccessError as exc:
        raise DaemonError(str(exc)) from exc
    if config.http_address is not None:
        runtime.probes = _probes(config.http_address, runtime)
        runtime.probes.start()
    paths = config.paths
    paths.data_dir.mkdir(parents=True, exist_ok=True)
    runtime.step = "opening NVML"
    try:
        runtime.nvml = nvml = open_nvml(simulate=config.simulate, sim_state=paths.sim_state,
                                        driver_root=paths.driver_root)
    except NvmlUnavailable as exc:
        raise DaemonError(str(exc)) from exc
    runtime.step = "discovering devices and reconciling the checkpoint"
    try:
        state = await _in_daemon_thread(build_device_state, config, nvml)
    except CheckpointError as exc:  # e.g. the previous pod still holds the lock
        raise DaemonError(f"checkpoint: {exc}") from exc
    monitor: HealthMonitor | None = None
    health: HealthService | None = None
    if config.gates.enabled("DeviceHealthCheck"):
        health = HealthService(config.node_name, lambda: (
            monitor.device_health(state.index.devices) if monitor is not None else ()))
    # Register once the node state is ready; calls that arrive while the API client
    # (not needed to register) loads wait for it in _StartingPreparer.
    starting = _StartingPreparer()
    runtime.step = "serving the kubelet sockets"
    runtime.server = server = PluginServer(config.driver_name, config.registrar_dir,
                                           config.plugins_dir, config.pod_uid, starting,
                                           health_servicer=health)
    await server.start()
    runtime.gate = gate = PublishGate(server.registration, config.registration_timeout,
                                      server.registration_socket_path)
    runtime.step = "loading the API client"
    # Imported off the loop, which meanwhile answers the kubelet's registration calls.
    await _in_daemon_thread(_import_client_modules)
    from gpudra.controller.publisher import SlicePublisher
    from gpudra.kubeletplugin.claim_fetcher import ClaimFetcher
    from gpudra.kubeletplugin.claim_status import Observers, idle_listener, unhealthy_devices

    runtime.api = api = api_session(connection)
    pods = ClaimPods()  # who each claim is reserved for, as prepare saw it: usage labels
    status, idle_events = _claim_observers(config, api, state)
    runtime.on_idle = idle_listener(asyncio.get_running_loop(), status.idle_changed,
                                    idle_events.idle_changed)
    starting.ready(Preparer(driver=config.driver_name, fetcher=ClaimFetcher(api), state=state,
                            observer=Observers(status, idle_events, pods)))
    if config.usage_interval > 0:
        runtime.usage = UsageSampler(
            nvml=nvml, state=state, pods=pods, interval=config.usage_interval,
            tracker=IdleTracker(config.idle_threshold, config.idle_after,
                                listeners=[] if runtime.on_idle is None else [runtime.on_idle]))
        runtime.usage.start()
    publisher = SlicePublisher(api, driver=config.driver_name, node_name=config.node_name)
    if health is not None:
        loop = asyncio.get_running_loop()

        def refresh() -> None:
            assert monitor is not None and health is not None
            devices = monitor.apply(state.index.devices)
            publisher.update(devices)
            status.health_changed(unhealthy_devices(devices))
            health.notify()

        def changed() -> None:  # called from the watcher thread
            pick_up_answering_gpus(config, state, nvml)  # NVML reads: here, off the loop
            loop.call_soon_threadsafe(refresh)

        runtime.monitor = monitor = HealthMonitor(nvml, watched_gpus(state), config.health,
                                                  on_change=changed)
        monitor.start()
        refresh()
    else:
        publisher.update(state.index.devices)
    runtime.publisher = publisher

    async def publish() -> None:
        await gate.wait()  # at once after the first time: a restart does not wait again
        await publisher.run()

    runtime.supervisor.start("publisher", publish)
    runtime.supervisor.start("claim status", status.run)
    runtime.supervisor.start("idle events", idle_events.run)
    runtime.step = None
    log.info("node daemon running", node=config.node_name, driver=config.driver_name,
             devices=len(state.index.devices.devices), simulate=config.simulate)


def _claim_observers(config: NodeConfig, api: Any, state: DeviceState,
                     ) -> tuple[ClaimStatusWriter, IdleEvents]:
    """Claim device status and idle Events: told by the preparer, written in the background."""
    from gpudra.kube.raw_api import RawApi
    from gpudra.kubeletplugin.claim_status import ClaimStatusWriter
    from gpudra.kubeletplugin.events import IdleEvents

    def records() -> Mapping[str, ClaimRecord]:
        return state.store.load().claims  # the checkpoint as it is now

    raw = RawApi(api)
    status = ClaimStatusWriter(raw, driver=config.driver_name, records=records,
                               watch_health=config.gates.enabled("DeviceHealthCheck"))
    return status, IdleEvents(raw, driver=config.driver_name, node=config.node_name)


def _import_client_modules() -> None:
    """The API client (aiohttp) and what uses it: not needed to register."""
    import gpudra.controller.publisher
    import gpudra.kubeletplugin.claim_fetcher
    import gpudra.kubeletplugin.claim_status  # noqa: F401


def _probes(address: tuple[str, int], runtime: _Runtime) -> ProbeServer:
    """The HTTP probe server, listening; a port in use is a one-line :class:`DaemonError`."""
    try:
        return ProbeServer(address, live=runtime.not_live, ready=runtime.not_ready)
    except OSError as exc:
        host, port = address
        raise DaemonError(f"--http-address {host}:{port}: {exc.strerror or exc}") from exc


class _StartingPreparer:
    """Calls that arrive between registration and the API client being ready wait here.

    The sockets come up as soon as the node's devices are known; importing the API
    client (aiohttp, the publisher; not needed to register) happens after, and takes well
    under a second, far inside the kubelet's 45 s call deadline.
    """

    def __init__(self) -> None:
        self._ready = asyncio.Event()
        self._inner: ClaimPreparer | None = None

    def ready(self, inner: ClaimPreparer) -> None:
        self._inner = inner
        self._ready.set()

    async def _target(self) -> ClaimPreparer:
        await self._ready.wait()
        assert self._inner is not None
        return self._inner

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        return await (await self._target()).prepare(claims)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        return await (await self._target()).unprepare(claims)


T = TypeVar("T")


async def _in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking start-up work in a daemon thread.

    Unlike ``asyncio.to_thread``, a SIGTERM during slow device discovery does not have to
    wait for it: the interpreter does not join daemon threads at exit.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting task, not lost in the thread
            loop.call_soon_threadsafe(_settle, future, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=work, name="start-up", daemon=True).start()
    return await future


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
