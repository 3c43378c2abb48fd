"""ResourceSlice validation: the apiserver's rules (dra-interfaces.md §5), written from the
reference independently of the driver's own local validator
(``gpudra.controller.slice_validation``), so each checks the other:
``tests/fakeapi/test_validators_agree.py`` sends the driver's rule table here and compares.
This copy stays separate on purpose: it also decodes (wrong JSON types are 400s, not field
errors) and checks updates, which the driver's copy has no use for.

Order of checks and error paths follow ``validateResourceSliceSpec``: driver, pool,
immutable fields, node selection, devices XOR sharedCounters, devices (size short-circuits),
shared counters. Map keys are visited in sorted order so messages are deterministic.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from gpudra.testing.fakeapi import errors as fe
from gpudra.testing.fakeapi import quantity
from gpudra.testing.fakeapi.errors import FieldError
from gpudra.testing.fakeapi.names import SEMVER, is_c_identifier
from gpudra.testing.fakeapi.validation import (
    as_map,
    check_dns_label,
    check_dns_subdomain,
    check_driver_name,
    check_label_key,
    check_pool_name,
    get_bool,
    get_int,
    get_list,
    get_map,
    get_str,
    validate_meta,
    validate_node_selector,
    validate_taint,
)

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64  # any taints, consumesCounters or list attributes in the slice
MAX_COUNTER_SETS = 8
MAX_VALID_VALUES = 10  # CapacityRequestPolicyDiscreteMaxOptions
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_ID_LENGTH = 32
MAX_VALUE_LENGTH = 64
MAX_TAINTS = 16
MAX_BINDING_CONDITIONS = 4
ATTRIBUTE_KEY_TRUNCATE = 63 + 1 + MAX_ID_LENGTH
_SCALARS = ("bool", "int", "string", "version")
_LISTS = ("bools", "ints", "strings", "versions")

Obj = dict[str, Any]


def validate_resource_slice(obj: Obj, old: Obj | None = None) -> list[FieldError]:
    errs = validate_meta(obj)
    spec = get_map(obj, "spec", "ResourceSlice.spec") or {}
    old_spec = (old or {}).get("spec") if old is not None else None
    return errs + _spec(spec, old_spec)


def _spec(spec: Obj, old: Obj | None) -> list[FieldError]:
    errs = check_driver_name(get_str(spec, "driver", "spec.driver") or "", "spec.driver")
    pool = get_map(spec, "pool", "spec.pool") or {}
    errs.extend(check_pool_name(get_str(pool, "name", "spec.pool.name") or "", "spec.pool.name"))
    count = get_int(pool, "resourceSliceCount", "spec.pool.resourceSliceCount") or 0
    if count <= 0:
        errs.append(fe.invalid("spec.pool.resourceSliceCount", count, "must be greater than zero"))
    generation = get_int(pool, "generation", "spec.pool.generation") or 0
    if generation < 0:
        errs.append(fe.invalid("spec.pool.generation", generation,
                               "must be greater than or equal to zero"))
    if old is not None:
        old_pool = old.get("pool") or {}
        for path, new_value, old_value in (
            ("spec.pool.name", pool.get("name", ""), old_pool.get("name", "")),
            ("spec.driver", spec.get("driver", ""), old.get("driver", "")),
            ("spec.nodeName", spec.get("nodeName"), old.get("nodeName")),
        ):
            if new_value != old_value:
                errs.append(fe.invalid(path, new_value, "field is immutable"))
    errs.extend(_node_selection(spec))
    devices = get_list(spec, "devices", "spec.devices")
    counters = get_list(spec, "sharedCounters", "spec.sharedCounters")
    if devices is not None and counters is not None:
        # Presence counts, not length: an empty list is still "set" after decoding.
        errs.append(fe.invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed"))
    errs.extend(_devices(devices or [], old, spec))
    errs.extend(_counter_lists(counters or [], "spec.sharedCounters", name_field="name",
                               max_entries=MAX_COUNTER_SETS, max_counters=MAX_COUNTERS_PER_SET))
    return errs


def _node_selection(spec: Obj) -> list[FieldError]:
    errs: list[FieldError] = []
    chosen: list[str] = []
    node_name = get_str(spec, "nodeName", "spec.nodeName")
    if node_name is not None:
        if node_name:
            chosen.append("`nodeName`")
            errs.extend(check_dns_subdomain(node_name, "spec.nodeName"))
        else:
            errs.append(fe.invalid("spec.nodeName", node_name,
                                   "must be either unset or set to a non-empty string"))
    selector = get_map(spec, "nodeSelector", "spec.nodeSelector")
    if selector is not None:
        chosen.append("`nodeSelector`")
        errs.extend(validate_node_selector(selector, "spec.nodeSelector"))
        terms = selector.get("nodeSelectorTerms") or []
        if len(terms) != 1:
            errs.append(fe.invalid("spec.nodeSelector.nodeSelectorTerms", terms,
                                   "must have exactly one node selector term"))
    for key in ("allNodes", "perDeviceNodeSelection"):
        flag = get_bool(spec, key, f"spec.{key}")
        if flag is True:
            chosen.append(f"`{key}`")
        elif flag is False:
            errs.append(fe.invalid(f"spec.{key}", False, "must be either unset or set to true"))
    fields = "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"
    if not chosen:
        errs.append(fe.required("spec", f"exactly one of {fields} is required"))
    elif len(chosen) > 1:
        errs.append(fe.invalid("spec", "{" + ", ".join(chosen) + "}",
                               f"exactly one of {fields} is required, but multiple fields are "
                               "set"))
    return errs


def _advanced(devices: list[Any]) -> bool:
    for device in devices:
        if not isinstance(device, dict):
            continue
        if device.get("taints") or device.get("consumesCounters"):
            return True
        attributes = device.get("attributes")
        if isinstance(attributes, dict) and any(
            isinstance(a, dict) and any(a.get(k) is not None for k in _LISTS)
            for a in attributes.values()
        ):
            return True
    return False


def _devices(devices: list[Any], old: Obj | None, spec: Obj) -> list[FieldError]:
    limit = MAX_DEVICES_ADVANCED if _advanced(devices) else MAX_DEVICES
    if len(devices) > limit:
        # The size check short-circuits: nothing else about the devices is reported.
        return [fe.too_many("spec.devices", len(devices), limit)]
    per_device_nodes = spec.get("perDeviceNodeSelection") is True
    old_devices = {d.get("name"): d for d in (old or {}).get("devices") or []
                   if isinstance(d, dict)}
    errs: list[FieldError] = []
    seen: set[str] = set()
    for i, item in enumerate(devices):
        path = f"spec.devices[{i}]"
        device = as_map(item, path)
        errs.extend(_device(device, old_devices.get(device.get("name")), path, per_device_nodes))
    for i, device in enumerate(devices):
        name = device.get("name", "")
        if name in seen:
            errs.append(fe.duplicate(f"spec.devices[{i}]", name))
        seen.add(name)
    return errs


def _device(device: Obj, old: Obj | None, path: str, per_device_nodes: bool) -> list[FieldError]:
    errs = check_dns_label(get_str(device, "name", f"{path}.name") or "", f"{path}.name")
    attributes = get_map(device, "attributes", f"{path}.attributes") or {}
    capacity = get_map(device, "capacity", f"{path}.capacity") or {}
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        errs.append(fe.invalid(path, total, "the total number of attributes and capacities must "
                                            f"not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"))
    values = sum(_value_count(a) for a in attributes.values())
    if values > MAX_ATTRIBUTE_VALUES:
        errs.append(fe.invalid(path, values, "the total number of attribute values must not "
                                             f"exceed {MAX_ATTRIBUTE_VALUES}"))
    for key in sorted(attributes):
        errs.extend(_qualified_name(key, f"{path}.attributes"))
        key_path = f"{path}.attributes[{_truncate(key, ATTRIBUTE_KEY_TRUNCATE)}]"
        errs.extend(_attribute(as_map(attributes[key], key_path), key_path))
    multi = get_bool(device, "allowMultipleAllocations", path) is True
    if old is None or old.get("capacity") != device.get("capacity"):
        for key in sorted(capacity):
            errs.extend(_qualified_name(key, f"{path}.capacity"))
            key_path = f"{path}.capacity[{_truncate(key, ATTRIBUTE_KEY_TRUNCATE)}]"
            entry = as_map(capacity[key], key_path)
            if entry.get("requestPolicy") is not None and not multi:
                errs.append(fe.forbidden(f"{key_path}.requestPolicy",
                                         "allowMultipleAllocations must be true"))
            elif entry.get("requestPolicy") is not None:
                value, _ = quantity.parse(entry.get("value", "0"))
                errs.extend(_request_policy(as_map(entry["requestPolicy"], key_path), value,
                                            f"{key_path}.requestPolicy"))
    taints = get_list(device, "taints", f"{path}.taints") or []
    if len(taints) > MAX_TAINTS:
        errs.append(fe.too_many(f"{path}.taints", len(taints), MAX_TAINTS))
    elif old is None or old.get("taints") != device.get("taints"):
        for i, taint in enumerate(taints):
            errs.extend(validate_taint(as_map(taint, f"{path}.taints"), f"{path}.taints[{i}]"))
    errs.extend(_counter_lists(get_list(device, "consumesCounters", path) or [],
                               f"{path}.consumesCounters", name_field="counterSet",
                               max_entries=MAX_CONSUMPTIONS_PER_DEVICE,
                               max_counters=MAX_COUNTERS_PER_CONSUMPTION))
    errs.extend(_device_nodes(device, path, per_device_nodes))
    errs.extend(_binding_conditions(device, path))
    return errs


def _value_count(attribute: Any) -> int:
    if not isinstance(attribute, dict):
        return 1
    lists: list[list[Any]] = [v for k in _LISTS if isinstance(v := attribute.get(k), list)]
    total = sum(len(v) for v in lists)
    return total if total else 1


def _truncate(key: str, limit: int) -> str:
    limit = max(limit, 16)
    if len(key) <= limit:
        return key
    remaining = limit - 3
    return key[: (remaining + 1) // 2] + "..." + key[len(key) - remaining // 2:]


def _qualified_name(name: str, path: str) -> list[FieldError]:
    """Attribute/capacity keys: a C identifier, or ``<domain>/<C identifier>``."""
    parts = name.split("/")
    if len(parts) == 1:
        return _c_identifier(parts[0], path)
    if len(parts) > 2:
        return [fe.invalid(path, name, "must not contain more than one slash")]
    domain, ident = parts
    errs: list[FieldError] = []
    if not domain:
        errs.append(fe.invalid(path, "", "the domain must not be empty"))
    else:
        errs.extend(check_driver_name(domain, path))
    if not ident:
        errs.append(fe.invalid(path, "", "the name must not be empty"))
    else:
        errs.extend(_c_identifier(ident, path))
    return errs


def _c_identifier(ident: str, path: str) -> list[FieldError]:
    errs = []
    if len(ident) > MAX_ID_LENGTH:
        errs.append(fe.too_long(path, MAX_ID_LENGTH))
    errs.extend(fe.invalid(path, ident, m) for m in is_c_identifier(ident))
    return errs


def _attribute(attribute: Obj, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    present = [k for k in (*_SCALARS, *_LISTS) if attribute.get(k) is not None]
    if "bool" in present:
        get_bool(attribute, "bool", f"{path}.bool")
    if "int" in present:
        get_int(attribute, "int", f"{path}.int")
    if "string" in present:
        errs.extend(_string_value(get_str(attribute, "string", path) or "", f"{path}.string"))
    if "version" in present:
        errs.extend(_version_value(get_str(attribute, "version", path) or "", f"{path}.version"))
    for key in _LISTS:
        if key not in present:
            continue
        items = get_list(attribute, key, f"{path}.{key}") or []
        if not items:
            errs.append(fe.invalid(f"{path}.{key}", items, "must not be empty if specified"))
        for i, item in enumerate(items):
            if key == "strings":
                errs.extend(_string_value(str(item), f"{path}.strings[{i}]"))
            elif key == "versions":
                errs.extend(_version_value(str(item), f"{path}.versions[{i}]"))
    if not present:
        errs.append(fe.invalid(path, "", "exactly one value must be specified"))
    elif len(present) > 1:
        errs.append(fe.invalid(path, attribute, "exactly one value must be specified"))
    return errs


def _string_value(value: str, path: str) -> list[FieldError]:
    if len(value.encode()) > MAX_VALUE_LENGTH:
        return [fe.too_long(path, MAX_VALUE_LENGTH)]
    return []


def _version_value(value: str, path: str) -> list[FieldError]:
    errs = []
    if not SEMVER.match(value):
        errs.append(fe.invalid(path, value, "must be a string compatible with semver.org spec "
                                            "2.0.0"))
    if len(value.encode()) > MAX_VALUE_LENGTH:
        errs.append(fe.too_long(path, MAX_VALUE_LENGTH))
    return errs


def _q(raw: Any) -> Fraction | None:
    return None if raw is None else quantity.parse(raw)[0]


def _request_policy(policy: Obj, capacity: Fraction, path: str) -> list[FieldError]:
    """``validateRequestPolicy`` (validation.go): one kind of policy, within the capacity."""
    errs: list[FieldError] = []
    default = _q(policy.get("default"))
    values = policy.get("validValues") or []
    valid_range = policy.get("validRange")
    if values and valid_range is not None:
        return [fe.forbidden(path, 'exactly one policy can be specified, cannot specify '
                                   '"validValues" and "validRange" at the same time')]
    if values:
        vpath = f"{path}.validValues"
        if len(values) > MAX_VALID_VALUES:
            return [fe.too_many(vpath, len(values), MAX_VALID_VALUES)]
        seen: list[Fraction] = []
        for i, raw in enumerate(values):
            amount = quantity.parse(raw)[0]
            if seen and amount <= seen[-1]:
                errs.append(fe.invalid(f"{vpath}[{i}]", raw,
                                       "values must be sorted in ascending order"))
            if amount > capacity:
                errs.append(fe.invalid(f"{vpath}[{i}]", raw,
                                       "option is larger than capacity value"))
            seen.append(amount)
        if default is not None and default not in seen:
            errs.append(fe.invalid(f"{path}.default", str(default),
                                   "default value is not valid according to the requestPolicy"))
        return errs
    if valid_range is None:
        return errs
    rng = as_map(valid_range, f"{path}.validRange")
    rpath = f"{path}.validRange"
    minimum, maximum, step = _q(rng.get("min")), _q(rng.get("max")), _q(rng.get("step"))
    if minimum is None:
        return [fe.required(f"{rpath}.min")]
    if minimum > capacity:
        errs.append(fe.invalid(f"{rpath}.min", rng["min"], "min is larger than capacity value"))
    if default is not None and default < minimum:
        errs.append(fe.invalid(f"{path}.default", str(default), "default is less than min"))
    if maximum is not None:
        if maximum < minimum:
            errs.append(fe.invalid(f"{rpath}.max", rng["max"], "max is less than min"))
        if maximum > capacity:
            errs.append(fe.invalid(f"{rpath}.max", rng["max"],
                                   "max is larger than capacity value"))
        if default is not None and default > maximum:
            errs.append(fe.invalid(f"{path}.default", str(default), "default is more than max"))
    if step is None:
        return errs
    if step <= 0:
        return [*errs, fe.invalid(f"{rpath}.step", rng["step"], "step must be positive")]
    if minimum + step > capacity:
        errs.append(fe.invalid(f"{rpath}.step", rng["step"],
                               "one step is larger than capacity value"))
    if default is not None and (default - minimum) % step:
        errs.append(fe.invalid(f"{path}.default", str(default),
                               "default value is not valid according to the requestPolicy"))
    if maximum is not None and (maximum - minimum) % step:
        errs.append(fe.invalid(f"{rpath}.max", rng["max"],
                               "max is not valid according to the requestPolicy"))
    return errs


def _counter_map(counters: Obj, path: str, limit: int) -> list[FieldError]:
    if len(counters) > limit:
        return [fe.too_many(path, len(counters), limit)]
    errs: list[FieldError] = []
    for key in sorted(counters):
        errs.extend(check_dns_label(key, path))
        counter = as_map(counters[key], f"{path}[{_truncate(key, 63)}]")
        quantity.parse(counter.get("value", "0"))  # any parsable quantity is valid
    return errs


def _counter_lists(entries: list[Any], path: str, *, name_field: str, max_entries: int,
                   max_counters: int) -> list[FieldError]:
    """``sharedCounters`` (named by ``name``) and ``consumesCounters`` (by ``counterSet``):
    the same shape, checked alike, each with its own limits."""
    if len(entries) > max_entries:
        return [fe.too_many(path, len(entries), max_entries)]
    errs: list[FieldError] = []
    seen: set[str] = set()
    for i, item in enumerate(entries):
        entry_path = f"{path}[{i}]"
        entry = as_map(item, entry_path)
        name = get_str(entry, name_field, f"{entry_path}.{name_field}") or ""
        if not name:
            errs.append(fe.required(f"{entry_path}.{name_field}"))
        else:
            errs.extend(check_dns_label(name, f"{entry_path}.{name_field}"))
        counters = get_map(entry, "counters", f"{entry_path}.counters") or {}
        if not counters:
            errs.append(fe.required(f"{entry_path}.counters"))
        else:
            errs.extend(_counter_map(counters, f"{entry_path}.counters", max_counters))
    for i, entry in enumerate(entries):
        name = entry.get(name_field, "")
        if name in seen:
            errs.append(fe.duplicate(f"{path}[{i}]", name))
        seen.add(name)
    return errs


def _device_nodes(device: Obj, path: str, per_device_nodes: bool) -> list[FieldError]:
    fields = "`nodeName`, `nodeSelector`, or `allNodes`"
    node_name = get_str(device, "nodeName", f"{path}.nodeName")
    selector = get_map(device, "nodeSelector", f"{path}.nodeSelector")
    all_nodes = get_bool(device, "allNodes", f"{path}.allNodes")
    if not per_device_nodes:
        if node_name is not None or selector is not None or all_nodes is not None:
            return [fe.invalid(path, None, "`nodeName`, `nodeSelector` and `allNodes` can only "
                                           "be set if `perDeviceNodeSelection` is set to true in "
                                           "the ResourceSlice spec")]
        return []
    errs: list[FieldError] = []
    chosen = []
    if node_name is not None:
        if node_name:
            chosen.append("`nodeName`")
        else:
            errs.append(fe.invalid(f"{path}.nodeName", node_name, "must not be empty"))
    if selector is not None:
        chosen.append("`nodeSelector`")
        errs.extend(validate_node_selector(selector, f"{path}.nodeSelector"))
    if all_nodes is True:
        chosen.append("`allNodes`")
    elif all_nodes is False:
        errs.append(fe.invalid(f"{path}.allNodes", False, "must be either unset or set to true"))
    suffix = "is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec"
    if not chosen:
        errs.append(fe.required(path, f"exactly one of {fields} {suffix}"))
    elif len(chosen) > 1:
        errs.append(fe.invalid(path, "{" + ", ".join(chosen) + "}",
                               f"exactly one of {fields} {suffix}"))
    return errs


def _binding_conditions(device: Obj, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    conditions = get_list(device, "bindingConditions", path) or []
    failures = get_list(device, "bindingFailureConditions", path) or []
    for key, items in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        if len(items) > MAX_BINDING_CONDITIONS:
            errs.append(fe.too_many(f"{path}.{key}", len(items), MAX_BINDING_CONDITIONS))
            continue
        seen: set[str] = set()
        for i, item in enumerate(items):
            errs.extend(check_label_key(str(item), f"{path}.{key}[{i}]"))
            if item in seen:
                errs.append(fe.duplicate(f"{path}.{key}[{i}]", item))
            seen.add(item)
    for i, item in enumerate(failures):
        if item in conditions:
            errs.append(fe.invalid(f"{path}.bindingFailureConditions[{i}]", item,
                                   "bindingFailureConditions must not overlap with "
                                   "bindingConditions"))
    if failures and not conditions:
        errs.append(fe.invalid(f"{path}.bindingConditions", conditions,
                               "bindingConditions are required to use bindingFailureConditions"))
    if conditions and not failures:
        errs.append(fe.invalid(f"{path}.bindingFailureConditions", failures,
                               "bindingFailureConditions are required to use bindingConditions"))
    return errs
