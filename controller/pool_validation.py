"""Checks across the slices of one pool: what the client library and the scheduler check
(``k8s.io/dynamic-resource-allocation/resourceslice``), plus our own counter rule.

Each slice may be valid on its own and the pool still be skipped by the scheduler as invalid
or incomplete; the publisher runs these before it sends anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from gpudra.api import field_errors as fe
from gpudra.api.api_limits import DNS1123_LABEL_MAX_LENGTH
from gpudra.api.field_errors import FieldError
from gpudra.api.quantity import QuantityError, parse_quantity


def validate_pool(slices: Sequence[Mapping[str, Any]]) -> list[FieldError]:
    """Checks across the slices of one pool (client library, scheduler, and our own).

    Paths start with ``items[<i>]``, the slice's index in ``slices``. A pool that fails here is
    skipped by the scheduler as invalid or incomplete, even though each slice is accepted.
    """
    errors: list[FieldError] = []
    specs = [_spec_of(obj) for obj in slices]
    errors += _check_pool_identity(specs)
    devices = [
        (f"items[{i}].spec.devices[{j}]", device)
        for i, spec in enumerate(specs)
        for j, device in enumerate(_list_of(spec.get("devices")))
        if isinstance(device, Mapping)
    ]
    counter_sets = [
        (f"items[{i}].spec.sharedCounters[{j}]", counter_set)
        for i, spec in enumerate(specs)
        for j, counter_set in enumerate(_list_of(spec.get("sharedCounters")))
        if isinstance(counter_set, Mapping)
    ]
    errors += _first_wins(devices, "name")
    errors += _first_wins(counter_sets, "name")
    available = {
        counter_set["name"]: _counter_values(counter_set.get("counters"))
        for _, counter_set in reversed(counter_sets)  # the first definition wins
        if isinstance(counter_set.get("name"), str)
    }
    for path, device in devices:
        errors += _check_consumption(device, path, available)
    return errors


def _spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _mapping_of(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list_of(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _check_pool_identity(specs: Sequence[Mapping[str, Any]]) -> list[FieldError]:
    if not specs:
        return []
    errors: list[FieldError] = []
    pools = [_mapping_of(spec.get("pool")) for spec in specs]
    first_pool, first_spec = pools[0], specs[0]
    for i, (spec, pool) in enumerate(zip(specs, pools, strict=True)):
        if spec.get("driver") != first_spec.get("driver"):
            errors.append(fe.invalid(
                f"items[{i}].spec.driver", spec.get("driver"),
                f"must equal the driver of items[0] ({fe.render_value(first_spec.get('driver'))})",
            ))
        if pool.get("name") != first_pool.get("name"):
            errors.append(fe.invalid(
                f"items[{i}].spec.pool.name", pool.get("name"),
                f"must equal the pool of items[0] ({fe.render_value(first_pool.get('name'))})",
            ))
        if pool.get("generation") != first_pool.get("generation"):
            # The scheduler ignores every slice below the pool's highest generation.
            errors.append(fe.invalid(
                f"items[{i}].spec.pool.generation", pool.get("generation"),
                "must equal the generation of items[0] "
                f"({fe.render_value(first_pool.get('generation'))})",
            ))
        if pool.get("resourceSliceCount") != len(specs):
            # Otherwise the scheduler waits forever for a complete pool.
            errors.append(fe.invalid(
                f"items[{i}].spec.pool.resourceSliceCount", pool.get("resourceSliceCount"),
                f"must equal the number of slices in the pool ({len(specs)})",
            ))
    return errors


def _first_wins(entries: Sequence[tuple[str, Mapping[str, Any]]], key: str) -> list[FieldError]:
    """Duplicate names across the pool; each later entry names the first one."""
    first: dict[str, str] = {}
    errors = []
    for path, entry in entries:
        name = entry.get(key)
        if not isinstance(name, str):
            continue
        if name in first:
            errors.append(fe.duplicate(path, name, f"already defined at {first[name]}"))
        else:
            first[name] = path
    return errors


def _counter_values(raw: Any) -> dict[str, Fraction]:
    """Counter name → value, skipping entries ``validate_slice`` reports as malformed."""
    values = {}
    for name, counter in (raw.items() if isinstance(raw, Mapping) else ()):
        try:
            values[name] = parse_quantity(counter["value"])
        except (QuantityError, KeyError, TypeError):
            continue
    return values


def _check_consumption(
    device: Mapping[str, Any], path: str, available: Mapping[str, Mapping[str, Fraction]]
) -> list[FieldError]:
    errors: list[FieldError] = []
    for k, consumption in enumerate(_list_of(device.get("consumesCounters"))):
        if not isinstance(consumption, Mapping):
            continue
        entry_path = f"{path}.consumesCounters[{k}]"
        set_name = consumption.get("counterSet")
        if not isinstance(set_name, str) or set_name not in available:
            errors.append(fe.invalid(
                f"{entry_path}.counterSet", set_name,
                "must be the name of a counter set in the pool",
            ))
            continue
        counters = available[set_name]
        used = _mapping_of(consumption.get("counters"))
        for name in sorted(used):
            counter_path = fe.key_path(
                f"{entry_path}.counters", str(name), DNS1123_LABEL_MAX_LENGTH)
            if name not in counters:
                errors.append(fe.invalid(
                    counter_path, name, f"must be a counter of counter set {fe.go_quote(set_name)}"
                ))
                continue
            amount = _counter_values({name: used[name]}).get(name)
            if amount is not None and amount > counters[name]:
                errors.append(fe.invalid(
                    f"{counter_path}.value", used[name].get("value"),
                    f"must not exceed the counter's value in counter set {fe.go_quote(set_name)} "
                    f"({_fraction_text(counters[name])})",
                ))
    return errors


def _fraction_text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))
