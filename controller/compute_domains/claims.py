"""What an allocated ResourceClaim says about ComputeDomains: which of its devices are IMEX
channels of which domain, on which node. Pure functions over the claim's raw JSON.

A channel use is an allocation result of the ``compute-domain.nvidia.com`` driver that a
``ComputeDomainChannelConfig`` applies to (a config applies to the results of the requests
it names, or to all of them when it names none; ``req`` covers ``req/sub``). The node is
the result's pool: the node side publishes one pool per node, named after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudra.api import compute_domain as cd

Obj = dict[str, Any]


@dataclass(frozen=True, order=True)
class ClaimKey:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, order=True)
class DeviceKey:
    """The list-map key of a ``status.devices`` entry."""

    driver: str
    pool: str
    device: str
    share_id: str = ""

    def entry(self) -> Obj:
        out: Obj = {"driver": self.driver, "pool": self.pool, "device": self.device}
        if self.share_id:
            out["shareID"] = self.share_id
        return out


@dataclass(frozen=True)
class ChannelUse:
    """One allocated channel device of one claim, for one domain on one node."""

    claim: ClaimKey
    domain_uid: str
    node: str
    device: DeviceKey
    conditions: Mapping[str, Obj] = field(default_factory=dict, compare=False, hash=False)
    """The entry's current conditions by type (what is on the server now)."""


@dataclass(frozen=True)
class ClaimReading:
    uses: tuple[ChannelUse, ...]
    problems: tuple[str, ...]
    """Why a config of ours could not be read, naming the claim and the field."""


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _as_map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def claim_key(claim: Mapping[str, Any]) -> ClaimKey:
    meta = _as_map(claim.get("metadata"))
    return ClaimKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                    str(meta.get("uid") or ""))


def _applies(config: Mapping[str, Any], request: str) -> bool:
    names = [str(n) for n in _as_list(config.get("requests"))]
    return not names or request in names or request.split("/", 1)[0] in names


def read_claim(claim: Mapping[str, Any]) -> ClaimReading:
    """The channel uses of an allocated claim (none for any other claim)."""
    key = claim_key(claim)
    status = _as_map(claim.get("status"))
    devices = _as_map(_as_map(status.get("allocation")).get("devices"))
    results = [r for r in _as_list(devices.get("results"))
               if isinstance(r, dict) and r.get("driver") == cd.DRIVER_NAME]
    if not results:
        return ClaimReading((), ())
    problems: list[str] = []
    channel_configs: list[tuple[Mapping[str, Any], str]] = []
    for index, config in enumerate(_as_list(devices.get("config"))):
        opaque = _as_map(_as_map(config).get("opaque"))
        params = opaque.get("parameters")
        if opaque.get("driver") != cd.DRIVER_NAME or not isinstance(params, dict):
            continue
        if params.get("kind") != cd.CHANNEL_CONFIG_KIND:
            continue
        try:
            parsed = cd.parse_channel_config(params)
        except cd.ComputeDomainError as error:
            problems.append(f"claim {key}: status.allocation.devices.config[{index}]"
                            f".opaque.parameters: {'; '.join(error.problems)}")
            continue
        channel_configs.append((config, parsed.domain_id))
    current = {_entry_key(e): e for e in _as_list(status.get("devices"))
               if isinstance(e, dict)}
    uses: list[ChannelUse] = []
    for result in results:
        request = str(result.get("request") or "")
        domains = [uid for config, uid in channel_configs if _applies(config, request)]
        if not domains:
            continue  # a daemon device, or a channel without our config: not a domain's
        if len(set(domains)) > 1:
            problems.append(f"claim {key}: request {request!r} has channel configs of "
                            f"several domains ({', '.join(sorted(set(domains)))}); the last "
                            "one applies")
        device = DeviceKey(str(result.get("driver")), str(result.get("pool") or ""),
                           str(result.get("device") or ""), str(result.get("shareID") or ""))
        entry = current.get(device)
        conditions = {str(c.get("type")): c for c in _as_list((entry or {}).get("conditions"))
                      if isinstance(c, dict)}
        uses.append(ChannelUse(key, domains[-1], device.pool, device, conditions))
    return ClaimReading(tuple(uses), tuple(problems))


def _entry_key(entry: Mapping[str, Any]) -> DeviceKey:
    return DeviceKey(str(entry.get("driver") or ""), str(entry.get("pool") or ""),
                     str(entry.get("device") or ""), str(entry.get("shareID") or ""))
