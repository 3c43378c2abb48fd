"""A fetched ResourceClaim (raw JSON) → what this driver must prepare, or why not."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpudra.api.claims import claim_ref
from gpudra.driver.claims import AllocatedDevice, ClaimError, ClaimToPrepare, OpaqueConfig


def decode_claim(
    raw: Mapping[str, Any], *, namespace: str, name: str, uid: str, driver: str
) -> ClaimToPrepare:
    """Check the claim is the one asked for and allocated, and keep this driver's part.

    Raises :class:`ClaimError` naming the claim and the field that is wrong.
    """
    ref = claim_ref(namespace, name, uid)
    meta = raw.get("metadata") or {}
    if meta.get("uid") != uid:
        raise ClaimError(f"claim {ref}: the claim was replaced: the API server has uid "
                         f"{meta.get('uid')!r} (metadata.uid)")
    allocation = (raw.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"claim {ref}: not allocated (status.allocation is empty)")
    devices_part = allocation.get("devices") or {}
    results = devices_part.get("results") or []
    mine = []
    for i, result in enumerate(results):
        if result.get("driver") != driver:
            continue
        for key in ("request", "pool", "device"):
            if not isinstance(result.get(key), str) or not result[key]:
                raise ClaimError(f"claim {ref}: status.allocation.devices.results[{i}].{key} "
                                 "is missing")
        mine.append(AllocatedDevice(
            request=result["request"],
            pool=result["pool"],
            device=result["device"],
            admin_access=bool(result.get("adminAccess")),
            share_id=result.get("shareID"),
        ))
    if not mine:
        raise ClaimError(f"claim {ref}: no devices allocated for driver {driver} "
                         "(status.allocation.devices.results)")
    configs = _configs(ref, devices_part.get("config") or [], driver)
    return ClaimToPrepare(uid=uid, namespace=namespace, name=name, devices=tuple(mine),
                          configs=configs)


def _configs(ref: str, entries: list[Any], driver: str) -> tuple[OpaqueConfig, ...]:
    """This driver's opaque configs, class configs first (lowest precedence), then the claim's."""
    found: list[OpaqueConfig] = []
    for i, entry in enumerate(entries):
        opaque = (entry or {}).get("opaque")
        if not opaque or opaque.get("driver") != driver:
            continue  # other drivers' configs are theirs to judge
        parameters = opaque.get("parameters")
        if not isinstance(parameters, dict):
            kind = type(parameters).__name__ if parameters is not None else "null"
            raise ClaimError(f"claim {ref}: status.allocation.devices.config[{i}].opaque."
                             f"parameters must be a JSON object, got {kind}")
        found.append(OpaqueConfig(
            requests=tuple(entry.get("requests") or ()),
            parameters=parameters,
            source=str(entry.get("source") or "FromClaim"),
            position=i,
        ))
    # Stable sort keeps the order within each source; class configs rank below claim ones.
    return tuple(sorted(found, key=lambda c: 0 if c.source == "FromClass" else 1))
