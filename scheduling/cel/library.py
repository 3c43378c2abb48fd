"""The function table of the Kubernetes DRA CEL environment, and what it knows it lacks.

celpy calls ``x.f(y)`` as ``f(x, y)``, so methods of different receiver types that share
a name (``compareTo`` on Quantity and Semver) dispatch here on the receiver's type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from gpudra.scheduling.cel import quantity, semver, strings
from gpudra.scheduling.cel.errors import cel_error
from gpudra.scheduling.cel.operators import OPERATORS, type_name
from gpudra.scheduling.cel.values import (
    OPTIONAL_NONE,
    OptionalNamespace,
    OptionalValue,
)

Function = Callable[..., Any]


def _is_zero(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, celtypes.BoolType | int | float | str | bytes | list | dict):
        return not value
    return False


def _value(opt: OptionalValue) -> Any:
    return opt.value if opt.present else cel_error("optional.none() dereference")


OPTIONAL_METHODS: dict[str, Function] = {
    "hasValue": lambda opt: celtypes.BoolType(opt.present),
    "value": _value,
    "orValue": lambda opt, default: opt.value if opt.present else default,
    "or": lambda opt, other: opt if opt.present else other,
}
OPTIONAL_CONSTRUCTORS: dict[str, Function] = {
    "of": lambda _ns, value: OptionalValue(value, True),
    "none": lambda _ns: OPTIONAL_NONE,
    "ofNonZeroValue": lambda _ns, value: OPTIONAL_NONE if _is_zero(value)
    else OptionalValue(value, True),
}

_RECEIVERS: list[tuple[type, dict[str, Function]]] = [
    (quantity.Quantity, quantity.METHODS),
    (semver.Semver, semver.METHODS),
    (OptionalValue, OPTIONAL_METHODS),
    (OptionalNamespace, OPTIONAL_CONSTRUCTORS),
]


def _dispatch(name: str, fallback: Function | None) -> Function:
    overloads = [(cls, table[name]) for cls, table in _RECEIVERS if name in table]

    def call(receiver: Any, *args: Any) -> Any:
        for value in (receiver, *args):
            if isinstance(value, CELEvalError):
                return value
        for cls, fn in overloads:
            if isinstance(receiver, cls):
                return fn(receiver, *args)
        if fallback is not None:
            return fallback(receiver, *args)
        return cel_error(f"no such overload: {type_name(receiver)}.{name}()")

    return call


def _build() -> dict[str, Function]:
    table: dict[str, Function] = dict(OPERATORS)
    table.update(quantity.GLOBALS)
    table.update(semver.GLOBALS)
    table["string"] = strings.to_string
    method_names = {name for _, methods in _RECEIVERS for name in methods}
    for name, fn in strings.FUNCTIONS.items():
        table[name] = _dispatch(name, fn) if name in method_names else fn
    for name in method_names - set(strings.FUNCTIONS):
        table[name] = _dispatch(name, None)
    return table


FUNCTIONS: dict[str, Function] = _build()
"""Overrides and additions to celpy's ``base_functions``, by CEL name."""

MACROS = frozenset({"has", "all", "exists", "exists_one", "map", "filter"})
CONVERSIONS = frozenset({"int", "uint", "double", "string", "bool", "bytes", "dyn", "type",
                         "duration", "timestamp"})
KNOWN_GLOBALS = frozenset(
    set(quantity.GLOBALS) | set(semver.GLOBALS) | CONVERSIONS
    | {"has", "size", "matches"}
)
"""Functions callable as ``f(x)``."""
TIME_METHODS = frozenset({"getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear",
                          "getFullYear", "getMonth", "getHours", "getMilliseconds",
                          "getMinutes", "getSeconds"})
KNOWN_METHODS = frozenset(
    set(strings.FUNCTIONS) | {n for _, t in _RECEIVERS for n in t} | MACROS | TIME_METHODS
    | {"min"}
)
"""Functions callable as ``x.f()`` (``min`` is celpy's list macro, like Kubernetes' ``min()``)."""

UNSUPPORTED = frozenset({
    # Kubernetes lists library and ext.Lists
    "isSorted", "sum", "max", "slice", "flatten", "distinct", "sort", "sortBy", "range",
    # ext.Sets / ext.Strings quote / Format library
    "equivalent", "intersects", "quote", "format",
    # URL, IP and CIDR libraries
    "url", "isURL", "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath",
    "getQuery", "ip", "isIP", "cidr", "isCIDR", "family", "isUnspecified", "isLoopback",
    "isLinkLocalMulticast", "isLinkLocalUnicast", "isGlobalUnicast", "containsIP",
    "containsCIDR", "masked", "prefixLength", "isCanonical",
    # DRAListTypeAttributes and TwoVarComprehensions
    "includes", "transformList", "transformMap", "transformMapEntry",
})
"""Valid in the Kubernetes environment but not implemented by this local evaluator."""
