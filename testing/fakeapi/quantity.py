"""Kubernetes quantities as the apiserver parses and re-serialises them.

Written independently of ``gpudra.api.quantity`` on purpose: this server is the second
opinion. The apiserver keeps a quantity's *format* (binary suffix, decimal suffix or
exponent) and prints the value canonically in that format, so ``1024Mi`` comes back as
``1Gi``, ``1000`` as ``1k``, ``0.5Gi`` as ``512Mi`` and ``1.5`` as ``1500m``.
"""

from __future__ import annotations

import re
from fractions import Fraction

from gpudra.testing.fakeapi.errors import DecodeError

# apimachinery's error text, which the client sees inside a 400 BadRequest.
FORMAT_MESSAGE = ("quantities must match the regular expression "
                  "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")

_SPLIT = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exp: suffix for suffix, exp in _DECIMAL.items()}
_BINARY_SUFFIX = {exp: suffix for suffix, exp in _BINARY.items()}
_NANO = Fraction(1, 10**9)

BINARY_SI = "BinarySI"
DECIMAL_SI = "DecimalSI"
DECIMAL_EXPONENT = "DecimalExponent"


def parse(text: object) -> tuple[Fraction, str]:
    """Return (exact value, format) or raise DecodeError with the apiserver's message."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise DecodeError(FORMAT_MESSAGE)
    raw = str(text).strip()
    match = _SPLIT.match(raw)
    if match is None or _NUMBER.match(match[1]) is None:
        raise DecodeError(FORMAT_MESSAGE)
    number = Fraction(match[1])
    suffix = match[2]
    if suffix in _BINARY:
        value, fmt = number * 1024 ** _BINARY[suffix], BINARY_SI
    elif suffix in _DECIMAL:
        value, fmt = number * Fraction(10) ** _DECIMAL[suffix], DECIMAL_SI
    elif re.fullmatch(r"[eE][-+]?\d+", suffix):
        value, fmt = number * Fraction(10) ** int(suffix[1:]), DECIMAL_EXPONENT
    else:
        raise DecodeError("unable to parse quantity's suffix")
    # Precision is nano; anything finer is rounded away from zero, as apimachinery does.
    if (value / _NANO).denominator != 1:
        scaled = value / _NANO
        rounded = -((-abs(scaled)) // 1)
        value = (rounded if value > 0 else -rounded) * _NANO
    return value, fmt


def canonical(text: object) -> str:
    """The string the apiserver would store and return for this quantity."""
    value, fmt = parse(text)
    if value == 0:
        return "0"
    if fmt == BINARY_SI and (abs(value) < 1024 or value.denominator != 1):
        fmt = DECIMAL_SI  # small or fractional binary values print as decimal
    if fmt == BINARY_SI:
        return _binary(int(value))
    return _decimal(value, fmt)


def _binary(value: int) -> str:
    sign = "-" if value < 0 else ""
    mantissa, exp = abs(value), 0
    while mantissa % 1024 == 0 and exp < 6:
        mantissa //= 1024
        exp += 1
    return f"{sign}{mantissa}{_BINARY_SUFFIX.get(exp, '')}"


def _decimal(value: Fraction, fmt: str) -> str:
    sign = "-" if value < 0 else ""
    value = abs(value)
    # value is a whole number of nanos here, so mantissa * 10**exp is exact.
    exp = -9
    mantissa = int(value / _NANO)
    while mantissa % 10 == 0:
        mantissa //= 10
        exp += 1
    # Lower the exponent to a multiple of three, as the canonical form requires.
    while exp % 3:
        mantissa *= 10
        exp -= 1
    if fmt == DECIMAL_EXPONENT:
        return f"{sign}{mantissa}" + (f"e{exp}" if exp else "")
    while exp > 18:  # beyond "E" there is no suffix; keep the value exact
        mantissa *= 1000
        exp -= 3
    return f"{sign}{mantissa}{_DECIMAL_SUFFIX[exp]}"
