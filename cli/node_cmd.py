"""``gpudra node``: the node daemon (kubelet plugin + ResourceSlice publisher + metrics).

Start order: NVML → checkpoint and start-up reconciliation → inventory → gRPC sockets →
publishing → HTTP probes. Stop (SIGTERM/SIGINT): stop accepting calls, let in-flight ones
finish, remove our sockets, stop publishing, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog

from gpudra.api.claims import ClaimRef
from gpudra.cli.grpc_probe import answers_get_info
from gpudra.cli.http_probes import ProbeServer
from gpudra.cli.logs import configure_logging
from gpudra.cli.options import (
    CliError,
    add_driver_flags,
    add_simulation_flags,
    check_simulate_profile,
    feature_gates,
    node_name,
)
from gpudra.driver import cdi
from gpudra.driver.checkpoint import CheckpointCorrupt, CheckpointError, CheckpointStore
from gpudra.driver.commands import CommandRunner, HostCommandRunner
from gpudra.driver.device_model import ModelOptions
from gpudra.driver.device_state import DeviceState
from gpudra.driver.faults import delay_point
from gpudra.driver.health import HealthPolicy, parse_xids
from gpudra.driver.health_monitor import HealthMonitor
from gpudra.driver.inventory import read_inventory, simulated_pcie_root, sysfs_pcie_root
from gpudra.driver.mps import MpsManager
from gpudra.driver.nvml import Nvml, NvmlUnavailable, open_nvml
from gpudra.driver.prepare_plan import NodeIndex
from gpudra.driver.sim.commands import SimulatedCommandRunner
from gpudra.kubeletplugin.health_service import HealthService
from gpudra.kubeletplugin.interfaces import ClaimPreparer, PrepareOutcome
from gpudra.kubeletplugin.preparer import Preparer
from gpudra.kubeletplugin.server import PluginServer
from gpudra.kubeletplugin.sockets import plugin_data_dir

log = structlog.get_logger("gpudra.node")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "node", help="run the node daemon (kubelet plugin and ResourceSlice publisher)",
        description="Serve the kubelet's DRA calls for this node's NVIDIA GPUs and publish "
                    "them as ResourceSlices. Every flag has an environment fallback.")
    add_driver_flags(parser)
    add_simulation_flags(parser)
    parser.add_argument("--kubeconfig", default=_env("KUBECONFIG"),
                        help="kubeconfig file (env KUBECONFIG; default in-cluster config)")
    parser.add_argument("--registrar-dir", type=Path,
                        default=_env("KUBELET_REGISTRAR_DIRECTORY_PATH",
                                     "/var/lib/kubelet/plugins_registry"),
                        help="kubelet plugin registration dir "
                             "(env KUBELET_REGISTRAR_DIRECTORY_PATH)")
    parser.add_argument("--plugins-dir", type=Path,
                        default=_env("KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins"),
                        help="kubelet plugins dir (env KUBELET_PLUGINS_DIRECTORY_PATH)")
    parser.add_argument("--cdi-root", type=Path, default=_env("CDI_ROOT", "/var/run/cdi"),
                        help="where per-claim CDI specs are written (env CDI_ROOT)")
    parser.add_argument("--driver-root", type=Path, default=_env("DRIVER_ROOT"),
                        help="NVIDIA driver root as this process sees it (env DRIVER_ROOT; "
                             "default /, or a generated root when simulating)")
    parser.add_argument("--host-driver-root", type=Path, default=_env("HOST_DRIVER_ROOT"),
                        help="the same root as the host sees it, for CDI paths "
                             "(env HOST_DRIVER_ROOT; default --driver-root)")
    parser.add_argument("--pod-uid", default=_env("POD_UID"),
                        help="this pod's UID: per-pod socket names for rolling updates "
                             "(env POD_UID)")
    parser.add_argument("--http-address", default=_env("HTTP_ADDRESS", "127.0.0.1:8080"),
                        help="host:port for /metrics, /healthz, /readyz (env HTTP_ADDRESS; "
                             "empty disables)")
    parser.add_argument("--log-format", choices=("json", "console", "auto"),
                        default=_env("LOG_FORMAT", "json"), help="env LOG_FORMAT")
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "info"), help="env LOG_LEVEL")
    parser.add_argument("--additional-xids-to-ignore",
                        default=_env("ADDITIONAL_XIDS_TO_IGNORE", ""),
                        help="comma-separated XIDs treated as application faults (taint effect "
                             "None) on top of 13,31,43,45,68,109 (env ADDITIONAL_XIDS_TO_IGNORE)")
    parser.add_argument("--xid-quiet-period", type=float,
                        default=float(_env("XID_QUIET_PERIOD", "300") or 300),
                        help="seconds without a new critical XID after which a GPU's XID taint "
                             "clears; 0 keeps taints until restart (env XID_QUIET_PERIOD)")
    parser.add_argument("--shutdown-grace", type=float, default=10.0,
                        help="seconds in-flight calls may take to finish at shutdown")
    parser.set_defaults(run=run)


@dataclass
class NodePaths:
    data_dir: Path
    sim_state: Path | None
    driver_root: Path
    host_driver_root: Path


def resolve_paths(args: argparse.Namespace) -> NodePaths:
    data_dir = plugin_data_dir(args.plugins_dir, args.driver_name)
    sim_state = None
    if args.simulate:
        sim_state = args.sim_state or data_dir / "sim"
    driver_root = args.driver_root or (data_dir / "sim-driver-root" if args.simulate else Path("/"))
    return NodePaths(data_dir, sim_state, driver_root, args.host_driver_root or driver_root)


def _open_checkpoint(data_dir: Path) -> CheckpointStore:
    store = CheckpointStore(data_dir)
    try:
        store.load()
    except CheckpointCorrupt as exc:
        # Refusing to start would leave every GPU on the node unusable; an empty checkpoint
        # plus start-up reconciliation is the safe recovery. Loud, and the file is kept.
        moved = store.quarantine()
        log.error("checkpoint is corrupt; moved aside and starting empty", error=str(exc),
                  moved_to=str(moved))
    return store


def build_device_state(args: argparse.Namespace, paths: NodePaths, nvml: Nvml) -> DeviceState:
    log.info("discovering devices", simulate=args.simulate)
    delay_point("start:discovery")
    gates = feature_gates(args)
    resolver = simulated_pcie_root if args.simulate else sysfs_pcie_root
    inventory = read_inventory(nvml, pcie_root=resolver)
    if args.simulate:
        from gpudra.driver.sim.driver_root import populate_driver_root

        populate_driver_root(paths.driver_root, [g.probe.minor for g in inventory.gpus])
    store = _open_checkpoint(paths.data_dir)
    options = ModelOptions(dynamic_mig=gates.enabled("DynamicMIG"))
    commands: CommandRunner
    if args.simulate:
        assert paths.sim_state is not None
        commands = SimulatedCommandRunner(paths.sim_state)
    else:
        commands = HostCommandRunner(paths.driver_root)
    mps = MpsManager(commands, paths.data_dir / "mps") if gates.enabled("MPSSupport") else None
    state = DeviceState(
        driver=args.driver_name, nvml=nvml,
        commands=commands if gates.enabled("TimeSlicingSettings") else None, mps=mps,
        index=NodeIndex.build(node_name(args), inventory, options),
        store=store, cdi_root=args.cdi_root,
        driver_root=cdi.DriverRoot(paths.host_driver_root, container_root=paths.driver_root),
    )
    report = state.reconcile()
    log.info("reconciled node state", rolled_back=report.rolled_back_claims,
             destroyed_mig_devices=report.destroyed_mig_devices,
             removed_cdi_specs=report.removed_cdi_specs, reset=report.checkpoint_reset)
    # Re-read: reconciliation may have destroyed leaked MIG devices; our own stay dynamic.
    inventory = read_inventory(nvml, pcie_root=resolver)
    state.index = NodeIndex.build(node_name(args), inventory, ModelOptions(
        dynamic_mig=options.dynamic_mig, owned_mig_uuids=state.owned_mig_uuids()))
    return state


async def _api_client(kubeconfig: str | None) -> Any:
    from kubernetes.aio import client as aio_client
    from kubernetes.aio import config as aio_config

    configuration = aio_client.Configuration()
    if kubeconfig:
        if not Path(kubeconfig).is_file():  # noqa: ASYNC240 - one stat at start-up
            raise CliError(f"--kubeconfig {kubeconfig}: no such file")
        try:
            await aio_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration)
        except Exception as exc:  # ConfigException, YAML errors, bad certificates …
            raise CliError(f"--kubeconfig {kubeconfig}: {exc}") from exc
    else:
        try:
            aio_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
        except aio_config.ConfigException as exc:
            raise CliError("no --kubeconfig given and not running in a cluster "
                           f"({exc})") from exc
    return aio_client.ApiClient(configuration)


class _StartingPreparer:
    """Calls that arrive between registration and the API client being ready wait here.

    The sockets come up as soon as the node's devices are known; importing and configuring
    the Kubernetes client (the heaviest import, not needed to register) happens after, and
    takes well under a second, far inside the kubelet's 45 s call deadline.
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


@dataclass
class _Runtime:
    """What the daemon has started so far; closed in reverse order, whatever happened."""

    server: PluginServer | None = None
    nvml: Nvml | None = None
    api: Any = None
    monitor: HealthMonitor | None = None
    probes: ProbeServer | None = None
    publish_task: asyncio.Task[None] | None = None

    async def close(self, grace: float) -> None:
        if self.server is not None:
            await self.server.stop(grace)  # sockets go first: the kubelet sees us leave
        if self.publish_task is not None:
            self.publish_task.cancel()
            await asyncio.gather(self.publish_task, return_exceptions=True)
        if self.probes is not None:
            self.probes.stop()
        if self.monitor is not None:
            await asyncio.to_thread(self.monitor.stop)
        if self.api is not None:
            await self.api.close()
        if self.nvml is not None:
            self.nvml.shutdown()


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    """Run the daemon until ``stop`` is set (also during start-up: SIGTERM is honoured
    while devices are still being discovered, and nothing is left behind)."""
    runtime = _Runtime()
    startup = asyncio.create_task(_start(args, runtime), name="startup")
    stopping = asyncio.create_task(stop.wait(), name="stop")
    try:
        done, _ = await asyncio.wait({startup, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if startup in done:
            startup.result()  # start-up errors surface here
            await stopping
        else:
            startup.cancel()
            await asyncio.gather(startup, return_exceptions=True)
        log.info("shutting down")
    finally:
        stopping.cancel()
        await runtime.close(args.shutdown_grace)


async def _start(args: argparse.Namespace, runtime: _Runtime) -> None:
    paths = resolve_paths(args)
    paths.data_dir.mkdir(parents=True, exist_ok=True)
    policy = _health_policy(args)
    gates = feature_gates(args)
    check_simulate_profile(args)
    try:
        runtime.nvml = nvml = open_nvml(simulate=args.simulate, sim_state=paths.sim_state,
                                        driver_root=paths.driver_root)
    except NvmlUnavailable as exc:
        raise CliError(str(exc)) from exc
    try:
        state = await _in_daemon_thread(build_device_state, args, paths, nvml)
    except CheckpointError as exc:  # e.g. the previous pod still holds the lock
        raise CliError(f"checkpoint: {exc}") from exc
    monitor: HealthMonitor | None = None
    health: HealthService | None = None
    if gates.enabled("DeviceHealthCheck"):
        health = HealthService(node_name(args), lambda: (
            monitor.device_health(state.index.devices) if monitor is not None else ()))
    # Register once the node state is ready; calls that arrive while the Kubernetes client
    # (the heaviest import, not needed to register) loads wait for it in _StartingPreparer.
    starting = _StartingPreparer()
    runtime.server = server = PluginServer(args.driver_name, args.registrar_dir,
                                           args.plugins_dir, args.pod_uid, starting,
                                           health_servicer=health)
    await server.start()
    from gpudra.controller.publisher import SlicePublisher
    from gpudra.kubeletplugin.claim_fetcher import ClaimFetcher

    runtime.api = api = await _api_client(args.kubeconfig)
    starting.ready(Preparer(driver=args.driver_name, fetcher=ClaimFetcher(api), state=state))
    publisher = SlicePublisher(api, driver=args.driver_name, node_name=node_name(args))
    if health is not None:
        loop = asyncio.get_running_loop()

        def refresh() -> None:
            assert monitor is not None and health is not None
            publisher.update(monitor.apply(state.index.devices))
            health.notify()

        def changed() -> None:  # called from the watcher thread
            loop.call_soon_threadsafe(refresh)

        runtime.monitor = monitor = HealthMonitor(nvml, _watched_gpus(state), policy,
                                                  on_change=changed)
        monitor.start()
        publisher.update(monitor.apply(state.index.devices))
        health.notify()
    else:
        publisher.update(state.index.devices)
    runtime.publish_task = asyncio.create_task(publisher.run(), name="publisher")
    if args.http_address:
        runtime.probes = ProbeServer(
            args.http_address,
            live=lambda: answers_get_info(server.registration_socket_path),
            ready=lambda: server.registration.registered.is_set() and publisher.synced.is_set())
        runtime.probes.start()
    log.info("node daemon running", node=node_name(args), driver=args.driver_name,
             devices=len(state.index.devices.devices), simulate=args.simulate)


def _health_policy(args: argparse.Namespace) -> HealthPolicy:
    try:
        extra = parse_xids(args.additional_xids_to_ignore,
                           field_name="--additional-xids-to-ignore")
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    quiet = args.xid_quiet_period if args.xid_quiet_period > 0 else None
    return HealthPolicy.with_additional(extra, quiet_period=quiet)


def _watched_gpus(state: DeviceState) -> list[str]:
    """Every physical GPU, including those that publish only (static) MIG devices."""
    uuids = set()
    for device in state.index.devices.devices:
        key = "uuid" if device.type == "gpu" else "parentUUID"
        uuids.add(str(device.attributes[key]))
    return sorted(uuids)


def run(args: argparse.Namespace) -> int:
    configure_logging(fmt=args.log_format, level=args.log_level)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(args, stop)

    asyncio.run(main())
    return 0
