"""Kubernetes resource quantities: parse, compare by value, and format canonically.

The apiserver canonicalises quantities (``1024Mi`` is stored as ``1Gi``), so anything that
compares what it wants with what is stored must compare values, never strings.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY_RE = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exp>[+-]?\d+))?$"
)


class QuantityError(ValueError):
    """A string is not a valid Kubernetes quantity."""


def parse_quantity(text: str | int) -> Fraction:
    """Return the exact value of a quantity such as ``80Gi``, ``1500m``, ``1e3`` or ``42``."""
    if isinstance(text, bool):
        raise QuantityError(f"quantity must be a string or integer, got {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    match = _QUANTITY_RE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise QuantityError(f"invalid quantity {text!r}: expected a number with an optional "
                            "suffix (Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E)")
    try:
        number = Fraction(Decimal(match["num"]))
    except InvalidOperation as exc:  # pragma: no cover - the regex already rules this out
        raise QuantityError(f"invalid quantity {text!r}") from exc
    if match["exp"] is not None:
        return number * Fraction(10) ** int(match["exp"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    return number * _DECIMAL[suffix]


def format_quantity(value: int) -> str:
    """Canonical string for a non-negative integer amount, as the apiserver would store it.

    Multiples of 1024 use the largest binary suffix that keeps the number whole (``81559Mi``);
    other values use the largest decimal suffix that does (``132``, ``5k``).
    """
    if value < 0:
        raise QuantityError(f"negative quantity {value}")
    if value == 0:
        return "0"
    if value % 1024 == 0:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = _BINARY[suffix]
            if value % unit == 0:
                return f"{value // unit}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k"):
        unit = int(_DECIMAL[suffix])
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
