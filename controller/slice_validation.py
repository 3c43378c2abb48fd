"""Check ResourceSlice objects (plain JSON-shaped dicts) locally, the way the apiserver would.

This module is a faithful copy of the apiserver's ResourceSlice rules, not our own design:
``validate_slice`` mirrors ``ValidateResourceSlice`` in kubernetes/kubernetes
``pkg/apis/resource/validation/validation.go`` (read at ``009801d9``), with the limits of
``k8s.io/api/resource/v1`` (``api_limits``), apimachinery's name formats (``name_formats``)
and its field errors (``field_errors``). The release it mirrors is
``api_limits.KUBERNETES_VERSION``, the one place to change when following a newer apiserver.
Same field paths, error types, details and order; a difference from the apiserver is a bug
here. It is one file because it is one Go function's worth of rules, in Go's order.

Everything a publisher sends goes through here first, so a bad slice fails in our process with
the apiserver's own words instead of as a 422 in a retry loop. Map entries are checked in
sorted key order (Go iterates maps randomly). As in Go, key errors are reported on the map
itself with the offending key (or key part) as the value, and value errors on ``map[key]``.
A few checks the apiserver does while decoding JSON (wrong JSON types, unparsable quantities,
int64 range) are reported here as field errors too, since dicts have no decoder in front of
them.

``ensure_valid`` adds the checks across one pool (``pool_validation``): what the client
library and the scheduler check, plus our own rule that no device may consume more of a
counter than the counter holds.

The fake API server (``gpudra.testing.fakeapi``) has its own, independently written copy of
these rules; ``tests/fakeapi/test_validators_agree.py`` runs both on the same slices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Final

from gpudra.api import field_errors as fe
from gpudra.api.api_limits import (
    ATTRIBUTE_AND_CAPACITY_MAX_KEY_LENGTH,
    BINDING_CONDITIONS_MAX_SIZE,
    BINDING_FAILURE_CONDITIONS_MAX_SIZE,
    CAPACITY_REQUEST_POLICY_DISCRETE_MAX_OPTIONS,
    DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH,
    DEVICE_MAX_ID_LENGTH,
    DEVICE_TAINTS_MAX_LENGTH,
    DNS1123_LABEL_MAX_LENGTH,
    DRIVER_NAME_MAX_LENGTH,
    POOL_NAME_MAX_LENGTH,
    RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE,
    RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
    RESOURCE_SLICE_MAX_COUNTER_SETS,
    RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET,
    RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION,
    RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE,
    RESOURCE_SLICE_MAX_DEVICES,
    RESOURCE_SLICE_MAX_DEVICES_WITH_ADVANCED_FEATURES,
)
from gpudra.api.field_errors import FieldError, format_invalid
from gpudra.api.name_formats import (
    SEMVER_MSG,
    SEMVER_RE,
    c_identifier_errors,
    dns1123_label_errors,
    dns1123_subdomain_errors,
    label_key_errors,
    label_value_errors,
    nbytes,
)
from gpudra.api.quantity import QuantityError, parse_quantity
from gpudra.controller.pool_validation import validate_pool

TAINT_EFFECTS: Final = ("NoExecute", "NoSchedule", "None")
"""Sorted, as ``sets.List`` renders them in the apiserver's "supported values"."""

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


class SliceValidationError(Exception):
    """Slices that the apiserver or the scheduler would reject; ``errors`` holds every problem.

    Field paths in ``errors`` are prefixed with ``items[<i>].`` (the slice's index in the list
    given to ``ensure_valid``); the message quotes each slice the way the apiserver would.
    """

    def __init__(self, message: str, errors: Sequence[FieldError]) -> None:
        super().__init__(message)
        self.errors: tuple[FieldError, ...] = tuple(errors)


def ensure_valid(slices: Sequence[Mapping[str, Any]]) -> None:
    """Raise ``SliceValidationError`` unless every slice and the pool they form are valid."""
    all_errors: list[FieldError] = []
    lines: list[str] = []
    for i, obj in enumerate(slices):
        errors = validate_slice(obj)
        if errors:
            lines.append(format_invalid(_slice_name(obj), errors))
            all_errors += [dataclasses.replace(e, field=f"items[{i}].{e.field}") for e in errors]
    pool_errors = validate_pool(slices)
    if pool_errors:
        pool = _pool_name(slices[0]) if slices else ""
        lines.append(format_invalid(pool, pool_errors, kind="ResourceSlice pool"))
        all_errors += pool_errors
    if all_errors:
        raise SliceValidationError("\n".join(lines), all_errors)


def _dns_label(value: str, path: str) -> list[FieldError]:
    return [fe.invalid(path, value, msg) for msg in dns1123_label_errors(value)]


def _dns_subdomain(value: str, path: str) -> list[FieldError]:
    return [fe.invalid(path, value, msg) for msg in dns1123_subdomain_errors(value)]


def _driver_name(name: str, path: str) -> list[FieldError]:
    """``ValidateCSIDriverName``, which DRA reuses for driver names and attribute domains."""
    if not name:
        return [fe.required(path)]
    errors = []
    if nbytes(name) > DRIVER_NAME_MAX_LENGTH:
        errors.append(fe.too_long(path, DRIVER_NAME_MAX_LENGTH))
    # Upper case is tolerated here for CSI compatibility; drivers should still use lower case.
    errors += [fe.invalid(path, name, msg) for msg in dns1123_subdomain_errors(name.lower())]
    return errors


def _c_identifier(ident: str, path: str) -> list[FieldError]:
    errors = []
    if nbytes(ident) > DEVICE_MAX_ID_LENGTH:
        errors.append(fe.too_long(path, DEVICE_MAX_ID_LENGTH))
    errors += [fe.invalid(path, ident, msg) for msg in c_identifier_errors(ident)]
    return errors


def _qualified_name(name: str, path: str) -> list[FieldError]:
    """Attribute and capacity keys: ``<C identifier>`` or ``<domain>/<C identifier>``."""
    parts = name.split("/")
    if len(parts) == 1:
        return _c_identifier(name, path)
    if len(parts) > 2:
        return [fe.invalid(path, name, "must not contain more than one slash")]
    domain, ident = parts
    errors = []
    if not domain:
        errors.append(fe.invalid(path, "", "the domain must not be empty"))
    else:
        errors += _driver_name(domain, path)
    if not ident:
        errors.append(fe.invalid(path, "", "the name must not be empty"))
    else:
        errors += _c_identifier(ident, path)
    return errors


def _label_name(value: str, path: str) -> list[FieldError]:
    return [fe.invalid(path, value, msg) for msg in label_key_errors(value)]


def _label_value(value: str, path: str) -> list[FieldError]:
    return [fe.invalid(path, value, msg) for msg in label_value_errors(value)]


# --- JSON-shape helpers ---------------------------------------------------------------------


def _is_set(mapping: Mapping[str, Any], key: str) -> bool:
    """A field counts as set when present and not null (Go: a non-nil pointer or slice)."""
    return mapping.get(key) is not None


def _as_mapping(value: Any, path: str, errors: list[FieldError]) -> Mapping[str, Any] | None:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    errors.append(fe.invalid(path, value, "must be an object"))
    return None


def _as_list(value: Any, path: str, errors: list[FieldError]) -> list[Any] | None:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    errors.append(fe.invalid(path, value, "must be a list"))
    return None


def _as_str(value: Any, path: str, errors: list[FieldError]) -> str | None:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    errors.append(fe.invalid(path, value, "must be a string"))
    return None


def _as_int(value: Any, path: str, errors: list[FieldError]) -> int | None:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
        errors.append(fe.invalid(path, value, "must fit in a 64-bit signed integer"))
        return None
    errors.append(fe.invalid(path, value, "must be an integer"))
    return None


def _quantity(value: Any, path: str, errors: list[FieldError]) -> Fraction | None:
    """A ``{"value": <quantity>}`` entry; unparsable quantities fail JSON decoding upstream."""
    entry = _as_mapping(value, path, errors)
    if entry is None:
        return None
    raw = entry.get("value")
    if raw is None:
        errors.append(fe.required(f"{path}.value"))
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        errors.append(fe.invalid(f"{path}.value", raw, "must be a quantity string"))
        return None
    try:
        amount: Fraction = parse_quantity(raw)
    except QuantityError:
        errors.append(fe.invalid(
            f"{path}.value", raw,
            "quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ))
        return None
    return amount


def _slice_name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else ""


def _pool_name(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec")
    pool = spec.get("pool") if isinstance(spec, Mapping) else None
    name = pool.get("name") if isinstance(pool, Mapping) else None
    return name if isinstance(name, str) else ""


# --- ResourceSlice ----------------------------------------------------------------------------


def validate_slice(obj: Mapping[str, Any]) -> list[FieldError]:
    """Every check ``ValidateResourceSlice`` makes on create, in the apiserver's order."""
    errors: list[FieldError] = []
    metadata = _as_mapping(obj.get("metadata"), "metadata", errors)
    if metadata is not None:
        errors += _validate_metadata(metadata)
    spec = _as_mapping(obj.get("spec"), "spec", errors)
    if spec is not None:
        errors += _validate_spec(spec, "spec")
    return errors


def _validate_metadata(metadata: Mapping[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    name = _as_str(metadata.get("name"), "metadata.name", errors)
    generate_name = _as_str(metadata.get("generateName"), "metadata.generateName", errors)
    if name:
        errors += _dns_subdomain(name, "metadata.name")
    elif name is not None and generate_name is not None:
        if not generate_name:
            errors.append(fe.required("metadata.name", "name or generateName is required"))
        else:
            # A prefix may end in "-": the apiserver masks it before checking the format.
            masked = generate_name[:-1] + "a" if generate_name.endswith("-") else generate_name
            errors += [
                fe.invalid("metadata.generateName", generate_name, msg)
                for msg in dns1123_subdomain_errors(masked)
            ]
    return errors


_NODE_FIELDS: Final = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")


def _validate_spec(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    driver = _as_str(spec.get("driver"), f"{path}.driver", errors)
    if driver is not None:
        errors += _driver_name(driver, f"{path}.driver")
    pool = _as_mapping(spec.get("pool"), f"{path}.pool", errors)
    if pool is not None:
        errors += _validate_pool_ref(pool, f"{path}.pool")
    errors += _validate_node_selection(spec, path)

    if _is_set(spec, "sharedCounters") and _is_set(spec, "devices"):
        errors.append(fe.invalid(path, "", "only one of `sharedCounters` or `devices` is allowed"))

    devices = _as_list(spec.get("devices"), f"{path}.devices", errors)
    if devices is not None:
        errors += _validate_devices(devices, spec.get("perDeviceNodeSelection") is True, path)
    counter_sets = _as_list(spec.get("sharedCounters"), f"{path}.sharedCounters", errors)
    if counter_sets is not None:
        errors += _validate_counter_lists(
            counter_sets, f"{path}.sharedCounters", name_field="name",
            max_entries=RESOURCE_SLICE_MAX_COUNTER_SETS,
            max_counters=RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET,
        )
    return errors


def _validate_pool_ref(pool: Mapping[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    name = _as_str(pool.get("name"), f"{path}.name", errors)
    if name == "":
        errors.append(fe.required(f"{path}.name"))
    elif name is not None:
        if nbytes(name) > POOL_NAME_MAX_LENGTH:
            errors.append(fe.too_long(f"{path}.name", POOL_NAME_MAX_LENGTH))
        for part in name.split("/"):
            errors += _dns_subdomain(part, f"{path}.name")
    count = _as_int(pool.get("resourceSliceCount"), f"{path}.resourceSliceCount", errors)
    if count is not None and count <= 0:
        errors.append(fe.invalid(f"{path}.resourceSliceCount", count, "must be greater than zero"))
    generation = _as_int(pool.get("generation"), f"{path}.generation", errors)
    if generation is not None and generation < 0:
        errors.append(
            fe.invalid(f"{path}.generation", generation, "must be greater than or equal to zero")
        )
    return errors


def _validate_node_selection(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    chosen: list[str] = []
    node_name = spec.get("nodeName")
    if node_name is not None:
        if node_name == "":
            errors.append(fe.invalid(
                f"{path}.nodeName", "", "must be either unset or set to a non-empty string"
            ))
        elif isinstance(node_name, str):
            chosen.append("`nodeName`")
            errors += _dns_subdomain(node_name, f"{path}.nodeName")
        else:
            errors.append(fe.invalid(f"{path}.nodeName", node_name, "must be a string"))
    selector = spec.get("nodeSelector")
    if selector is not None:
        chosen.append("`nodeSelector`")
        terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
        if not isinstance(terms, list) or len(terms) != 1:
            # One term keeps merging selectors of devices from different slices simple.
            errors.append(fe.invalid(
                f"{path}.nodeSelector.nodeSelectorTerms", terms,
                "must have exactly one node selector term",
            ))
    for field in ("allNodes", "perDeviceNodeSelection"):
        value = spec.get(field)
        if value is True:
            chosen.append(f"`{field}`")
        elif value is not None:
            errors.append(
                fe.invalid(f"{path}.{field}", value, "must be either unset or set to true")
            )
    expected = "exactly one of " + ", ".join(f"`{field}`" for field in _NODE_FIELDS)
    if not chosen:
        errors.append(fe.required(path, f"{expected} is required"))
    elif len(chosen) > 1:
        chosen_text = "{" + ", ".join(chosen) + "}"
        errors.append(
            fe.invalid(path, chosen_text, f"{expected} is required, but multiple fields are set")
        )
    return errors


# --- devices ---------------------------------------------------------------------------------

_SCALAR_FIELDS: Final = ("bool", "int", "string", "version")
_LIST_FIELDS: Final = ("bools", "ints", "strings", "versions")


def uses_advanced_features(device: Mapping[str, Any]) -> bool:
    """Whether a device lowers its slice's device limit to 64 (taints, counters, list values)."""
    if device.get("taints") or device.get("consumesCounters"):
        return True
    attributes = device.get("attributes")
    if not isinstance(attributes, Mapping):
        return False
    return any(
        isinstance(value, Mapping) and any(value.get(f) is not None for f in _LIST_FIELDS)
        for value in attributes.values()
    )


def _validate_devices(
    devices: list[Any], per_device_node_selection: bool, spec_path: str
) -> list[FieldError]:
    path = f"{spec_path}.devices"
    advanced = any(isinstance(d, Mapping) and uses_advanced_features(d) for d in devices)
    limit = RESOURCE_SLICE_MAX_DEVICES
    if advanced:
        limit = RESOURCE_SLICE_MAX_DEVICES_WITH_ADVANCED_FEATURES
    if len(devices) > limit:
        # Like the apiserver: report the count only, nothing per device (DoS protection).
        return [fe.too_many(path, len(devices), limit)]
    errors: list[FieldError] = []
    names: list[Any] = []
    for i, raw in enumerate(devices):
        device = _as_mapping(raw, f"{path}[{i}]", errors)
        names.append(device.get("name") if device is not None else None)
        if device is not None:
            errors += _validate_device(device, f"{path}[{i}]", per_device_node_selection)
    errors += _duplicates(names, path)
    return errors


def _duplicates(keys: Sequence[Any], path: str) -> list[FieldError]:
    seen: set[Any] = set()
    errors = []
    for i, key in enumerate(keys):
        if key is None or not isinstance(key, str):
            continue
        if key in seen:
            errors.append(fe.duplicate(f"{path}[{i}]", key))
        seen.add(key)
    return errors


def _validate_device(
    device: Mapping[str, Any], path: str, per_device_node_selection: bool
) -> list[FieldError]:
    errors: list[FieldError] = []
    name = _as_str(device.get("name"), f"{path}.name", errors)
    if name == "":
        errors.append(fe.required(f"{path}.name"))
    elif name is not None:
        errors += _dns_label(name, f"{path}.name")

    attributes = _as_mapping(device.get("attributes"), f"{path}.attributes", errors)
    capacity = _as_mapping(device.get("capacity"), f"{path}.capacity", errors)
    attributes = attributes or {}
    capacity = capacity or {}
    total = len(attributes) + len(capacity)
    if total > RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
        errors.append(fe.invalid(
            path, total, "the total number of attributes and capacities must not exceed "
            f"{RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE}",
        ))
    values = sum(_count_values(value) for value in attributes.values())
    if values > RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE:
        errors.append(fe.invalid(
            path, values, "the total number of attribute values must not exceed "
            f"{RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE}",
        ))

    for key in sorted(attributes):
        errors += _map_key(key, f"{path}.attributes", _qualified_name)
        key_path = fe.key_path(
            f"{path}.attributes", str(key), ATTRIBUTE_AND_CAPACITY_MAX_KEY_LENGTH)
        errors += _validate_attribute(attributes[key], key_path)
    multi = device.get("allowMultipleAllocations") is True
    for key in sorted(capacity):
        errors += _map_key(key, f"{path}.capacity", _qualified_name)
        key_path = fe.key_path(f"{path}.capacity", str(key), ATTRIBUTE_AND_CAPACITY_MAX_KEY_LENGTH)
        errors += _validate_capacity(capacity[key], key_path, multi)

    taints = _as_list(device.get("taints"), f"{path}.taints", errors)
    if taints is not None:
        errors += _validate_taints(taints, f"{path}.taints")
    consumptions = _as_list(device.get("consumesCounters"), f"{path}.consumesCounters", errors)
    if consumptions is not None:
        errors += _validate_counter_lists(
            consumptions, f"{path}.consumesCounters", name_field="counterSet",
            max_entries=RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE,
            max_counters=RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION,
        )
    errors += _validate_device_nodes(device, path, per_device_node_selection)
    errors += _validate_binding_conditions(device, path)
    return errors


def _map_key(key: object, path: str, check: Any) -> list[FieldError]:
    if not isinstance(key, str):
        return [fe.invalid(path, key, "keys must be strings")]
    result: list[FieldError] = check(key, path)
    return result


def _count_values(value: Any) -> int:
    """A scalar counts once, a list value by its length (``numEntriesDeviceAttribute``)."""
    if not isinstance(value, Mapping):
        return 1
    listed = sum(len(value[f]) for f in _LIST_FIELDS if isinstance(value.get(f), list | tuple))
    return listed or 1


def _validate_attribute(raw: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    attribute = _as_mapping(raw, path, errors)
    if attribute is None:
        return errors
    set_fields = [f for f in (*_SCALAR_FIELDS, *_LIST_FIELDS) if attribute.get(f) is not None]
    for field in set_fields:
        value = attribute[field]
        field_path = f"{path}.{field}"
        if field in _SCALAR_FIELDS:
            errors += _validate_scalar(field, value, field_path)
            continue
        items = _as_list(value, field_path, errors)
        if items is None:
            continue
        if not items:
            errors.append(fe.invalid(field_path, items, "must not be empty if specified"))
        for j, item in enumerate(items):
            errors += _validate_scalar(field[:-1], item, f"{field_path}[{j}]")
    if not set_fields:
        errors.append(fe.invalid(path, "", "exactly one value must be specified"))
    elif len(set_fields) > 1:
        errors.append(fe.invalid(path, dict(attribute), "exactly one value must be specified"))
    return errors


def _validate_scalar(kind: str, value: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if kind == "bool":
        if not isinstance(value, bool):
            errors.append(fe.invalid(path, value, "must be a boolean"))
    elif kind == "int":
        _as_int(value, path, errors)
    else:
        text = _as_str(value, path, errors)
        if text is not None:
            if kind == "version" and not SEMVER_RE.fullmatch(text):
                errors.append(fe.invalid(path, text, SEMVER_MSG))
            if nbytes(text) > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH:
                errors.append(fe.too_long(path, DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH))
    return errors


def _validate_capacity(raw: Any, path: str, allow_multiple_allocations: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    value = _quantity(raw, path, errors)
    policy = raw.get("requestPolicy") if isinstance(raw, Mapping) else None
    if policy is not None and not allow_multiple_allocations:
        errors.append(
            fe.forbidden(f"{path}.requestPolicy", "allowMultipleAllocations must be true"))
    elif policy is not None and value is not None:
        errors += _validate_request_policy(policy, value, f"{path}.requestPolicy")
    return errors


def _policy_quantity(raw: Any, path: str, errors: list[FieldError]) -> Fraction | None:
    """A bare quantity inside a ``requestPolicy`` (``default``, ``min`` …); None when unset."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        errors.append(fe.invalid(path, raw, "must be a quantity string"))
        return None
    try:
        amount: Fraction = parse_quantity(raw)
    except QuantityError:
        errors.append(fe.invalid(path, raw, "quantities must match the regular expression "
                                            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"))
        return None
    return amount


def _validate_request_policy(raw: Any, capacity: Fraction, path: str) -> list[FieldError]:
    """``validateRequestPolicy``: one of ``validValues`` / ``validRange``, both within the
    capacity value, and a ``default`` the policy itself allows."""
    errors: list[FieldError] = []
    policy = _as_mapping(raw, path, errors)
    if policy is None:
        return errors
    default = _policy_quantity(policy.get("default"), f"{path}.default", errors)
    values = _as_list(policy.get("validValues"), f"{path}.validValues", errors) or []
    valid_range = (None if policy.get("validRange") is None else
                   _as_mapping(policy["validRange"], f"{path}.validRange", errors))
    if values and valid_range is not None:
        errors.append(fe.forbidden(path, 'exactly one policy can be specified, cannot specify '
                                         '"validValues" and "validRange" at the same time'))
    elif values:
        errors += _validate_valid_values(values, default, capacity, path)
    elif valid_range is not None:
        errors += _validate_valid_range(valid_range, default, capacity, path)
    return errors


def _validate_valid_values(values: list[Any], default: Fraction | None, capacity: Fraction,
                           path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    vpath = f"{path}.validValues"
    if len(values) > CAPACITY_REQUEST_POLICY_DISCRETE_MAX_OPTIONS:
        errors.append(fe.too_many(vpath, len(values), CAPACITY_REQUEST_POLICY_DISCRETE_MAX_OPTIONS))
        return errors
    parsed: list[Fraction] = []
    for i, raw in enumerate(values):
        amount = _policy_quantity(raw, f"{vpath}[{i}]", errors)
        if amount is None:
            continue
        if parsed and amount <= parsed[-1]:
            errors.append(fe.invalid(f"{vpath}[{i}]", raw,
                                     "values must be sorted in ascending order"))
        if amount > capacity:
            errors.append(fe.invalid(f"{vpath}[{i}]", raw, "option is larger than capacity value"))
        parsed.append(amount)
    if default is not None and default not in parsed:
        errors.append(fe.invalid(f"{path}.default", str(default),
                                 "default value is not valid according to the requestPolicy"))
    return errors


def _validate_valid_range(valid_range: Mapping[str, Any], default: Fraction | None,
                          capacity: Fraction, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    rpath = f"{path}.validRange"
    minimum = _policy_quantity(valid_range.get("min"), f"{rpath}.min", errors)
    maximum = _policy_quantity(valid_range.get("max"), f"{rpath}.max", errors)
    step = _policy_quantity(valid_range.get("step"), f"{rpath}.step", errors)
    if valid_range.get("min") is None:
        errors.append(fe.required(f"{rpath}.min"))
        return errors
    if minimum is None:
        return errors
    if minimum > capacity:
        errors.append(fe.invalid(f"{rpath}.min", valid_range["min"],
                                 "min is larger than capacity value"))
    if default is not None and default < minimum:
        errors.append(fe.invalid(f"{path}.default", str(default), "default is less than min"))
    if maximum is not None:
        if maximum < minimum:
            errors.append(fe.invalid(f"{rpath}.max", valid_range["max"], "max is less than min"))
        if maximum > capacity:
            errors.append(fe.invalid(f"{rpath}.max", valid_range["max"],
                                     "max is larger than capacity value"))
        if default is not None and default > maximum:
            errors.append(fe.invalid(f"{path}.default", str(default), "default is more than max"))
    if step is None:
        return errors
    if step <= 0:
        errors.append(fe.invalid(f"{rpath}.step", valid_range["step"], "step must be positive"))
        return errors
    if minimum + step > capacity:
        errors.append(fe.invalid(f"{rpath}.step", valid_range["step"],
                                 "one step is larger than capacity value"))
    if default is not None and (default - minimum) % step != 0:
        errors.append(fe.invalid(f"{path}.default", str(default),
                                 "default value is not valid according to the requestPolicy"))
    if maximum is not None and (maximum - minimum) % step != 0:
        errors.append(fe.invalid(f"{rpath}.max", valid_range["max"],
                                 "max is not valid according to the requestPolicy"))
    return errors


def _validate_taints(taints: list[Any], path: str) -> list[FieldError]:
    if len(taints) > DEVICE_TAINTS_MAX_LENGTH:
        return [fe.too_many(path, len(taints), DEVICE_TAINTS_MAX_LENGTH)]
    errors: list[FieldError] = []
    for i, raw in enumerate(taints):
        taint = _as_mapping(raw, f"{path}[{i}]", errors)
        if taint is None:
            continue
        key = _as_str(taint.get("key"), f"{path}[{i}].key", errors)
        if key is not None:
            errors += _label_name(key, f"{path}[{i}].key")
        value = _as_str(taint.get("value"), f"{path}[{i}].value", errors)
        if value:
            errors += _label_value(value, f"{path}[{i}].value")
        effect = taint.get("effect")
        if effect is None or effect == "":
            errors.append(fe.required(f"{path}[{i}].effect"))
        elif effect not in TAINT_EFFECTS:
            errors.append(fe.not_supported(f"{path}[{i}].effect", effect, TAINT_EFFECTS))
    return errors


def _validate_device_nodes(
    device: Mapping[str, Any], path: str, per_device_node_selection: bool
) -> list[FieldError]:
    fields = [f for f in ("nodeName", "nodeSelector", "allNodes") if _is_set(device, f)]
    if not per_device_node_selection:
        if fields:
            return [fe.invalid(
                path, None, "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
                "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
            )]
        return []
    errors: list[FieldError] = []
    chosen = []
    for field in fields:
        value = device[field]
        if field == "nodeName":
            if value == "" or not isinstance(value, str):
                errors.append(fe.invalid(f"{path}.nodeName", value, "must not be empty"))
                continue
            errors += _dns_subdomain(value, f"{path}.nodeName")
        elif field == "allNodes" and value is not True:
            errors.append(
                fe.invalid(f"{path}.allNodes", value, "must be either unset or set to true")
            )
            continue
        chosen.append(f"`{field}`")
    detail = (
        "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
        "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
    )
    if not chosen:
        errors.append(fe.required(path, detail))
    elif len(chosen) > 1:
        errors.append(fe.invalid(path, "{" + ", ".join(chosen) + "}", detail))
    return errors


def _validate_binding_conditions(device: Mapping[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    lists = {}
    for field, limit in (
        ("bindingConditions", BINDING_CONDITIONS_MAX_SIZE),
        ("bindingFailureConditions", BINDING_FAILURE_CONDITIONS_MAX_SIZE),
    ):
        items = _as_list(device.get(field), f"{path}.{field}", errors) or []
        lists[field] = items
        if len(items) > limit:
            errors.append(fe.too_many(f"{path}.{field}", len(items), limit))
            continue
        for j, item in enumerate(items):
            text = _as_str(item, f"{path}.{field}[{j}]", errors)
            if text is not None:
                errors += _label_name(text, f"{path}.{field}[{j}]")
    conditions, failures = lists["bindingConditions"], lists["bindingFailureConditions"]
    if not conditions and failures:
        errors.append(fe.invalid(
            f"{path}.bindingConditions", conditions,
            "bindingConditions are required to use bindingFailureConditions",
        ))
    if conditions and not failures:
        errors.append(fe.invalid(
            f"{path}.bindingFailureConditions", failures,
            "bindingFailureConditions are required to use bindingConditions",
        ))
    return errors


# --- counters --------------------------------------------------------------------------------


def _validate_counter_lists(
    entries: list[Any], path: str, *, name_field: str, max_entries: int, max_counters: int
) -> list[FieldError]:
    """``sharedCounters`` of a slice (named by ``name``) and ``consumesCounters`` of a device
    (named by ``counterSet``): the same shape, checked alike, with their own limits."""
    if len(entries) > max_entries:
        return [fe.too_many(path, len(entries), max_entries)]
    errors: list[FieldError] = []
    names: list[Any] = []
    for i, raw in enumerate(entries):
        entry = _as_mapping(raw, f"{path}[{i}]", errors)
        names.append(entry.get(name_field) if entry is not None else None)
        if entry is None:
            continue
        errors += _required_label(entry.get(name_field), f"{path}[{i}].{name_field}")
        errors += _validate_counters(entry.get("counters"), f"{path}[{i}].counters", max_counters)
    errors += _duplicates(names, path)
    return errors


def _required_label(value: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    name = _as_str(value, path, errors)
    if name == "":
        errors.append(fe.required(path))
    elif name is not None:
        errors += _dns_label(name, path)
    return errors


def _validate_counters(raw: Any, path: str, limit: int) -> list[FieldError]:
    errors: list[FieldError] = []
    counters = _as_mapping(raw, path, errors)
    if counters is None:
        return errors
    if not counters:
        return [fe.required(path)]
    if len(counters) > limit:
        return [fe.too_many(path, len(counters), limit)]
    for name in sorted(counters):
        errors += _map_key(name, path, _dns_label)
        _quantity(counters[name], fe.key_path(path, str(name), DNS1123_LABEL_MAX_LENGTH), errors)
    return errors


