"""The node daemon: kubelet plugin + ResourceSlice publisher + probes, wired and supervised.

Start order, in two phases. Phase 1 needs only what serves the kubelet (gRPC, the protobuf
modules, this package's servers): what can be checked without side effects (the API-server
configuration, the HTTP port) → HTTP probes (``/readyz`` says which step start-up is at) →
gRPC sockets, so the kubelet's ``GetInfo`` is answered within a fraction of a second of
exec. Phase 2, while the sockets answer: the driver's modules and the API client are
imported off the loop → NVML → checkpoint and start-up reconciliation → inventory → API
client → publishing, once the kubelet has confirmed our registration
(:mod:`gpudra.kubeletplugin.serving.publish_gate`).
Claim calls that arrive during phase 2 wait for it (:class:`_StartingPreparer`); when it
fails they get the error, the sockets are removed and the daemon exits. Stop (``stop`` set,
e.g. by SIGTERM): end the kubelet's health streams, stop accepting calls, let in-flight ones
finish, remove our sockets, stop publishing, return. The publisher is a supervised root
task: restarted with back-off when it dies, named in ``/readyz`` while it is down, and fatal
(:class:`DaemonError`) when it keeps dying.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from gpudra.api.claims import ClaimRef
from gpudra.driver.faults import delay_point
from gpudra.kubeletplugin.node.api_access import ApiAccessError, api_session, check_api_access
from gpudra.kubeletplugin.node.node_config import NodeConfig
from gpudra.kubeletplugin.node.supervisor import RootTaskFailed, Supervisor
from gpudra.kubeletplugin.serving.grpc_probe import answers_get_info
from gpudra.kubeletplugin.serving.health_service import HealthService
from gpudra.kubeletplugin.serving.interfaces import ClaimPreparer, PrepareOutcome, always
from gpudra.kubeletplugin.serving.publish_gate import PublishGate
from gpudra.kubeletplugin.serving.server import PluginServer

if TYPE_CHECKING:  # imported when used: phase 2 (off the loop), the probes (when enabled)
    from gpudra.controller.publisher import SlicePublisher
    from gpudra.driver.checkpoint_model import ClaimRecord
    from gpudra.driver.device_state import DeviceState
    from gpudra.driver.health_monitor import HealthMonitor
    from gpudra.driver.nvml import Nvml
    from gpudra.driver.usage import IdleTransition
    from gpudra.driver.usage_sampler import UsageSampler
    from gpudra.kube.session import ApiSession, ConnectionSource
    from gpudra.kubeletplugin.claims.preparer import Preparer
    from gpudra.kubeletplugin.cluster.claim_status import ClaimStatusWriter
    from gpudra.kubeletplugin.cluster.events import IdleEvents
    from gpudra.kubeletplugin.node.http_probes import ProbeServer

log = structlog.get_logger("gpudra.node")

MONITOR_STOP_WAIT = 0.02
"""Seconds shutdown waits for the XID watcher thread before leaving NVML open."""
USAGE_STOP_WAIT = 2.0
"""Seconds shutdown waits for a usage sampling pass in progress."""
STARTING_POLL = 0.2
"""Seconds between a waiting call's looks at whether the kubelet still waits for it."""
DEVICE_WORK_STOP_WAIT = 5.0
"""At stop, how long kubelet calls still working (a MIG create, an MPS start) may finish."""


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
    health: HealthService | None = None
    nvml: Nvml | None = None
    api: ApiSession | None = None
    monitor: HealthMonitor | None = None
    probes: ProbeServer | None = None
    gate: PublishGate | None = None
    publisher: SlicePublisher | None = None  # imported with the API client
    preparer: Preparer | None = None  # imported in phase 2
    state: DeviceState | None = None  # imported in phase 2
    usage: UsageSampler | None = None
    """Per-claim usage sampling and the idle tracker (None: ``--usage-interval 0``)."""
    on_idle: Callable[[IdleTransition], None] | None = None
    """The idle tracker's listener: claim ``Idle`` conditions and idle Events."""
    held: tuple[str, ...] = ()
    """Hardware held for claims the node cannot name, one line each (``/readyz`` notes)."""
    held_event: asyncio.Task[None] | None = None

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

    def held_notes(self) -> list[str]:
        """``/readyz`` lines after its verdict: held hardware does not make the node unready
        (it serves its other devices), but whoever looks must see it."""
        return list(self.held)

    async def close(self, grace: float) -> None:
        if self.held_event is not None:
            self.held_event.cancel()
        if self.health is not None:  # its streams would make the server wait out `grace`
            self.health.close()
        if self.server is not None:
            # Sockets go first (the kubelet sees us leave), then calls' work may end.
            await self.server.stop(grace, work_wait=DEVICE_WORK_STOP_WAIT)
        await self.supervisor.stop()
        if self.probes is not None:
            self.probes.stop()
        if self.usage is not None:  # before NVML shuts down under it; a pass takes ms
            await _in_daemon_thread(self.usage.stop, USAGE_STOP_WAIT)
        watcher_stopped = True
        if self.monitor is not None:
            # The XID watcher notices within one NVML wait slice (250 ms); the daemon need
            # not wait that long to exit, only to shut NVML down under the watcher.
            watcher_stopped = await _in_daemon_thread_within(
                MONITOR_STOP_WAIT, self.monitor.stop) is not None
        if self.api is not None:
            await self.api.close()
        calls_ended = self.server is None or self.server.calls_finished
        if self.nvml is not None and watcher_stopped and calls_ended:
            self.nvml.shutdown()
        # else: the watcher may be inside nvmlEventSetWait, or a call thread inside a MIG
        # create, where nvmlShutdown is not safe; the process is ending, and the kernel
        # releases what NVML holds.


async def _start(config: NodeConfig, runtime: _Runtime) -> None:
    # Phase 1. What can fail without side effects fails first, before the kubelet ever
    # sees us.
    try:
        connection = check_api_access(config.kubeconfig)
    except ApiAccessError as exc:
        raise DaemonError(str(exc)) from exc
    if config.http_address is not None:
        runtime.probes = _probes(config.http_address, runtime)
        runtime.probes.start()
    health: HealthService | None = None
    if config.gates.enabled("DeviceHealthCheck"):
        # Streams opened before phase 2 knows the devices wait for it (set_source).
        runtime.health = health = HealthService(config.node_name)
    starting = _StartingPreparer()
    runtime.step = "serving the kubelet sockets"
    delay_point("start:sockets")
    runtime.server = server = PluginServer(config.driver_name, config.registrar_dir,
                                           config.plugins_dir, config.pod_uid, starting,
                                           health_servicer=health)
    # From here claim calls may wait in `starting`: whatever fails settles it.
    try:
        await server.start()
        # Its clock starts now, with the registration socket; /readyz shows it once running.
        gate = PublishGate(server.registration, config.registration_timeout,
                           server.registration_socket_path)
        # Phase 2: claim calls wait in `starting` until it is done, and fail if it fails.
        await _start_node(config, runtime, connection, starting=starting, health=health,
                          gate=gate)
    except BaseException as exc:
        starting.fail(_start_failure(exc))
        raise


async def _start_node(config: NodeConfig, runtime: _Runtime, connection: ConnectionSource, *,
                      starting: _StartingPreparer, health: HealthService | None,
                      gate: PublishGate) -> None:
    """Phase 2: devices, checkpoint, API client, publishing; the sockets answer meanwhile."""
    runtime.step = "loading the driver"
    # Imported off the loop, which meanwhile answers the kubelet's registration calls.
    await _in_daemon_thread(_import_client_modules)
    from gpudra.controller.publisher import SlicePublisher
    from gpudra.driver.checkpoint_codec import CheckpointError
    from gpudra.driver.checkpoint_store import current_boot_id
    from gpudra.driver.devices import NodeDevices
    from gpudra.driver.health import rfc3339
    from gpudra.driver.health_monitor import HealthMonitor
    from gpudra.driver.health_store import RECOVERY_FILE, RecoveryStore
    from gpudra.driver.held import HELD_TAINT, summary, with_held_taints
    from gpudra.driver.nvml import NvmlUnavailable
    from gpudra.driver.usage import IdleTracker
    from gpudra.driver.usage_sampler import ClaimPods, UsageSampler
    from gpudra.kube.raw_api import RawApi
    from gpudra.kubeletplugin.claims.claim_fetcher import ClaimFetcher
    from gpudra.kubeletplugin.claims.preparer import Preparer
    from gpudra.kubeletplugin.cluster.claim_status import (
        Observers,
        idle_listener,
        unhealthy_devices,
    )
    from gpudra.kubeletplugin.cluster.events import held_event, send_held_event
    from gpudra.kubeletplugin.cluster.recovery_events import RecoveryEvents
    from gpudra.kubeletplugin.node.node_state import build_device_state

    runtime.step = "opening NVML"
    try:
        runtime.nvml = nvml = await _in_daemon_thread(_open_nvml, config)
    except NvmlUnavailable as exc:
        raise DaemonError(str(exc)) from exc
    runtime.step = "discovering devices and reconciling the checkpoint"
    # Opened on its first request: only a checkpoint that cannot be read asks it anything
    # here (the claims allocated to this node, the slices it published).
    runtime.api = api = api_session(connection, config.resource_api)
    ask_api = _survivor_lists(config, api, asyncio.get_running_loop())
    pod_api = None
    if config.mps_daemons == "pod" and config.namespace:
        from gpudra.kubeletplugin.cluster.mps_pod_api import SessionPodApi

        pod_api = SessionPodApi(api, config.namespace, asyncio.get_running_loop())
    try:
        state = await _in_daemon_thread(build_device_state, config, nvml, ask_api, pod_api)
    except CheckpointError as exc:  # e.g. the previous pod still holds the lock
        raise DaemonError(f"checkpoint: {exc}") from exc
    runtime.step = "starting the API client"
    runtime.held = tuple(summary(state.held))
    if state.held:
        runtime.held_event = asyncio.create_task(send_held_event(RawApi(api), held_event(
            driver=config.driver_name, node=config.node_name, held=runtime.held,
            taint=HELD_TAINT, now=time.time())), name="held event")
    held_since = rfc3339(time.time())

    def published() -> NodeDevices:
        """The devices with held hardware tainted ``NoSchedule``."""
        return with_held_taints(state.index.devices, state.held, state.index.targets,
                                held_since)
    pods = ClaimPods()  # who each claim is reserved for, as prepare saw it: usage labels
    status, idle_events = _claim_observers(config, api, state)
    runtime.on_idle = idle_listener(asyncio.get_running_loop(), status.idle_changed,
                                    idle_events.idle_changed)
    runtime.state = state
    runtime.preparer = Preparer(driver=config.driver_name, fetcher=ClaimFetcher(api),
                                state=state, loop=asyncio.get_running_loop(),
                                observer=Observers(status, idle_events), at_once=pods)
    starting.ready(runtime.preparer)
    if config.usage_interval > 0:
        runtime.usage = UsageSampler(
            nvml=nvml, state=state, pods=pods, interval=config.usage_interval,
            tracker=IdleTracker(config.idle_threshold, config.idle_after,
                                listeners=[] if runtime.on_idle is None else [runtime.on_idle]))
        runtime.usage.start()
    publisher = SlicePublisher(api, driver=config.driver_name, node_name=config.node_name)
    recovery_events: RecoveryEvents | None = None
    if health is not None:
        loop = asyncio.get_running_loop()
        monitor: HealthMonitor | None = None
        recovery_events = RecoveryEvents(RawApi(api), driver=config.driver_name,
                                         node=config.node_name,
                                         effect=config.health.recovery_effect)

        def refresh() -> None:
            assert monitor is not None and health is not None
            devices = monitor.apply(published())
            publisher.update(devices)
            status.health_changed(unhealthy_devices(devices))
            assert recovery_events is not None
            recovery_events.update(monitor.state.recovering())  # an Event per change
            health.notify()

        def changed() -> None:  # called from the watcher thread
            state.refresh_gpus()  # NVML reads: here, off the loop
            loop.call_soon_threadsafe(refresh)

        state.gpus_returned = changed  # VFIO: GPUs back from a VM are published again
        runtime.monitor = monitor = HealthMonitor(
            nvml, state.watched_gpus(), config.health, on_change=changed,
            store=RecoveryStore(config.paths.data_dir / RECOVERY_FILE, current_boot_id()),
            away=state.passed_through)  # VFIO: a VM's GPU is not lost
        monitor.start()
        refresh()
        watching = monitor
        health.set_source(lambda: watching.device_health(state.index.devices))
    else:
        publisher.update(published())
    runtime.publisher = publisher
    runtime.gate = gate

    async def publish() -> None:
        await gate.wait()  # at once after the first time: a restart does not wait again
        await publisher.run()

    runtime.supervisor.start("publisher", publish)
    runtime.supervisor.start("claim status", status.run)
    runtime.supervisor.start("idle events", idle_events.run)
    if recovery_events is not None:
        runtime.supervisor.start("recovery events", recovery_events.run)
    runtime.step = None
    # Start-up's objects (modules, the device model, slices) live as long as the process:
    # frozen, later collections skip them, so a full collection is a fraction of its cost
    # and no longer lands in the middle of a kubelet call.
    gc.collect()
    gc.freeze()
    log.info("node daemon running", node=config.node_name, driver=config.driver_name,
             devices=len(state.index.devices.devices), simulate=config.simulate)


SURVIVOR_LIST_TIMEOUT = 30.0
"""Seconds a start-up whose checkpoint cannot be read waits for the API server's lists."""


def _survivor_lists(config: NodeConfig, api: ApiSession, loop: asyncio.AbstractEventLoop,
                    ) -> Callable[[], tuple[list[Any] | None, list[Any] | None]]:
    """For the start-up thread: the ResourceClaims of every namespace and this node's
    ResourceSlices, listed on the loop; ``None`` for a list that failed (recovery then
    works from the CDI specs and the hardware alone)."""
    from gpudra.kube.errors import ApiCallError
    from gpudra.kube.raw_api import RESOURCE_CLAIMS, RESOURCE_SLICES, RawApi

    raw = RawApi(api)

    async def items(what: str, answer: Awaitable[Any]) -> list[Any] | None:
        try:
            found = (await answer).get("items")
        except ApiCallError as exc:
            log.warning("cannot list for checkpoint recovery", resource=what, error=str(exc))
            return None
        return found if isinstance(found, list) else None

    async def both() -> tuple[list[Any] | None, list[Any] | None]:
        # Every namespace's claims: the API server has no selector for "allocated here".
        claims = await items("resourceclaims", raw.list(RESOURCE_CLAIMS))
        slices = await items("resourceslices", raw.list(
            RESOURCE_SLICES,
            field_selector=f"spec.driver={config.driver_name},spec.nodeName={config.node_name}"))
        return claims, slices

    def ask() -> tuple[list[Any] | None, list[Any] | None]:
        future = asyncio.run_coroutine_threadsafe(both(), loop)
        try:
            return future.result(SURVIVOR_LIST_TIMEOUT)
        except TimeoutError:
            future.cancel()
            log.warning("the API server did not answer in time for checkpoint recovery")
            return None, None

    return ask


def _open_nvml(config: NodeConfig) -> Nvml:
    """NVML, real or simulated; blocking (a simulated node writes its state)."""
    from gpudra.driver.files import DIR_MODE, make_dirs
    from gpudra.driver.nvml import open_nvml

    paths = config.paths
    make_dirs(paths.data_dir, DIR_MODE)  # modes of our own, not the umask's
    return open_nvml(simulate=config.simulate, sim_state=paths.sim_state,
                     driver_root=paths.driver_root)


def _start_failure(exc: BaseException) -> str:
    """What claim calls waiting for phase 2 are told when it does not finish."""
    if isinstance(exc, asyncio.CancelledError):
        return "the node daemon is shutting down before it finished starting"
    if isinstance(exc, DaemonError):
        return f"the node daemon failed to start: {exc}"
    return f"the node daemon failed to start: {type(exc).__name__}: {exc}"


def _claim_observers(config: NodeConfig, api: ApiSession, state: DeviceState,
                     ) -> tuple[ClaimStatusWriter, IdleEvents]:
    """Claim device status and idle Events: told by the preparer, written in the background."""
    from gpudra.driver.mps import status_source
    from gpudra.kube.raw_api import RawApi
    from gpudra.kubeletplugin.cluster.claim_status import ClaimStatusWriter
    from gpudra.kubeletplugin.cluster.events import IdleEvents

    def records() -> Mapping[str, ClaimRecord]:
        return state.records()  # the checkpoint as it is now

    raw = RawApi(api)
    status = ClaimStatusWriter(raw, driver=config.driver_name, records=records,
                               watch_health=config.gates.enabled("DeviceHealthCheck"),
                               mps_daemon=status_source(state.hardware.mps))
    return status, IdleEvents(raw, driver=config.driver_name, node=config.node_name)


def _import_client_modules() -> None:
    """Phase 2's modules: the driver (NVML, checkpoint, device state, health, usage), the
    API client and what uses it; none is needed to serve the kubelet sockets."""
    import gpudra.controller.publisher
    import gpudra.driver.checkpoint_codec
    import gpudra.driver.health_monitor
    import gpudra.driver.nvml
    import gpudra.driver.usage
    import gpudra.driver.usage_sampler
    import gpudra.kubeletplugin.claims.claim_fetcher
    import gpudra.kubeletplugin.claims.preparer
    import gpudra.kubeletplugin.cluster.claim_status
    import gpudra.kubeletplugin.node.node_state  # noqa: F401


def _probes(address: tuple[str, int], runtime: _Runtime) -> ProbeServer:
    """The HTTP probe server, listening; a port in use is a one-line :class:`DaemonError`."""
    from gpudra.kubeletplugin.node.http_probes import ProbeServer  # not loaded when disabled

    try:
        return ProbeServer(address, live=runtime.not_live, ready=runtime.not_ready,
                           notes=runtime.held_notes)
    except OSError as exc:
        host, port = address
        raise DaemonError(f"--http-address {host}:{port}: {exc.strerror or exc}") from exc


class _StartingPreparer:
    """Claim calls that arrive while phase 2 runs (devices, checkpoint, API client) wait
    here, in their call threads: well under a second on a simulated node, far inside the
    kubelet's 45 s call deadline. If phase 2 fails (or the daemon stops first), every
    waiting and later call gets the reason as each claim's error, which the kubelet reports
    and retries. :meth:`ready` and :meth:`fail` may be called from any thread.
    """

    def __init__(self) -> None:
        self._settled = threading.Event()
        self._inner: ClaimPreparer | None = None
        self._failure: str | None = None
        self._lock = threading.Lock()

    def ready(self, inner: ClaimPreparer) -> None:
        with self._lock:
            if not self._settled.is_set():
                self._inner = inner
                self._settled.set()

    def fail(self, reason: str) -> None:
        """Phase 2 did not finish: answer with ``reason`` (no-op once ready)."""
        with self._lock:
            if not self._settled.is_set():
                self._failure = reason
                self._settled.set()

    def _target(self, wanted: Callable[[], bool]) -> ClaimPreparer | str:
        """The preparer once start-up is done, or why the call gets none: start-up failed,
        or the kubelet stopped waiting first (its retry comes in a new call; this one must
        not act late, after an unprepare the kubelet sent meanwhile)."""
        while True:
            settled = self._settled.wait(STARTING_POLL)
            if not wanted():  # also once settled: a late start must not act for it either
                return ("the kubelet stopped waiting before the node daemon finished "
                        "starting; nothing was done")
            if settled:
                break
        if self._inner is not None:
            return self._inner
        return self._failure or "the node daemon failed to start"

    def prepare(self, claims: Sequence[ClaimRef], *,
                wanted: Callable[[], bool] = always) -> Mapping[str, PrepareOutcome]:
        inner = self._target(wanted)
        if isinstance(inner, str):
            return {ref.uid: PrepareOutcome(error=f"claim {ref}: {inner}") for ref in claims}
        return inner.prepare(claims, wanted=wanted)

    def unprepare(self, claims: Sequence[ClaimRef], *,
                  wanted: Callable[[], bool] = always) -> Mapping[str, str | None]:
        inner = self._target(wanted)
        if isinstance(inner, str):
            return {ref.uid: f"claim {ref}: {inner}" for ref in claims}
        return inner.unprepare(claims, wanted=wanted)


T = TypeVar("T")


async def _in_daemon_thread_within(seconds: float, fn: Callable[..., T],
                                   *args: Any) -> asyncio.Future[T] | None:
    """:func:`_in_daemon_thread`, waited for at most ``seconds``: the finished future (its
    result or exception), or ``None`` while ``fn`` still runs (the process may exit under it)."""
    work = asyncio.ensure_future(_in_daemon_thread(fn, *args))
    done, _ = await asyncio.wait({work}, timeout=seconds)
    return work if done else None


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
