"""What the node is asked to prepare, in driver terms (decoded from a ResourceClaim upstream)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudra.api.claims import claim_ref
from gpudra.api.configs import ConfigError, DeviceConfig, GpuConfig, MigDeviceConfig, decode_config


@dataclass(frozen=True)
class OpaqueConfig:
    """One opaque config entry for this driver, in precedence order (class first, then claim)."""

    requests: tuple[str, ...]
    """Requests it applies to (``req`` covers ``req/sub``); empty means all."""
    parameters: Mapping[str, Any]
    source: str = "FromClaim"
    position: int = 0
    """Index in ``status.allocation.devices.config`` (for error messages)."""


@dataclass(frozen=True)
class AllocatedDevice:
    request: str
    """``req`` or ``req/subrequest`` as in the allocation result."""
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    """Set for a share of a multi-allocatable device (DRA consumable capacity)."""
    consumed: tuple[tuple[str, int], ...] = ()
    """``consumedCapacity`` of the result, as (capacity name, integer amount), sorted."""

    @property
    def consumed_capacity(self) -> dict[str, int]:
        return dict(self.consumed)


@dataclass(frozen=True)
class ClaimToPrepare:
    uid: str
    namespace: str
    name: str
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueConfig, ...] = field(default=())
    pods: tuple[str, ...] = field(default=())
    """Pods the claim is reserved for (``status.reservedFor``), for usage labels."""

    @property
    def ref(self) -> str:
        """``namespace/name:uid``: how every message and log line names the claim."""
        return claim_ref(self.namespace, self.name, self.uid)


class ClaimError(Exception):
    """A claim cannot be prepared as asked; the message names the claim and the problem."""


def _applies(config: OpaqueConfig, request: str) -> bool:
    if not config.requests:
        return True
    base = request.split("/", 1)[0]
    return request in config.requests or base in config.requests


def resolve_configs(
    claim: ClaimToPrepare, device_types: Mapping[str, str]
) -> dict[str, DeviceConfig | None]:
    """The config that governs each allocated device (keyed by device name).

    Later entries win; an entry naming the request explicitly must fit the device type
    (a GpuConfig for a MIG device is an error), while an entry for all requests that does
    not fit the type is skipped, as in NVIDIA's driver.
    """
    decoded: list[tuple[OpaqueConfig, DeviceConfig]] = []
    for config in claim.configs:
        try:
            decoded.append((config, decode_config(dict(config.parameters))))
        except ConfigError as exc:
            where = f"status.allocation.devices.config[{config.position}].opaque.parameters"
            problems = "; ".join(f"{where}.{p}" if not p.startswith("parameters") else
                                 where + p.removeprefix("parameters") for p in exc.problems)
            raise ClaimError(f"claim {claim.ref}: invalid opaque config: {problems}") from exc
    chosen: dict[str, DeviceConfig | None] = {}
    for device in claim.devices:
        kind = device_types.get(device.device, "")
        if kind == "vfio":  # the VM configures its GPU: no config applies
            chosen[device.device] = None
            for config, value in decoded:
                if config.requests and _applies(config, device.request):
                    raise ClaimError(
                        f"claim {claim.ref}: config[{config.position}] is a {value.kind} but "
                        f"request {device.request!r} got vfio device {device.device!r}, which "
                        "takes no config")
            continue
        # A share is a full GPU's share: it takes a GpuConfig (its MPS / time-slicing).
        wanted = GpuConfig if kind in ("gpu", "gpu-share") else MigDeviceConfig
        chosen[device.device] = None
        for config, value in reversed(decoded):
            if not _applies(config, device.request):
                continue
            if isinstance(value, wanted):
                chosen[device.device] = value
                break
            if config.requests:
                raise ClaimError(
                    f"claim {claim.ref}: config[{config.position}] is a {value.kind} but request "
                    f"{device.request!r} got {kind or 'unknown'} device {device.device!r}; "
                    f"use {wanted.__name__} for it")
    return chosen


def duplicate_devices(devices: Sequence[AllocatedDevice]) -> list[str]:
    """Devices allocated twice (two shares of one device, by share ID, are not)."""
    seen: set[tuple[str, str]] = set()
    dupes = []
    for d in devices:
        key = (d.pool, d.device if d.share_id is None else f"{d.device}/{d.share_id}")
        if key in seen and not d.admin_access:
            dupes.append(d.device)
        seen.add(key)
    return dupes
