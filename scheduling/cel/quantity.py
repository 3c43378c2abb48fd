"""The Kubernetes CEL ``Quantity`` library: ``quantity()``, ``isQuantity()`` and its methods.

Mirrors ``k8s.io/apiserver/pkg/cel/library/quantity.go``: quantities are opaque values that
compare by value (``quantity("1Gi") == quantity("1024Mi")``), have no operators besides
``==``/``!=`` and are combined through methods (``add``, ``sub``, ``compareTo`` …).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from celpy import celtypes

from gpudra.api.quantity import QuantityError, format_quantity, parse_quantity
from gpudra.scheduling.cel.errors import cel_error

# The wording of resource.ErrFormatWrong, which is what users see from the scheduler.
FORMAT_ERROR = (
    "quantities must match the regular expression "
    "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_SHAPE = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class Quantity:
    """An exact quantity value; ``text`` keeps how it was written, for messages."""

    __slots__ = ("text", "value")

    def __init__(self, value: Fraction, text: str | None = None) -> None:
        self.value = value
        self.text = text if text is not None else format_fraction(value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value == other.value
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


def format_fraction(value: Fraction) -> str:
    """A readable canonical form: ``80Gi``, ``1500m``, ``-2``."""
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    if magnitude.denominator == 1:
        return sign + format_quantity(int(magnitude))
    for suffix, scale in (("m", 10**3), ("u", 10**6), ("n", 10**9)):
        scaled = magnitude * scale
        if scaled.denominator == 1:
            return f"{sign}{scaled.numerator}{suffix}"
    return sign + str(float(magnitude))


def parse(text: str) -> Quantity:
    """Parse like ``resource.ParseQuantity``; raises ``ValueError`` with its wording."""
    if not isinstance(text, str) or not _SHAPE.match(text):
        raise ValueError(FORMAT_ERROR)
    try:
        return Quantity(parse_quantity(text), text)
    except QuantityError:
        raise ValueError("unable to parse quantity's suffix") from None


def quantity(text: Any) -> Any:
    if not isinstance(text, str):
        return cel_error("no such overload: quantity() takes a string")
    try:
        return parse(text)
    except ValueError as exc:
        return cel_error(str(exc))


def is_quantity(text: Any) -> Any:
    if not isinstance(text, str):
        return cel_error("no such overload: isQuantity() takes a string")
    try:
        parse(text)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _operand(name: str, other: Any) -> Fraction | Any:
    if isinstance(other, Quantity):
        return other.value
    if isinstance(other, celtypes.IntType):
        return Fraction(int(other))
    return cel_error(f"no such overload: Quantity.{name}({type(other).__name__})")


def _compare(q: Quantity, other: Any, name: str) -> int | Any:
    if not isinstance(other, Quantity):
        return cel_error(f"no such overload: Quantity.{name}() takes a Quantity")
    return (q.value > other.value) - (q.value < other.value)


def compare_to(q: Quantity, other: Any) -> Any:
    result = _compare(q, other, "compareTo")
    return celtypes.IntType(result) if isinstance(result, int) else result


def is_greater_than(q: Quantity, other: Any) -> Any:
    result = _compare(q, other, "isGreaterThan")
    return celtypes.BoolType(result > 0) if isinstance(result, int) else result


def is_less_than(q: Quantity, other: Any) -> Any:
    result = _compare(q, other, "isLessThan")
    return celtypes.BoolType(result < 0) if isinstance(result, int) else result


def add(q: Quantity, other: Any) -> Any:
    value = _operand("add", other)
    return Quantity(q.value + value) if isinstance(value, Fraction) else value


def sub(q: Quantity, other: Any) -> Any:
    value = _operand("sub", other)
    return Quantity(q.value - value) if isinstance(value, Fraction) else value


def _as_int64(q: Quantity) -> int | None:
    if q.value.denominator != 1 or not _INT64_MIN <= q.value.numerator <= _INT64_MAX:
        return None
    return q.value.numerator


def as_integer(q: Quantity) -> Any:
    value = _as_int64(q)
    if value is None:
        return cel_error("cannot convert value to integer")
    return celtypes.IntType(value)


def is_integer(q: Quantity) -> Any:
    return celtypes.BoolType(_as_int64(q) is not None)


def as_approximate_float(q: Quantity) -> Any:
    return celtypes.DoubleType(float(q.value))


def sign(q: Quantity) -> Any:
    return celtypes.IntType((q.value > 0) - (q.value < 0))


GLOBALS: dict[str, Callable[..., Any]] = {"quantity": quantity, "isQuantity": is_quantity}
METHODS: dict[str, Callable[..., Any]] = {
    "compareTo": compare_to,
    "isGreaterThan": is_greater_than,
    "isLessThan": is_less_than,
    "add": add,
    "sub": sub,
    "asInteger": as_integer,
    "isInteger": is_integer,
    "asApproximateFloat": as_approximate_float,
    "sign": sign,
}
"""Methods on a Quantity receiver, by CEL name."""
