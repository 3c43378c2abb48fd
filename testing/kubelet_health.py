"""The kubelet's side of the DRA health stream (KEP-4680), for :class:`KubeletEmulator`.

What the kubelet does, as a gRPC client of the plugin's DRA socket:

- picks the health service from the plugin's ``supported_versions``: a 1.37 kubelet takes
  ``v1.DRAResourceHealth`` when listed, else ``v1alpha1.DRAResourceHealth``; a 1.34-1.36
  kubelet knows only v1alpha1 (``services=``); a plugin that lists neither has no stream;
- calls ``NodeWatchResources`` and keeps the stream open, reading each response as the
  complete device list of the driver;
- refuses what it cannot use (a device without pool or name), truncates messages past 1024
  characters to 1021 + ``...`` (1.36+), and treats a device whose ``last_updated_time`` is
  older than its ``health_check_timeout_seconds`` (or the default, when 0 or less) as
  Unknown, as it does a device missing from the list;
- shows the result in ``pod.status.containerStatuses[].allocatedResourcesStatus`` under the
  prepared device's first CDI device ID (:meth:`HealthWatch.resource_health`).

The clock is injectable: staleness is decided at :meth:`HealthWatch.statuses` time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from gpudra.api.proto import (
    HEALTH_V1_ADVERTISED,
    HEALTH_V1ALPHA1_ADVERTISED,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)

KUBELET_HEALTH_SERVICES = (HEALTH_V1_ADVERTISED, HEALTH_V1ALPHA1_ADVERTISED)
"""A 1.37 kubelet's preference; ``(HEALTH_V1ALPHA1_ADVERTISED,)`` is a 1.34-1.36 kubelet."""
MESSAGE_MAX = 1024
DEFAULT_TIMEOUT = 30.0
"""Seconds a device's health stays current when the plugin names no timeout (this
emulator's choice of the kubelet default)."""

_MODULES: Mapping[str, tuple[Any, Any]] = {
    HEALTH_V1_ADVERTISED: (health_v1_pb2, health_v1_pb2_grpc),
    HEALTH_V1ALPHA1_ADVERTISED: (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
}
_STATUS = {1: "Healthy", 2: "Unhealthy"}


class HealthStreamError(Exception):
    """The kubelet would drop this response (or there is no stream to read)."""


@dataclass(frozen=True)
class DeviceStatus:
    """One device as the kubelet keeps it: ``Healthy``, ``Unhealthy`` or ``Unknown``."""

    pool: str
    device: str
    health: str
    message: str
    last_updated: int
    timeout: float


def pick_service(supported_versions: Iterable[str],
                 kubelet_services: Sequence[str] = KUBELET_HEALTH_SERVICES) -> str | None:
    """The health service the kubelet uses: its own preference, among what the plugin lists."""
    listed = set(supported_versions)
    return next((s for s in kubelet_services if s in listed), None)


class HealthWatch:
    """One open ``NodeWatchResources`` stream and the device health read from it."""

    def __init__(self, channel: Any, service: str, *,
                 clock: Callable[[], float] = time.time) -> None:
        pb2, pb2_grpc = _MODULES[service]
        self.service = service
        self._call = pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            pb2.NodeWatchResourcesRequest())
        self._clock = clock
        self._devices: dict[tuple[str, str], DeviceStatus] = {}
        self.responses = 0

    async def next(self, within: float = 10.0) -> dict[str, DeviceStatus]:
        """Read one response (the complete list) and return :meth:`statuses`."""
        try:
            response = await asyncio.wait_for(self._call.read(), within)
        except TimeoutError:
            raise HealthStreamError(f"no health response within {within} s") from None
        if response is grpc.aio.EOF:
            raise HealthStreamError("the plugin ended the health stream")
        devices: dict[tuple[str, str], DeviceStatus] = {}
        for entry in response.devices:
            pool, name = entry.device.pool_name, entry.device.device_name
            if not pool or not name:
                raise HealthStreamError(f"device without pool or name: {entry}")
            message = entry.message
            if len(message) > MESSAGE_MAX:
                message = message[:MESSAGE_MAX - 3] + "..."
            timeout_s = (float(entry.health_check_timeout_seconds)
                         if entry.health_check_timeout_seconds > 0 else DEFAULT_TIMEOUT)
            devices[(pool, name)] = DeviceStatus(pool, name, _STATUS.get(entry.health, "Unknown"),
                                                 message, int(entry.last_updated_time), timeout_s)
        self._devices = devices  # a complete list: anything not in it is Unknown
        self.responses += 1
        return self.statuses()

    async def wait_for(self, predicate: Callable[[dict[str, DeviceStatus]], bool],
                       within: float = 10.0) -> dict[str, DeviceStatus]:
        """Read responses until ``predicate`` holds for the statuses (or fail)."""
        deadline = time.monotonic() + within
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HealthStreamError("the health stream never reported the expected state")
            statuses = await self.next(remaining)
            if predicate(statuses):
                return statuses

    def statuses(self) -> dict[str, DeviceStatus]:
        """Device name → status now; one not refreshed within its timeout is Unknown."""
        now = self._clock()
        out = {}
        for known in self._devices.values():
            stale = now - known.last_updated > known.timeout
            out[known.device] = known if not stale else DeviceStatus(
                known.pool, known.device, "Unknown", known.message, known.last_updated,
                known.timeout)
        return out

    def resource_health(self, cdi_ids_by_device: Mapping[str, Sequence[str]]) -> dict[str, str]:
        """``allocatedResourcesStatus`` as the kubelet fills it for prepared devices: the
        first CDI device ID of each device → its health (Unknown when not reported)."""
        statuses = self.statuses()
        return {ids[0]: (statuses[device].health if device in statuses else "Unknown")
                for device, ids in cdi_ids_by_device.items() if ids}

    def close(self) -> None:
        self._call.cancel()
