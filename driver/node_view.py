"""One consistent picture of the node's devices: what it publishes and prepares against.

Immutable: :class:`gpudra.driver.device_state.DeviceState` replaces it whole when GPUs
answer again (a reference swap), so a kubelet call that took it at its start plans, checks
and writes its CDI specs against one index, whatever the health watcher's thread does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from gpudra.driver.device_model import ModelOptions
from gpudra.driver.devices import Device
from gpudra.driver.inventory import NodeInventory
from gpudra.driver.prepare_plan import GpuTarget, NodeIndex


@dataclass(frozen=True)
class NodeView:
    inventory: NodeInventory
    """What ``index`` was built from: GPUs that could not be read are in
    ``inventory.unavailable``, to add once they answer."""
    options: ModelOptions
    index: NodeIndex

    @classmethod
    def build(cls, pool: str, inventory: NodeInventory, options: ModelOptions) -> NodeView:
        return cls(inventory, options, NodeIndex.build(pool, inventory, options))

    @cached_property
    def by_name(self) -> Mapping[str, Device]:
        """The published devices by name, built once per view (not per claim)."""
        return self.index.devices.by_name()

    @cached_property
    def gpus(self) -> frozenset[str]:
        """The physical GPUs the devices of this view are on."""
        return frozenset(t.uuid if isinstance(t, GpuTarget) else t.parent_uuid
                         for t in self.index.targets.values())

    def watched_gpus(self) -> list[str]:
        """Every physical GPU, including those that publish only (static) MIG devices and
        those that do not answer yet."""
        uuids = set()
        for device in self.index.devices.devices:
            key = "uuid" if device.type in ("gpu", "gpu-share", "vfio") else "parentUUID"
            uuids.add(str(device.attributes[key]))
        uuids.update(g.uuid for g in self.inventory.unavailable if g.uuid is not None)
        return sorted(uuids)
