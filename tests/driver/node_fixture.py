"""A simulated node with a real DeviceState: sim NVML, checkpoint, CDI root, driver root."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpudra.driver import sim
from gpudra.driver.claims import AllocatedDevice, ClaimToPrepare, OpaqueConfig
from gpudra.driver.commands import CommandRunner
from gpudra.driver.device_model import ModelOptions
from gpudra.driver.device_state import DeviceState
from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.featuregates import FeatureGates
from gpudra.driver.inventory import read_inventory, simulated_pcie_root
from gpudra.driver.node_factory import NodeSetup, build_device_state
from gpudra.driver.nvml import Nvml, open_nvml
from gpudra.driver.sim.driver_root import populate_driver_root

DRIVER = "gpu.nvidia.com"
POOL = "node-a"


@dataclass
class SimNode:
    root: Path
    profile: str
    nvml: Nvml
    state: DeviceState

    @property
    def control(self) -> sim.SimControl:
        return sim.SimControl(self.root / "sim")

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    def close(self) -> None:
        self.nvml.shutdown()


def start_node(
    root: Path, profile: str = "dgx-h100", *, boot_id: str = "boot-1",
    commands: CommandRunner | None = None, time_slicing: bool = True, mps: bool = True,
    compute_modes: bool = True, options: ModelOptions | None = None,
) -> SimNode:
    """Open (or re-open, after a 'crash') the simulated node under ``root``.

    ``time_slicing``, ``mps`` and ``compute_modes`` are the feature gates
    ``TimeSlicingSettings``, ``MPSSupport`` and ``ComputeModeSettings``; ``commands``
    replaces the simulated host commands; ``options`` the device model's (shareable GPUs).
    """
    options = options or ModelOptions()
    nvml = open_nvml(simulate=profile, sim_state=root / "sim")
    inventory = read_inventory(nvml, pcie_root=simulated_pcie_root)
    driver_root = root / "driver-root"
    populate_driver_root(driver_root, [g.probe.minor for g in inventory.gpus])
    gates = FeatureGates({"DynamicMIG": options.dynamic_mig, "TimeSlicingSettings": time_slicing,
                          "MPSSupport": mps, "ComputeModeSettings": compute_modes,
                          "ConsumableCapacity": True})
    state = build_device_state(NodeSetup(
        driver=DRIVER, pool=POOL, data_dir=root / "plugin", cdi_root=root / "cdi",
        driver_root=DriverRoot(driver_root), commands_root=driver_root, gates=gates,
        shareable=options.shareable, mig=options.mig, simulate=True, sim_state=root / "sim",
        commands=commands, boot_id=boot_id), nvml)
    return SimNode(root, profile, nvml, state)


def claim(uid: str, *devices: str, configs: tuple[OpaqueConfig, ...] = (),
          request: str = "gpu") -> ClaimToPrepare:
    return ClaimToPrepare(
        uid=uid, namespace="default", name=f"claim-{uid[:8]}",
        devices=tuple(AllocatedDevice(request=request, pool=POOL, device=d) for d in devices),
        configs=configs,
    )
