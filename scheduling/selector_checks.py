"""CEL selectors checked against what this driver publishes (``catalog``).

A selector is compiled and type-checked as the apiserver does it (what fails there is an
error the apiserver refuses at create); then every attribute and capacity it reads is
looked up in the catalog (a misspelt name compiles fine but makes every allocation fail),
what the scheduler rejects at runtime is found (a ``version`` attribute compared with a
string or passed to ``string()``: attribute values have no static type), and
``quantity()``/``semver()`` literals are parsed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpudra.api.api_limits import DEVICE_SELECTORS_MAX_SIZE
from gpudra.scheduling.catalog import (
    CAPACITIES,
    REMOVED,
    is_known_capacity,
    known_attributes,
    suggest,
)
from gpudra.scheduling.cel import CelCompileError, compile_selector
from gpudra.scheduling.cel.checks import Comparison, LiteralCall, Reference
from gpudra.scheduling.cel.quantity import parse as parse_quantity
from gpudra.scheduling.cel.semver import normalize as normalize_semver
from gpudra.scheduling.cel.semver import parse as parse_semver
from gpudra.scheduling.findings import Checker


def check_selectors(check: Checker, path: str, selectors: Any) -> None:
    for i, selector in enumerate(check.limit(path, selectors, DEVICE_SELECTORS_MAX_SIZE)):
        here = f"{path}[{i}]"
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        if not isinstance(cel, Mapping):
            check.error(f"{here}.cel", "Required value")
            continue
        expression = cel.get("expression")
        if not isinstance(expression, str) or not expression.strip():
            check.error(f"{here}.cel.expression", "Required value")
            continue
        check_expression(check, f"{here}.cel.expression", expression)


def check_expression(check: Checker, path: str, expression: str) -> None:
    try:
        selector = compile_selector(expression)
    except CelCompileError as exc:
        if exc.unsupported:
            check.warn(path, f"not checked: {exc}")
        else:
            hint = f"; {exc.hint}" if exc.hint else ""
            check.error(path, f"Invalid value: CEL compile error: {exc}{hint}")
        return
    for reference in selector.analysis.references:
        _reference(check, path, reference)
    for comparison in selector.analysis.comparisons:
        _comparison(check, path, comparison)
    for call in selector.analysis.literal_calls:
        _literal_call(check, path, call)
    for reference in selector.analysis.converted:
        _conversion(check, path, reference)


def _reference(check: Checker, path: str, ref: Reference) -> None:
    field = "attributes" if ref.kind == "attribute" else "capacity"
    where = f"line {ref.line}, column {ref.column}: device.{field}['{ref.domain}'].{ref.name}"
    if ref.kind == "capacity":
        if ref.domain == check.driver and not is_known_capacity(ref.name):
            hint = suggest(ref.name, CAPACITIES)
            check.later(path, f"{where}: no such capacity on this driver's devices"
                        + (f"; did you mean '{hint}'?" if hint else
                           f" (known: {', '.join(CAPACITIES)})"))
        return
    known = known_attributes(ref.domain, check.driver)
    if known is None or ref.name in known:
        return
    if ref.domain == check.driver and ref.name in REMOVED:
        check.later(path, f"{where}: no such attribute: {REMOVED[ref.name]}")
        return
    hint = suggest(ref.name, known)
    missing = "is never published" if ref.guarded else (
        "is not published, so the scheduler fails with 'no such key'")
    check.later(path, f"{where}: no such attribute: {ref.name} {missing}"
                + (f"; did you mean '{hint}'?" if hint else ""))


def _comparison(check: Checker, path: str, comparison: Comparison) -> None:
    """Attribute comparisons the scheduler rejects at runtime, or that make a test constant.

    Attribute values are ``dyn`` to the type check, so only a device shows that
    ``driverVersion`` is a Semver: it has no ordering operators, and on the left of ``==``
    it refuses other types ("no such overload"); plain values of different types are just
    unequal (heterogeneous equality).
    """
    ref = comparison.reference
    if ref.kind == "capacity":
        return  # statically a Quantity: the type check already refused every mismatch
    kind = (known_attributes(ref.domain, check.driver) or {}).get(ref.name)
    if kind is None:
        return
    literal = comparison.literal_type
    other = _KINDS.get(literal, literal)
    op = comparison.op
    at = f"line {ref.line}, column {ref.column}: {ref.name} is {_article(kind)} {kind}"
    if op in ("==", "!=", "in"):
        if other == kind:
            return
        left_opaque = kind if comparison.reference_first else other
        if left_opaque in _OPAQUE:
            check.later(path, f"{at}: '{op}' with {_article(literal)} {literal} fails at "
                        f"scheduling time ('no such overload'); "
                        f"{_advice(ref, kind, comparison)}")
        else:
            check.later(path, f"{at}: comparing it with {_article(literal)} {literal} is "
                        f"always {'true' if op == '!=' else 'false'}")
        return
    if kind in _OPAQUE or other in _OPAQUE:
        check.later(path, f"{at}: '{op}' fails at scheduling time ('no such overload': "
                    f"{_PLURAL.get(kind, kind)} have no ordering operators); "
                    f"{_advice(ref, kind, comparison)}")
    elif other != kind:
        check.later(path, f"{at}: '{op}' with {_article(literal)} {literal} fails at "
                    "scheduling time ('no such overload')")


def _conversion(check: Checker, path: str, ref: Reference) -> None:
    """``string(<version attribute>)``: Semver has no string conversion."""
    kind = (known_attributes(ref.domain, check.driver) or {}).get(ref.name)
    if ref.kind == "attribute" and kind == "version":
        check.later(path, f"line {ref.line}, column {ref.column}: {ref.name} is a version: "
                    "string() of it fails at scheduling time ('no such overload'); compare it "
                    "with semver('…') or use its major(), minor() and patch()")


def _advice(ref: Reference, kind: str, comparison: Comparison) -> str:
    field = "attributes" if ref.kind == "attribute" else "capacity"
    op = "==" if comparison.op == "in" else comparison.op
    if kind != "version":
        return "compare values of the same type"
    value = f"semver('{_semver_example(comparison.literal)}')"
    return f"use device.{field}['{ref.domain}'].{ref.name}.compareTo({value}) {op} 0"


def _literal_call(check: Checker, path: str, call: LiteralCall) -> None:
    try:
        if call.function == "quantity":
            parse_quantity(call.argument)
        else:
            parse_semver(call.argument)
    except ValueError as exc:
        hint = ""
        if call.function == "semver":
            normalized = _semver_example(call.argument)
            if normalized != call.argument:
                hint = f"; did you mean semver('{normalized}')?"
        check.later(path, f"line {call.line}, column {call.column}: {call.function}"
                    f"('{call.argument}') fails at scheduling time: {exc}{hint}")


_OPAQUE = ("version", "quantity")
_PLURAL = {"version": "versions", "quantity": "quantities"}
_KINDS = {"Semver": "version", "Quantity": "quantity", "uint": "int", "double": "int"}
"""Literal types as the attribute kind they compare equal with (numbers across types)."""


def _article(kind: str) -> str:
    return "an" if kind[:1] in "aeiou" else "a"


def _semver_example(literal: str) -> str:
    try:
        return str(parse_semver(normalize_semver(literal)))
    except ValueError:
        return literal
