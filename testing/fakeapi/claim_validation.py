"""DeviceClass, ResourceClaim / ResourceClaimTemplate and claim-status rules (dra-interfaces.md
§4.2-4.4), on the shared checks of ``validation``."""

from __future__ import annotations

import re
from typing import Any

from gpudra.testing.fakeapi import errors as fe
from gpudra.testing.fakeapi import quantity
from gpudra.testing.fakeapi.device_status import device_key, validate_device_status
from gpudra.testing.fakeapi.errors import FieldError
from gpudra.testing.fakeapi.validation import (
    as_map,
    check_dns_label,
    check_dns_subdomain,
    get_int,
    get_list,
    get_map,
    get_str,
    validate_meta,
    validate_opaque,
    validate_selectors,
)

Obj = dict[str, Any]


# ---- DeviceClass ---------------------------------------------------------------------------

def validate_device_class(obj: Obj, old: Obj | None = None) -> list[FieldError]:
    errs = validate_meta(obj)
    spec = get_map(obj, "spec", "DeviceClass.spec") or {}
    errs.extend(validate_selectors(get_list(spec, "selectors", "spec.selectors") or [],
                                   "spec.selectors"))
    configs = get_list(spec, "config", "spec.config") or []
    if len(configs) > 32:
        errs.append(fe.too_many("spec.config", len(configs), 32))
    else:
        for i, config in enumerate(configs):
            errs.extend(validate_opaque(as_map(config, "spec.config"), f"spec.config[{i}]"))
    return errs


# ---- ResourceClaim and ResourceClaimTemplate -----------------------------------------------

def _request_names(devices: Obj) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for request in devices.get("requests") or []:
        if isinstance(request, dict):
            subs = request.get("firstAvailable") or []
            names[str(request.get("name"))] = {str(s.get("name")) for s in subs
                                               if isinstance(s, dict)}
    return names


def _has_request(names: dict[str, set[str]], ref: str) -> bool:
    head, _, sub = ref.partition("/")
    return head in names and (not sub or sub in names[head])


def _validate_exact(request: Obj, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    class_name = get_str(request, "deviceClassName", f"{path}.deviceClassName") or ""
    if not class_name:
        errs.append(fe.required(f"{path}.deviceClassName"))
    else:
        errs.extend(check_dns_subdomain(class_name, f"{path}.deviceClassName"))
    errs.extend(validate_selectors(get_list(request, "selectors", path) or [],
                                   f"{path}.selectors"))
    mode = get_str(request, "allocationMode", path) or "ExactCount"
    count = get_int(request, "count", f"{path}.count")
    if mode == "All":
        if count:
            errs.append(fe.invalid(f"{path}.count", count,
                                   "must not be specified when allocationMode is 'All'"))
    elif mode == "ExactCount":
        if count is not None and count <= 0:
            errs.append(fe.invalid(f"{path}.count", count, "must be greater than zero"))
    else:
        errs.append(fe.not_supported(f"{path}.allocationMode", mode, ["All", "ExactCount"]))
    return errs


def validate_claim_spec(spec: Obj, path: str) -> list[FieldError]:
    devices = get_map(spec, "devices", f"{path}.devices") or {}
    dpath = f"{path}.devices"
    errs: list[FieldError] = []
    requests = get_list(devices, "requests", f"{dpath}.requests") or []
    if len(requests) > 32:
        errs.append(fe.too_many(f"{dpath}.requests", len(requests), 32))
        requests = []
    seen: set[str] = set()
    for i, item in enumerate(requests):
        rpath = f"{dpath}.requests[{i}]"
        request = as_map(item, rpath)
        name = get_str(request, "name", f"{rpath}.name") or ""
        errs.extend(check_dns_label(name, f"{rpath}.name"))
        exactly = get_map(request, "exactly", f"{rpath}.exactly")
        first = get_list(request, "firstAvailable", f"{rpath}.firstAvailable")
        if exactly is None and not first:
            errs.append(fe.required(rpath, "exactly one of `exactly` or `firstAvailable` is "
                                           "required"))
        elif exactly is not None and first:
            errs.append(fe.invalid(rpath, None, "exactly one of `exactly` or `firstAvailable` "
                                                "is required, but multiple fields are set"))
        elif exactly is not None:
            errs.extend(_validate_exact(exactly, f"{rpath}.exactly"))
        elif first is not None:
            if len(first) > 8:
                errs.append(fe.too_many(f"{rpath}.firstAvailable", len(first), 8))
            else:
                sub_seen: set[str] = set()
                for j, sub_item in enumerate(first):
                    spath = f"{rpath}.firstAvailable[{j}]"
                    sub = as_map(sub_item, spath)
                    sub_name = get_str(sub, "name", f"{spath}.name") or ""
                    errs.extend(check_dns_label(sub_name, f"{spath}.name"))
                    errs.extend(_validate_exact(sub, spath))
                    if sub_name in sub_seen:
                        errs.append(fe.duplicate(spath, sub_name))
                    sub_seen.add(sub_name)
        if name in seen:
            errs.append(fe.duplicate(rpath, name))
        seen.add(name)
    names = _request_names(devices)
    constraints = get_list(devices, "constraints", f"{dpath}.constraints") or []
    if len(constraints) > 32:
        errs.append(fe.too_many(f"{dpath}.constraints", len(constraints), 32))
    configs = get_list(devices, "config", f"{dpath}.config") or []
    if len(configs) > 32:
        errs.append(fe.too_many(f"{dpath}.config", len(configs), 32))
        configs = []
    for i, item in enumerate(configs):
        cpath = f"{dpath}.config[{i}]"
        config = as_map(item, cpath)
        for j, ref in enumerate(get_list(config, "requests", cpath) or []):
            if not isinstance(ref, str) or not _has_request(names, ref):
                errs.append(fe.invalid(f"{cpath}.requests[{j}]", ref,
                                       "must be the name of a request in the claim or the name "
                                       "of a request and a subrequest separated by '/'"))
        errs.extend(validate_opaque(config, cpath))
    return errs


def validate_claim(obj: Obj, old: Obj | None = None) -> list[FieldError]:
    errs = validate_meta(obj)
    spec = get_map(obj, "spec", "ResourceClaim.spec") or {}
    if old is not None:
        # The spec is immutable; on update only immutability is checked.
        if spec != (old.get("spec") or {}):
            errs.append(fe.invalid("spec", spec, "field is immutable"))
        return errs
    return errs + validate_claim_spec(spec, "spec")


def validate_claim_template(obj: Obj, old: Obj | None = None) -> list[FieldError]:
    errs = validate_meta(obj)
    spec = get_map(obj, "spec", "ResourceClaimTemplate.spec") or {}
    if old is not None:
        if spec != (old.get("spec") or {}):
            errs.append(fe.invalid("spec", spec, "field is immutable"))
        return errs
    inner = get_map(spec, "spec", "spec.spec") or {}
    return errs + validate_claim_spec(inner, "spec.spec")


def _allocated(status: Obj) -> set[tuple[str, str, str, str]]:
    allocation = status.get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return {(r.get("driver", ""), r.get("pool", ""), r.get("device", ""), r.get("shareID") or "")
            for r in results if isinstance(r, dict)}


_SHARE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _allocation_results(allocation: Obj) -> list[FieldError]:
    """KEP-5075 fields of the results: ``shareID`` a lower-case UUID, ``consumedCapacity``
    quantities (validation.go ``validateDeviceRequestAllocationResult``)."""
    errs: list[FieldError] = []
    results = (allocation.get("devices") or {}).get("results") or []
    for i, result in enumerate(r for r in results if isinstance(r, dict)):
        path = f"status.allocation.devices.results[{i}]"
        share_id = result.get("shareID")
        if share_id is not None and not (isinstance(share_id, str)
                                         and _SHARE_ID.fullmatch(share_id)):
            errs.append(fe.invalid(f"{path}.shareID", share_id,
                                   "must be a lowercase UUID in 8-4-4-4-12 format"))
        for value in (result.get("consumedCapacity") or {}).values():
            quantity.parse(value)  # an unparsable quantity fails decoding, as upstream
    return errs


def validate_claim_status(obj: Obj, old: Obj) -> list[FieldError]:
    status = get_map(obj, "status", "ResourceClaim.status") or {}
    old_status = old.get("status") or {}
    errs: list[FieldError] = []
    reserved = get_list(status, "reservedFor", "status.reservedFor") or []
    if len(reserved) > 256:
        errs.append(fe.too_many("status.reservedFor", len(reserved), 256))
    else:
        uids: set[str] = set()
        for i, item in enumerate(reserved):
            rpath = f"status.reservedFor[{i}]"
            ref = as_map(item, rpath)
            for key in ("resource", "name", "uid"):
                if not ref.get(key):
                    errs.append(fe.required(f"{rpath}.{key}"))
            if ref.get("uid") in uids:
                errs.append(fe.duplicate(rpath, ref.get("uid")))
            uids.add(str(ref.get("uid")))
    allocation = get_map(status, "allocation", "status.allocation")
    if reserved and allocation is None:
        errs.append(fe.forbidden("status.reservedFor",
                                 "may not be specified when `allocated` is not set"))
    old_allocation = old_status.get("allocation")
    if old_allocation is not None and allocation is not None and allocation != old_allocation:
        errs.append(fe.invalid("status.allocation", allocation, "field is immutable"))
    if allocation is not None and allocation != old_allocation:
        errs.extend(_allocation_results(allocation))
    allocated = _allocated(status)
    keys: set[tuple[str, str, str, str]] = set()
    for i, item in enumerate(get_list(status, "devices", "status.devices") or []):
        dpath = f"status.devices[{i}]"
        device = as_map(item, dpath)
        device_id = device_key(device)
        if device_id not in allocated:
            shown = "/".join(device_id[:3]) + (f"/{device_id[3]}" if device_id[3] else "")
            errs.append(fe.invalid(dpath, shown, "must be an allocated device in the claim"))
        if device_id in keys:
            errs.append(fe.duplicate(dpath, "/".join(p for p in device_id if p)))
        keys.add(device_id)
        errs.extend(validate_device_status(device, dpath))
    return errs
