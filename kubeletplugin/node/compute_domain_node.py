"""``gpudra compute-domain-node``: the node side of ComputeDomains, a daemon of its own.

It serves the ``compute-domain.nvidia.com`` kubelet plugin (registration and DRA sockets of
its own) and publishes that driver's pool (IMEX channels and daemon slots, placed in the
node's NVLink clique: :mod:`gpudra.driver.compute_domain_devices`) through the same
:class:`~gpudra.controller.publisher.SlicePublisher` and
:class:`~gpudra.kubeletplugin.serving.server.PluginServer` the GPU daemon uses.

Why a second daemon and not a second plugin inside ``gpudra node``:

- **Failure isolation.** The GPU daemon prepares every GPU claim of the node; a channel
  prepare waits on the API server (the domain's status) and on peers in other nodes. A
  second process keeps a stuck API read, a crash or an upgrade of the ComputeDomain side
  from touching GPU claims, and the other way round (NVIDIA runs the two plugins as two
  containers for the same reason).
- **Least privilege.** Only this daemon reads ComputeDomains; the GPU daemon's RBAC and
  its start-up path stay as they were, and a cluster without ComputeDomains does not run
  this one at all (the chart's ``computeDomains.enabled``).
- **State of its own.** Its checkpoint, CDI specs and IMEX config directories are few and
  independent of the GPU checkpoint; sharing the GPU daemon's checkpoint lock would make
  channel prepares wait behind MIG creation for no reason.
- **Little duplication.** The sockets, the DRA service, registration, the publish gate and
  the slice publisher are the shared modules; what is new here is wiring.

The cost is a second process (tens of MiB) and a second NVML session per node; NVML allows
many.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from gpudra.api.compute_domain import DRIVER_NAME
from gpudra.kubeletplugin.node.api_access import ApiAccessError, api_session, check_api_access
from gpudra.kubeletplugin.node.supervisor import RestartPolicy, RootTaskFailed, Supervisor
from gpudra.kubeletplugin.serving.publish_gate import PublishGate
from gpudra.kubeletplugin.serving.server import PluginServer

if TYPE_CHECKING:
    from gpudra.driver.nvml import FabricInfo, Nvml

log = structlog.get_logger("gpudra.compute_domain_node")

DEFAULT_REGISTRATION_TIMEOUT = 60.0


class NodeDaemonError(Exception):
    """The daemon cannot start; one line for the operator."""


@dataclass(frozen=True)
class ComputeDomainNodeConfig:
    node_name: str
    kubeconfig: str | None
    registrar_dir: Path
    plugins_dir: Path
    pod_uid: str | None
    data_dir: Path
    cdi_root: Path
    imex_root: Path
    host_imex_root: Path
    dev_root: Path
    host_dev_root: Path
    simulate: str | None = None
    sim_state: Path | None = None
    driver_root: Path | None = None
    """Where the NVML library is looked for first on a real node (the chart's mount)."""
    channels: int = 8
    daemons: int = 8
    registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT
    shutdown_grace: float = 5.0
    restarts: RestartPolicy = field(default_factory=RestartPolicy)
    fabric_poll: float = 10.0
    """Seconds between looks at the NVLink fabric (0: only at start)."""


async def serve(config: ComputeDomainNodeConfig, stop: asyncio.Event) -> None:
    """Run until ``stop`` is set; :class:`NodeDaemonError` when start-up fails."""
    from gpudra.controller.publisher import SlicePublisher
    from gpudra.driver.compute_domain_checkpoint import (
        Checkpoint,
        CheckpointError,
        recovered_from_specs,
    )
    from gpudra.driver.compute_domain_devices import FabricProblem, build_devices
    from gpudra.driver.nvml import NvmlUnavailable
    from gpudra.kube.raw_api import RawApi
    from gpudra.kubeletplugin.claims.compute_domain_preparer import (
        ComputeDomainPreparer,
        NodePaths,
    )

    try:
        connection = check_api_access(config.kubeconfig)
    except ApiAccessError as exc:
        raise NodeDaemonError(str(exc)) from exc
    try:
        nvml = await asyncio.to_thread(_open_nvml, config)
    except NvmlUnavailable as exc:
        raise NodeDaemonError(str(exc)) from exc
    try:
        fabric = await asyncio.to_thread(_fabric, nvml)
    except FabricProblem as exc:
        log.warning("no ComputeDomain devices: the fabric is not usable", reason=str(exc))
        fabric = None
    try:
        checkpoint = Checkpoint(config.data_dir, recover=lambda: recovered_from_specs(
            config.cdi_root, DRIVER_NAME))
    except (CheckpointError, OSError) as exc:
        raise NodeDaemonError(f"checkpoint: {exc}") from exc
    devices = build_devices(fabric, channels=config.channels, daemons=config.daemons)
    api = api_session(connection)
    preparer = ComputeDomainPreparer(
        driver=DRIVER_NAME, node=config.node_name, api=RawApi(api),
        paths=NodePaths(cdi_root=config.cdi_root, imex_root=config.imex_root,
                        host_imex_root=config.host_imex_root, dev_root=config.dev_root,
                        host_dev_root=config.host_dev_root),
        checkpoint=checkpoint, loop=asyncio.get_running_loop())
    server = PluginServer(DRIVER_NAME, config.registrar_dir, config.plugins_dir,
                          config.pod_uid, preparer)
    publisher = SlicePublisher(api, driver=DRIVER_NAME, node_name=config.node_name)
    publisher.update(devices)
    # The publisher is a supervised root task, as in the GPU daemon: restarted with back-off
    # when it dies (an API server slow to answer at start-up), fatal when it keeps dying.
    supervisor = Supervisor(config.restarts)
    try:
        await server.start()
        gate = PublishGate(server.registration, config.registration_timeout,
                           server.registration_socket_path)

        async def publish() -> None:
            await gate.wait()
            await publisher.run()

        supervisor.start("publisher", publish)

        async def watch_fabric() -> None:
            """The fabric manager may register the GPUs after we start (or a tray may move
            to another partition): publish what the fabric says now, within one poll."""
            seen = fabric
            while True:
                await asyncio.sleep(config.fabric_poll)
                try:
                    now = await asyncio.to_thread(_fabric, nvml)
                except FabricProblem as exc:
                    now, why = None, str(exc)
                else:
                    why = "no multi-node NVLink" if now is None else "ready"
                if now != seen:
                    log.info("NVLink fabric changed; publishing again", fabric=why,
                             clique=None if now is None else f"{now.cluster_uuid}.{now.clique_id}")
                    publisher.update(build_devices(now, channels=config.channels,
                                                   daemons=config.daemons))
                    seen = now

        if config.fabric_poll > 0:
            supervisor.start("fabric", watch_fabric)
        log.info("compute-domain node daemon running", node=config.node_name,
                 devices=len(devices.devices),
                 clique=None if fabric is None else f"{fabric.cluster_uuid}.{fabric.clique_id}")
        stopping = asyncio.create_task(stop.wait())
        failed = asyncio.create_task(supervisor.failed())
        done, _ = await asyncio.wait({failed, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stopping, failed):
            task.cancel()
        if failed in done and not failed.cancelled():
            try:
                failed.result()
            except RootTaskFailed as exc:
                raise NodeDaemonError(str(exc)) from exc
    finally:
        await server.stop(config.shutdown_grace)
        await supervisor.stop()
        await api.close()
        await asyncio.to_thread(nvml.shutdown)
        checkpoint.close()


def _open_nvml(config: ComputeDomainNodeConfig) -> Nvml:
    """NVML, real or simulated; blocking."""
    from gpudra.driver.files import DIR_MODE, make_dirs
    from gpudra.driver.nvml import open_nvml

    make_dirs(config.data_dir, DIR_MODE)
    return open_nvml(simulate=config.simulate, sim_state=config.sim_state,
                     driver_root=config.driver_root)


def _fabric(nvml: Nvml) -> FabricInfo | None:
    """The node's clique (:func:`~gpudra.driver.compute_domain_devices.node_clique`);
    blocking."""
    from gpudra.driver.compute_domain_devices import node_clique
    from gpudra.driver.nvml import GpuProbe

    probes = [p for p in nvml.probe_all() if isinstance(p, GpuProbe)]
    return node_clique([nvml.fabric_info(p.uuid) for p in probes])
