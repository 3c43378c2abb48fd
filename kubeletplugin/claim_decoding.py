"""A fetched ResourceClaim (raw JSON) → what this driver must prepare, or why not."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpudra.api.claims import claim_ref
from gpudra.api.quantity import QuantityError, parse_quantity
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
            share_id=_share_id(ref, i, result.get("shareID")),
            consumed=_consumed(ref, i, result.get("consumedCapacity")),
        ))
    if not mine:
        raise ClaimError(f"claim {ref}: no devices allocated for driver {driver} "
                         "(status.allocation.devices.results)")
    configs = _configs(ref, devices_part.get("config") or [], driver)
    pods = tuple(entry["name"] for entry in (raw.get("status") or {}).get("reservedFor") or []
                 if isinstance(entry, dict) and entry.get("resource") == "pods"
                 and isinstance(entry.get("name"), str))
    return ClaimToPrepare(uid=uid, namespace=namespace, name=name, devices=tuple(mine),
                          configs=configs, pods=pods)


# What the apiserver accepts for a shareID: a lower-case RFC 4122 UUID of 36 characters.
_SHARE_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _share_id(ref: str, i: int, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _SHARE_ID_RE.fullmatch(value):
        raise ClaimError(f"claim {ref}: status.allocation.devices.results[{i}].shareID "
                         f"{value!r} is not a lower-case UUID")
    return value


def _consumed(ref: str, i: int, value: object) -> tuple[tuple[str, int], ...]:
    """``consumedCapacity`` as whole amounts (bytes, multiprocessors, shares), strictly."""
    if value is None:
        return ()
    where = f"status.allocation.devices.results[{i}].consumedCapacity"
    if not isinstance(value, Mapping):
        raise ClaimError(f"claim {ref}: {where} must be a map of quantities, got "
                         f"{type(value).__name__}")
    amounts = []
    for name, raw in value.items():
        if not isinstance(name, str) or not name:
            raise ClaimError(f"claim {ref}: {where} has an empty capacity name")
        try:
            if not isinstance(raw, str | int) or isinstance(raw, bool):
                raise QuantityError(f"expected a quantity string, got {raw!r}")
            amount = parse_quantity(raw)
        except QuantityError as exc:
            raise ClaimError(f"claim {ref}: {where}.{name}: {exc}") from exc
        if amount < 0 or amount.denominator != 1:
            raise ClaimError(f"claim {ref}: {where}.{name}: {raw!r} is not a whole, "
                             "non-negative amount")
        amounts.append((name, int(amount)))
    return tuple(sorted(amounts))


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
