"""A fetched ResourceClaim (raw JSON) → what this driver must prepare, or why not.

The claim comes from the API server, which this daemon does not trust: it is validated
against :mod:`.claim_schema` first, then every identifier this driver keeps (pool, device,
request, share ID) against its Kubernetes rule (:mod:`gpudra.api.identifiers`), before
any of it reaches a path, a CDI name, the hardware, a log line or a metric label. Every
problem is a :class:`ClaimError` naming the claim and the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gpudra.api.api_limits import (
    OPAQUE_PARAMETERS_MAX_LENGTH,
    RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
)
from gpudra.api.claims import claim_ref
from gpudra.api.identifiers import (
    UUID_RE,
    IdentifierError,
    check_device,
    check_pool,
    check_request,
    check_subdomain,
    shown,
)
from gpudra.api.quantity import QuantityError, parse_quantity
from gpudra.driver.claims import AllocatedDevice, ClaimError, ClaimToPrepare, OpaqueConfig
from gpudra.kubeletplugin.claims import claim_schema
from gpudra.kubeletplugin.claims.claim_schema import DeviceConfig, DeviceResult

CONSUMED_MAX = RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE
"""Capacities one result may consume: no device has more capacities than this."""


def decode_claim(
    raw: Mapping[str, Any], *, namespace: str, name: str, uid: str, driver: str
) -> ClaimToPrepare:
    """Check the claim is the one asked for and allocated, and keep this driver's part.

    Raises :class:`ClaimError` naming the claim and the field that is wrong.
    """
    ref = claim_ref(namespace, name, uid)
    if not isinstance(raw, Mapping):
        raise ClaimError(f"claim {ref}: the API server's answer is not an object")
    try:
        claim = claim_schema.validate(raw)
    except ValidationError as exc:
        raise ClaimError(f"claim {ref}: {claim_schema.problems(exc)}") from None
    meta = claim["metadata"]
    have_uid = meta.get("uid")
    if have_uid != uid:
        raise ClaimError(f"claim {ref}: the claim was replaced: the API server has uid "
                         f"{shown(have_uid) if have_uid is not None else None} (metadata.uid)")
    for key, asked in (("namespace", namespace), ("name", name)):
        have = meta.get(key)
        if have is not None and have != asked:
            raise ClaimError(f"claim {ref}: the API server answered with another claim: "
                             f"metadata.{key} is {shown(have)}")
    status = claim.get("status") or {}
    allocation = status.get("allocation") or {}
    devices_part = allocation.get("devices")
    if not devices_part:
        raise ClaimError(f"claim {ref}: not allocated (status.allocation is empty)")
    mine = []
    for i, result in enumerate(devices_part.get("results") or ()):
        if result["driver"] != driver:
            continue
        mine.append(_device(ref, i, result))
    if not mine:
        raise ClaimError(f"claim {ref}: no devices allocated for driver {driver} "
                         "(status.allocation.devices.results)")
    configs = _configs(ref, devices_part.get("config") or [], driver)
    pods = []
    for i, entry in enumerate(status.get("reservedFor") or ()):
        pod = entry.get("name")
        if entry.get("resource") == "pods" and pod is not None:
            # Pod names become metric labels (usage): they must be what the API allows.
            pods.append(_checked(ref, check_subdomain, pod, f"status.reservedFor[{i}].name"))
    return ClaimToPrepare(uid=uid, namespace=namespace, name=name, devices=tuple(mine),
                          configs=configs, pods=tuple(pods))


def _checked(ref: str, check: Any, value: str, where: str) -> str:
    try:
        return str(check(value, where))
    except IdentifierError as exc:
        raise ClaimError(f"claim {ref}: {exc}") from None


def _device(ref: str, i: int, result: DeviceResult) -> AllocatedDevice:
    request, pool, device = result["request"], result["pool"], result["device"]
    try:  # where is only built for an error: this runs for every device of every claim
        check_request(request, "")
        check_pool(pool, "")
        check_device(device, "")
    except IdentifierError:
        where = f"status.allocation.devices.results[{i}]"
        for key in ("request", "pool", "device"):
            if not result[key]:
                raise ClaimError(f"claim {ref}: {where}.{key} is missing") from None
        _checked(ref, check_request, request, f"{where}.request")
        _checked(ref, check_pool, pool, f"{where}.pool")
        _checked(ref, check_device, device, f"{where}.device")
    return AllocatedDevice(
        request=request,
        pool=pool,
        device=device,
        admin_access=bool(result.get("adminAccess")),
        share_id=_share_id(ref, i, result.get("shareID")),
        consumed=_consumed(ref, i, result.get("consumedCapacity")),
    )


def _share_id(ref: str, i: int, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not UUID_RE.fullmatch(value):
        shown_value = shown(value) if isinstance(value, str) else repr(value)[:40]
        raise ClaimError(f"claim {ref}: status.allocation.devices.results[{i}].shareID "
                         f"{shown_value} is not a lower-case UUID")
    return value


def _consumed(ref: str, i: int, value: object) -> tuple[tuple[str, int], ...]:
    """``consumedCapacity`` as whole amounts (bytes, multiprocessors, shares), strictly."""
    if value is None:
        return ()
    where = f"status.allocation.devices.results[{i}].consumedCapacity"
    if not isinstance(value, Mapping):
        raise ClaimError(f"claim {ref}: {where} must be a map of quantities, got "
                         f"{type(value).__name__}")
    if len(value) > CONSUMED_MAX:
        raise ClaimError(f"claim {ref}: {where} has {len(value)} entries, more than a device "
                         f"has capacities ({CONSUMED_MAX})")
    amounts = []
    for name, raw in value.items():
        if not isinstance(name, str) or not name or len(name) > 128:
            raise ClaimError(f"claim {ref}: {where} has an empty or over-long capacity name")
        try:
            if not isinstance(raw, str | int) or isinstance(raw, bool):
                raise QuantityError(f"expected a quantity string, got {raw!r}")
            amount = parse_quantity(raw)
        except QuantityError as exc:
            raise ClaimError(f"claim {ref}: {where}.{name}: {exc}") from exc
        if amount < 0 or amount.denominator != 1:
            raise ClaimError(f"claim {ref}: {where}.{name}: {shown(str(raw))} is not a whole, "
                             "non-negative amount")
        amounts.append((name, int(amount)))
    return tuple(sorted(amounts))


def _configs(ref: str, entries: list[DeviceConfig], driver: str) -> tuple[OpaqueConfig, ...]:
    """This driver's opaque configs, class configs first (lowest precedence), then the claim's."""
    found: list[OpaqueConfig] = []
    for i, entry in enumerate(entries):
        opaque = entry.get("opaque")
        if opaque is None or opaque["driver"] != driver:
            continue  # other drivers' configs are theirs to judge
        where = f"status.allocation.devices.config[{i}]"
        parameters = opaque.get("parameters")
        if not isinstance(parameters, dict):
            kind = type(parameters).__name__ if parameters is not None else "null"
            raise ClaimError(f"claim {ref}: {where}.opaque.parameters must be a JSON object, "
                             f"got {kind}")
        size = len(json.dumps(parameters, separators=(",", ":")))
        if size > OPAQUE_PARAMETERS_MAX_LENGTH:
            raise ClaimError(f"claim {ref}: {where}.opaque.parameters has {size} bytes, more "
                             f"than the API allows ({OPAQUE_PARAMETERS_MAX_LENGTH})")
        requests = tuple(_checked(ref, check_request, r, f"{where}.requests[{j}]")
                         for j, r in enumerate(entry.get("requests") or ()))
        found.append(OpaqueConfig(
            requests=requests,
            parameters=parameters,
            source=entry.get("source") or "FromClaim",
            position=i,
        ))
    # Stable sort keeps the order within each source; class configs rank below claim ones.
    return tuple(sorted(found, key=lambda c: 0 if c.source == "FromClass" else 1))
