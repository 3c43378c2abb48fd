"""Consumable capacity (KEP-5075) as the 1.36 scheduler computes it.

Mirrors ``CmpRequestOverCapacity`` and its helpers in
``k8s.io/dynamic-resource-allocation/structured``: for every capacity of a device, the
amount one allocation consumes is the request rounded up by the ``requestPolicy``
(``validRange``: ``min + ceil((req-min)/step)*step``, at least ``min``; ``validValues``: the
first value ≥ the request), or, when the request names no amount, the policy's ``default``
(no policy: the whole capacity value). The consumed amount must satisfy the policy (not past
``max``, on a step, one of the values) and, summed with what existing allocations and the
search's own picks consume, must not exceed the capacity value. A request for a capacity the
device does not have skips the device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpudra.api.quantity import QuantityError, format_quantity, parse_quantity

Amount = int | Fraction


def parse_amount(raw: Any) -> Amount | None:
    try:
        value = parse_quantity(str(raw))
    except QuantityError:
        return None
    return int(value) if value.denominator == 1 else value


def render(value: Amount) -> str:
    """A consumed amount as the apiserver prints a quantity (``20Gi``, ``33``, ``500m``)."""
    if value < 0:  # what is left of a capacity that existing shares already overdraw
        return "-" + render(-value)
    if isinstance(value, int) or value.denominator == 1:
        return format_quantity(int(value))
    return f"{math.ceil(value * 1000)}m"


@dataclass(frozen=True)
class Capacity:
    """One ``capacity.<name>`` of a device, with its ``requestPolicy`` (if any)."""

    value: Amount
    default: Amount | None = None
    minimum: Amount | None = None
    maximum: Amount | None = None
    step: Amount | None = None
    valid_values: tuple[Amount, ...] = ()
    has_policy: bool = False

    def consumed(self, requested: Amount | None) -> Amount:
        """``calculateConsumedCapacity``."""
        if requested is None:
            return self.default if self.default is not None else self.value
        if not self.has_policy:
            return requested
        if self.minimum is not None:
            if requested < self.minimum:
                return self.minimum
            if self.step is None:
                return requested
            steps = math.ceil(Fraction(requested - self.minimum) / Fraction(self.step))
            return _exact(self.minimum + steps * self.step)
        if self.valid_values:
            return next((v for v in self.valid_values if requested <= v), requested)
        return requested

    def violates(self, consumed: Amount) -> str | None:
        """``violatesPolicy``: why the consumed amount is not allowed, or None."""
        if not self.has_policy or (self.default is not None and consumed == self.default):
            return None
        if self.minimum is not None:
            if self.maximum is not None and consumed > self.maximum:
                return f"more than the policy's max {render(self.maximum)}"
            if self.step is not None and (consumed - self.minimum) % self.step:
                return f"not {render(self.minimum)} plus a multiple of {render(self.step)}"
            return None
        if self.valid_values and consumed not in self.valid_values:
            return "not one of " + ", ".join(render(v) for v in self.valid_values)
        return None


def _exact(value: Amount) -> Amount:
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value)
    return value


def device_capacities(raw: Mapping[str, Any]) -> dict[str, Capacity]:
    """A published device's ``capacity`` map, parsed (bad quantities count as 0)."""
    out: dict[str, Capacity] = {}
    for name, entry in (raw.get("capacity") or {}).items():
        if not isinstance(entry, Mapping):
            continue
        value = parse_amount(entry.get("value", "0")) or 0
        policy = entry.get("requestPolicy")
        if not isinstance(policy, Mapping):
            out[str(name)] = Capacity(value)
            continue
        valid_range = policy.get("validRange") or {}
        out[str(name)] = Capacity(
            value,
            default=_opt(policy.get("default")),
            minimum=_opt(valid_range.get("min")),
            maximum=_opt(valid_range.get("max")),
            step=_opt(valid_range.get("step")),
            valid_values=tuple(v for v in (parse_amount(x) for x in
                                           policy.get("validValues") or []) if v is not None),
            has_policy=True,
        )
    return out


def _opt(raw: Any) -> Amount | None:
    return None if raw is None else parse_amount(raw)


def request_amounts(capacity: Mapping[str, Any] | None) -> dict[str, Amount]:
    """A request's ``capacity.requests`` (unparsable amounts are left to API validation)."""
    requests = (capacity or {}).get("requests") or {}
    out: dict[str, Amount] = {}
    for name, raw in requests.items():
        value = parse_amount(raw)
        if value is not None:
            out[str(name)] = value
    return out


@dataclass(frozen=True)
class CapacityCheck:
    """The outcome of one capacity check: what the allocation would consume, or why not."""

    consumed: dict[str, Amount]
    reason: str = ""
    held: bool = False
    """The capacity is short because of existing allocations alone (not the search's picks)."""

    @property
    def fits(self) -> bool:
        return not self.reason


def check(device: str, driver: str, capacities: Mapping[str, Capacity], *,
          requested: Mapping[str, Amount], allocated: Mapping[str, Amount],
          allocating: Mapping[str, Amount]) -> CapacityCheck:
    """``CmpRequestOverCapacity`` for one device, with a reason users can act on."""
    # Names are matched as written: unlike attributes, the 1.36 allocator does not read
    # ``<driver>/memory`` as the device's ``memory`` (checked against dra-allocate).
    wanted = dict(requested)
    unknown = sorted(set(wanted) - set(capacities))
    if unknown:
        named = [f"{name} (it has {name.partition('/')[2]})"
                 if name.startswith(driver + "/") and name.partition("/")[2] in capacities
                 else name for name in unknown]
        return CapacityCheck({}, f"the device has no capacity {', '.join(named)}", held=True)
    consumed: dict[str, Amount] = {}
    for name in sorted(capacities):
        capacity = capacities[name]
        asked = wanted.get(name)
        amount = capacity.consumed(asked)
        why = capacity.violates(amount)
        if why is not None:
            shown = f"{name} {render(asked)}" if asked is not None else f"default {name}"
            if asked is not None and amount != asked:
                shown += f" (rounded up to {render(amount)})"
            return CapacityCheck({}, f"{shown} is {why}", held=True)
        used = allocated.get(name, 0)
        left = capacity.value - used
        if amount > left:
            asked_text = (f"you asked for {render(asked)}" if asked is not None else
                          f"a request without {name} takes the default {render(amount)}")
            if asked is not None and amount != asked:
                asked_text += f" (rounded to {render(amount)})"
            return CapacityCheck({}, f"{device} has {render(left)} of {name} left; {asked_text}",
                                 held=True)
        if amount > left - allocating.get(name, 0):
            return CapacityCheck({}, f"{device} has {render(left - allocating.get(name, 0))} "
                                     f"of {name} left after this pod's other shares; needs "
                                     f"{render(amount)}")
        consumed[name] = amount
    return CapacityCheck(consumed)


def add(total: dict[str, Amount], amounts: Mapping[str, Amount], sign: int = 1) -> None:
    for name, value in amounts.items():
        total[name] = _exact(total.get(name, 0) + sign * value)
