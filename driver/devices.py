"""The DRA device model: what this node offers, before it becomes ResourceSlice objects.

Pure data. Attribute names without a ``/`` live in the driver's own domain (the scheduler
and CEL see them as ``device.attributes["<driver>"].<name>``); qualified names keep theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, order=True)
class Version:
    """A semantic-version attribute value (``driverVersion``, ``cudaComputeCapability``)."""

    value: str

    def __str__(self) -> str:
        return self.value


AttributeValue = str | int | bool | Version
"""One DRA attribute value; ``bool`` is checked before ``int`` wherever the type matters."""

TaintEffect = Literal["None", "NoSchedule", "NoExecute"]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: TaintEffect
    time_added: str | None = None
    """RFC 3339 timestamp; ``None`` lets the apiserver fill it in."""


@dataclass(frozen=True)
class CounterConsumption:
    """How much of one shared counter set a device uses while it is allocated."""

    counter_set: str
    counters: Mapping[str, int]


@dataclass(frozen=True)
class CounterSet:
    """Shared counters of one physical GPU (dynamic MIG), published in a counters-only slice."""

    name: str
    counters: Mapping[str, int]


@dataclass(frozen=True)
class RequestPolicy:
    """``capacity.<name>.requestPolicy`` of a multi-allocatable device: what one allocation
    may consume (a ``validRange``; ``default`` when the request names no amount)."""

    default: int
    minimum: int
    step: int
    maximum: int


DeviceType = Literal["gpu", "mig", "gpu-share", "vfio"]


@dataclass(frozen=True)
class Device:
    """One allocatable DRA device.

    ``group`` names the physical GPU the device belongs to (``gpu-<minor>``); slices are laid
    out per group so that a change to one GPU touches one slice.
    """

    name: str
    group: str
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, int]
    consumes_counters: tuple[CounterConsumption, ...] = ()
    taints: tuple[Taint, ...] = ()
    allow_multiple_allocations: bool = False
    """DRA consumable capacity: many claims share the device, each consuming capacity."""
    request_policies: Mapping[str, RequestPolicy] = field(default_factory=dict)
    """Per capacity name; only on multi-allocatable devices."""
    binding_conditions: tuple[str, ...] = ()
    """KEP-5007: conditions the claim's device status must have True before the scheduler
    binds a pod to it (ComputeDomain channels wait for their IMEX daemons)."""
    binding_failure_conditions: tuple[str, ...] = ()
    binds_to_node: bool = False

    @property
    def type(self) -> str:
        value = self.attributes.get("type")
        return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class NodeDevices:
    """Everything one node publishes for one driver: devices and the counter sets they use."""

    devices: tuple[Device, ...]
    counter_sets: tuple[CounterSet, ...] = ()
    groups: tuple[str, ...] = field(default=())
    """Physical GPU groups in publishing order (``gpu-0``, ``gpu-1`` …)."""

    def by_name(self) -> dict[str, Device]:
        return {device.name: device for device in self.devices}
