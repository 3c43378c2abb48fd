"""What the node daemon is told: one frozen value, built and checked by the CLI from the
flags and their environment fallbacks before anything starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpudra.driver.featuregates import FeatureGates
from gpudra.driver.gpu_shares import NONE, ShareableGpus
from gpudra.driver.health import HealthPolicy
from gpudra.driver.mig_offer import NOTHING, MigOffer
from gpudra.kubeletplugin.node.supervisor import RestartPolicy
from gpudra.kubeletplugin.serving.sockets import plugin_data_dir

DEFAULT_DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class NodePaths:
    """Where the daemon keeps and finds things, defaults filled in."""

    data_dir: Path
    """``<plugins-dir>/<driver>``: checkpoint, MPS and (simulated) node state."""
    sim_state: Path | None
    """The simulated node's state; None on real hardware."""
    driver_root: Path
    """The NVIDIA driver root as this process sees it."""
    host_driver_root: Path
    """The same root as the host (and so the CDI spec) sees it."""
    dev_root: Path = Path("/")
    """Where ``dev/`` and ``proc/`` of the NVIDIA kernel module are, as this process sees it."""
    host_dev_root: Path = Path("/")
    """The same root as the host sees it."""


@dataclass(frozen=True)
class NodeConfig:
    """The daemon's settings; each field is one flag (``--node-name`` → ``node_name``)."""

    node_name: str
    driver_name: str = DEFAULT_DRIVER
    gates: FeatureGates = field(default_factory=lambda: FeatureGates({}))
    shareable: ShareableGpus = NONE
    """``--shareable-gpus``: GPUs that also publish a shared device (gate ConsumableCapacity)."""
    mig: MigOffer = NOTHING
    """``--dynamic-mig-*``: which GPUs offer MIG devices made on demand (gate DynamicMIG)."""
    health: HealthPolicy = field(default_factory=HealthPolicy)
    """From ``--additional-xids-to-ignore`` and ``--xid-quiet-period``."""
    kubeconfig: str | None = None
    """None: the in-cluster configuration."""
    resource_api: str = "auto"
    """``--resource-api-version``: the resource.k8s.io version to speak; ``auto`` asks the
    server (v1, else v1beta2, else v1beta1)."""
    registrar_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_root: Path = Path("/var/run/cdi")
    driver_root: Path | None = None
    """None: ``/``, or a generated root when simulating."""
    host_driver_root: Path | None = None
    """None: ``driver_root``."""
    dev_root: Path | None = None
    """None: ``/``, or a generated root when simulating."""
    host_dev_root: Path | None = None
    """None: ``dev_root``."""
    cdi_hook_path: str | None = None
    """Host path of ``nvidia-cdi-hook``; None: searched under the driver root."""
    simulate: str | None = None
    """A simulated node profile instead of real NVML."""
    sim_state: Path | None = None
    """None: ``<data_dir>/sim`` when simulating."""
    pod_uid: str | None = None
    http_address: tuple[str, int] | None = ("127.0.0.1", 8080)
    """Host and port of ``/metrics``, ``/healthz``, ``/readyz``; None: not served."""
    registration_timeout: float = 30.0
    """Seconds to wait for the kubelet's registration before saying (log, ``/readyz``) that
    it has not come; slices are published only after it, however long that takes."""
    shutdown_grace: float = 10.0
    usage_interval: float = 10.0
    """Seconds between usage sampling passes (per-claim metrics, idle detection); 0: off."""
    idle_threshold: float = 5.0
    """SM % under which a device counts as idle."""
    idle_after: float = 30 * 60.0
    """Seconds all of a claim's devices must stay under ``idle_threshold`` to make it idle."""
    mps_daemons: str = "container"
    """``pod``: each MPS control daemon in a Pod of its own (outlives this daemon's pod);
    ``container``: in this container, detached."""
    mps_image: str | None = None
    """The MPS control daemon pods' image (``pod`` mode)."""
    namespace: str | None = None
    """The driver's namespace, where MPS control daemon pods live (``pod`` mode)."""
    restarts: RestartPolicy = field(default_factory=RestartPolicy)
    """How dead root tasks (the slice publisher) are restarted; not a flag."""

    @property
    def paths(self) -> NodePaths:
        data_dir = plugin_data_dir(self.plugins_dir, self.driver_name)
        sim_state = (self.sim_state or data_dir / "sim") if self.simulate else None
        driver_root = self.driver_root or (
            data_dir / "sim-driver-root" if self.simulate else Path("/"))
        dev_root = self.dev_root or (data_dir / "sim-dev-root" if self.simulate else Path("/"))
        return NodePaths(data_dir, sim_state, driver_root,
                         self.host_driver_root or driver_root,
                         dev_root, self.host_dev_root or dev_root)
