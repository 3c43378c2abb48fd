"""Wiring VFIO passthrough into a node at start-up: which sysfs, and what to publish."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Final

import structlog

from gpudra.driver.checkpoint_model import Checkpoint
from gpudra.driver.inventory import NodeInventory
from gpudra.driver.nvml import Nvml, UnreadableGpu
from gpudra.driver.vfio import GATE, VfioPassthrough
from gpudra.driver.vfio_model import VfioOffer, device_minor
from gpudra.driver.vfio_sysfs import VFIO_DRIVER, PciSysfs, sysfs_bus_id

if TYPE_CHECKING:
    from gpudra.driver.node_factory import NodeSetup

log = structlog.get_logger("gpudra.node")

HOST_SYSFS: Final = Path("/sys")
NVIDIA_VENDOR: Final = "0x10de"


def passthrough(setup: NodeSetup, nvml: Nvml,
                bus_ids: Callable[[], Mapping[str, str]]) -> VfioPassthrough | None:
    """The node's passthrough, or ``None`` on a simulated node that never enabled it (its
    sysfs is laid out only once the gate is on, then kept: records made then must still be
    released with the gate off)."""
    enabled = setup.gates.enabled(GATE)
    sysfs: PciSysfs
    if setup.sim_state is not None:
        from gpudra.driver.sim.pci import SimPciSysfs, sysfs_root  # simulator only

        if not enabled and not sysfs_root(setup.sim_state).exists():
            return None
        dev_root = setup.driver_root.dev.local_path("/")
        sysfs = SimPciSysfs(setup.sim_state, dev_root, iommufd=(dev_root / "dev/iommu").exists())
    else:
        sysfs = PciSysfs(HOST_SYSFS)
    return VfioPassthrough(sysfs, nvml, enabled=enabled, gpu_bus_ids=bus_ids)


def offer(setup: NodeSetup, vfio: VfioPassthrough | None,
          inventory: NodeInventory) -> VfioOffer | None:
    """What to publish as vfio devices; ``None`` (none) with the gate off or no IOMMU."""
    if vfio is None or not vfio.enabled:
        return None
    if not vfio.sysfs.available():
        log.warning("feature gate PassthroughSupport is on but the kernel has no IOMMU groups "
                    "(boot with intel_iommu=on or amd_iommu=on): no vfio devices published",
                    sysfs=str(vfio.sysfs.root))
        return None
    iommufd = setup.driver_root.device_node("/dev/iommu") is not None
    # Every NVIDIA function, not only the GPUs NVML lists now: one a VM holds comes back.
    functions = sorted(set(vfio.sysfs.functions(NVIDIA_VENDOR)) | set(bus_ids(inventory).values()))
    return VfioOffer.read(vfio.sysfs, functions, iommufd=iommufd)


def with_passed_through(inventory: NodeInventory, cp: Checkpoint) -> NodeInventory:
    """``inventory`` with the GPUs prepared claims hold on ``vfio-pci`` as unavailable: NVML
    does not list them, and they are published again once they answer (after unprepare)."""
    known = {g.probe.uuid for g in inventory.gpus} | {g.uuid for g in inventory.unavailable}
    held: list[UnreadableGpu] = []
    for record in cp.claims.values():
        for device in record.devices:
            if device.vfio is None:
                continue
            for function in device.vfio.functions:
                uuid = function.gpu_uuid
                if uuid is None or uuid in known:
                    continue
                known.add(uuid)
                minor = _minor(device.device) if function is device.vfio.functions[0] else None
                held.append(UnreadableGpu(minor if minor is not None else -1, uuid, minor,
                                          function.bus_id, False,
                                          f"passed through to a VM (vfio-pci) for claim "
                                          f"{record.ref}"))
    if not held:
        return inventory
    return replace(inventory, unavailable=inventory.unavailable + tuple(held))


def warn_unowned(vfio: VfioPassthrough | None, cp: Checkpoint) -> None:
    """Say which NVIDIA functions sit on ``vfio-pci`` with no claim of ours: an admin's
    passthrough, or ours from before a lost checkpoint. Left as they are (what the daemon
    cannot attribute it never changes); the admin gives them back."""
    if vfio is None:
        return
    ours = {f.bus_id for r in cp.claims.values() for d in r.devices if d.vfio is not None
            for f in d.vfio.functions}
    try:
        unowned = [bus for bus in vfio.sysfs.functions(NVIDIA_VENDOR)
                   if bus not in ours and vfio.sysfs.driver(bus) == VFIO_DRIVER]
    except OSError as exc:
        log.warning("cannot read which PCI functions are bound to vfio-pci", error=str(exc))
        return
    if unowned:
        log.warning("NVIDIA PCI functions are bound to vfio-pci but no claim of this node "
                    "holds them: left as they are (see examples/vfio-passthrough, Known "
                    "limits, to give them back)", functions=unowned)


def _minor(device: str) -> int | None:
    return device_minor(device)


def cli_offer(inventory: NodeInventory, *, simulate: bool) -> VfioOffer | None:
    """``gpudra inventory`` / ``explain``: the vfio devices a node daemon with the gate would
    publish. A simulated node has the simulator's default IOMMU layout (one group per GPU);
    a real one is read from ``/sys``, and has none without an IOMMU."""
    if simulate:
        from gpudra.driver.sim.pci import FIRST_GROUP  # simulator only

        return VfioOffer({bus: FIRST_GROUP + minor for bus, minor in (
            (sysfs_bus_id(g.probe.pci_bus_id), g.probe.minor) for g in inventory.gpus)})
    sysfs = PciSysfs(HOST_SYSFS)
    if not sysfs.available():
        return None
    return VfioOffer.read(sysfs, sorted(bus_ids(inventory).values()),
                          iommufd=Path("/dev/iommu").exists())


def bus_ids(inventory: NodeInventory) -> dict[str, str]:
    """GPU UUID → sysfs bus id."""
    return {g.probe.uuid: sysfs_bus_id(g.probe.pci_bus_id) for g in inventory.gpus}
