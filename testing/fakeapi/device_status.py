"""``ResourceClaim.status.devices`` (AllocatedDeviceStatus) rules, as the apiserver checks
them (dra-interfaces.md §4.4 and §5): names, shareID, the list-map key, conditions, data
and networkData limits. Whether an entry names an allocated device is checked by the caller.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any, Final

from gpudra.testing.fakeapi import errors as fe
from gpudra.testing.fakeapi.errors import FieldError
from gpudra.testing.fakeapi.names import is_qualified_name
from gpudra.testing.fakeapi.validation import (
    as_map,
    check_dns_label,
    check_driver_name,
    check_pool_name,
    get_list,
    get_str,
)

Obj = dict[str, Any]

MAX_CONDITIONS: Final = 8
MAX_DATA: Final = 10 * 1024
MAX_IPS: Final = 16
MAX_INTERFACE_NAME: Final = 256
MAX_HARDWARE_ADDRESS: Final = 128
_UUID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# metav1.Condition.reason (apimachinery ValidateConditions)
_REASON: Final = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_STATUSES: Final = ["True", "False", "Unknown"]


def device_key(device: Obj) -> tuple[str, str, str, str]:
    """The list-map key of an entry: driver, pool, device, shareID."""
    return (str(device.get("driver", "")), str(device.get("pool", "")),
            str(device.get("device", "")), str(device.get("shareID") or ""))


def validate_device_status(device: Obj, path: str) -> list[FieldError]:
    errs = check_driver_name(get_str(device, "driver", f"{path}.driver") or "", f"{path}.driver")
    errs += check_pool_name(get_str(device, "pool", f"{path}.pool") or "", f"{path}.pool")
    errs += check_dns_label(get_str(device, "device", f"{path}.device") or "", f"{path}.device")
    share_id = get_str(device, "shareID", f"{path}.shareID")
    if share_id is not None and not _UUID.match(share_id):
        errs.append(fe.invalid(f"{path}.shareID", share_id,
                               "must be a lowercase UUID in 8-4-4-4-12 format"))
    errs += _conditions(get_list(device, "conditions", f"{path}.conditions") or [],
                        f"{path}.conditions")
    if "data" in device and device["data"] is not None:
        data = device["data"]
        if not isinstance(data, dict):
            errs.append(fe.invalid(f"{path}.data", "<value omitted>",
                                   "parameters must be a valid JSON object"))
        elif len(json.dumps(data, separators=(",", ":"))) > MAX_DATA:
            errs.append(fe.too_long(f"{path}.data", MAX_DATA))
    network = device.get("networkData")
    if network is not None:
        errs += _network(as_map(network, f"{path}.networkData"), f"{path}.networkData")
    return errs


def _conditions(conditions: list[Any], path: str) -> list[FieldError]:
    if len(conditions) > MAX_CONDITIONS:
        return [fe.too_many(path, len(conditions), MAX_CONDITIONS)]
    errs: list[FieldError] = []
    seen: set[str] = set()
    for i, item in enumerate(conditions):
        cpath = f"{path}[{i}]"
        condition = as_map(item, cpath)
        kind = str(condition.get("type") or "")
        for problem in is_qualified_name(kind):
            errs.append(fe.invalid(f"{cpath}.type", kind, problem))
        if kind in seen:
            errs.append(fe.duplicate(f"{cpath}.type", kind))
        seen.add(kind)
        status = condition.get("status")
        if status not in _STATUSES:
            errs.append(fe.not_supported(f"{cpath}.status", status, _STATUSES))
        if not condition.get("lastTransitionTime"):
            errs.append(fe.required(f"{cpath}.lastTransitionTime",
                                    "must be set"))
        reason = str(condition.get("reason") or "")
        if not reason:
            errs.append(fe.required(f"{cpath}.reason", "reason must be set"))
        elif len(reason) > 1024:
            errs.append(fe.too_long(f"{cpath}.reason", 1024))
        elif not _REASON.match(reason):
            errs.append(fe.invalid(f"{cpath}.reason", reason,
                                   "a condition reason must start with alphabetic character, "
                                   "optionally followed by a string of alphanumeric characters "
                                   "or '_,:', and must end with an alphanumeric character or "
                                   "'_'"))
        if len(str(condition.get("message") or "")) > 32 * 1024:
            errs.append(fe.too_long(f"{cpath}.message", 32 * 1024))
    return errs


def _network(network: Obj, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    if len(str(network.get("interfaceName") or "")) > MAX_INTERFACE_NAME:
        errs.append(fe.too_long(f"{path}.interfaceName", MAX_INTERFACE_NAME))
    if len(str(network.get("hardwareAddress") or "")) > MAX_HARDWARE_ADDRESS:
        errs.append(fe.too_long(f"{path}.hardwareAddress", MAX_HARDWARE_ADDRESS))
    ips = get_list(network, "ips", f"{path}.ips") or []
    if len(ips) > MAX_IPS:
        return [*errs, fe.too_many(f"{path}.ips", len(ips), MAX_IPS)]
    seen: set[str] = set()
    for i, ip in enumerate(ips):
        try:
            ipaddress.ip_interface(str(ip))
            if "/" not in str(ip):
                raise ValueError(ip)
        except ValueError:
            errs.append(fe.invalid(f"{path}.ips[{i}]", ip,
                                   "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or "
                                   "2001:db8::1/64)"))
        if ip in seen:
            errs.append(fe.duplicate(f"{path}.ips[{i}]", ip))
        seen.add(str(ip))
    return errs
