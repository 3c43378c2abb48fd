"""Why a selector is false for a device, said with the values it read.

``memory 79.6Gi (81559Mi) < 80Gi``, ``productName 'NVIDIA A100-SXM4-80GB' does not contain
'h100'``: the failing selector's top-level structure (``&&``, ``||``, ``!``, a comparison,
``contains``/``startsWith``/``matches``/``isGreaterThan`` …, ``has()``) is taken apart and
its operands are evaluated against the device. Anything else is named and said to be false.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from fractions import Fraction
from typing import Any

import lark
from celpy import celtypes

from gpudra.scheduling.cel import CelEvalError, DeviceView, Selector
from gpudra.scheduling.cel.checks import unwrap
from gpudra.scheduling.cel.grammar import Node
from gpudra.scheduling.cel.quantity import Quantity
from gpudra.scheduling.cel.semver import Semver
from gpudra.scheduling.cel.values import OptionalValue

_LIMIT = 240
_NEGATED = {"relation_lt": ">=", "relation_le": ">", "relation_gt": "<=", "relation_ge": "<",
            "relation_eq": "!=", "relation_ne": "==", "relation_in": "not in"}
_SYMBOL = {"relation_lt": "<", "relation_le": "<=", "relation_gt": ">", "relation_ge": ">=",
           "relation_eq": "==", "relation_ne": "!=", "relation_in": "in"}
_PREDICATES = {
    "contains": ("contains", "does not contain"),
    "startsWith": ("starts with", "does not start with"),
    "endsWith": ("ends with", "does not end with"),
    "matches": ("matches", "does not match"),
    "isGreaterThan": ("is greater than", "is not greater than"),
    "isLessThan": ("is less than", "is not less than"),
}
_REFERENCE = re.compile(
    r"""device\s*\.\s*(?:attributes|capacity)\s*\[\s*(['"])[^'"]*\1\s*\]\s*"""
    r"""(?:\.\s*\??\s*(\w+)|\[\s*\??\s*(['"])(\w+)\3\s*\])""")
_BINARY_UNITS = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20),
                 ("Ki", 2**10))
_DECIMAL_UNITS = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6),
                  ("k", 10**3))


def shorten(text: str, limit: int = 100) -> str:
    """One line, at most ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def is_binary(value: Quantity) -> bool:
    """Whether a quantity reads best in Ki/Mi/Gi (as written, or a plain large byte count)."""
    return "i" in value.text or (not value.text[-1:].isalpha() and value.value >= 2**30)


def quantity_text(value: Quantity, binary: bool | None = None) -> str:
    """``79.6Gi (81559Mi)``: the size in the largest unit that fits, then as written.

    ``binary`` picks the units (to show both sides of a comparison alike).
    """
    written = value.text
    amount = value.value
    if binary is None:
        binary = is_binary(value)
    units = _BINARY_UNITS if binary else _DECIMAL_UNITS
    for suffix, scale in units:
        if abs(amount) < scale:
            continue
        scaled = amount / scale
        if scaled.denominator == 1:
            shown = f"{scaled.numerator}{suffix}"
        else:
            digits = 1
            while digits < 4 and Fraction(round(float(scaled), digits)) == round(scaled):
                digits += 1  # 79.96 must not print as 80.0
            shown = f"{float(scaled):.{digits}f}{suffix}"
        return written if shown == written else f"{shown} ({written})"
    return written


def value_text(value: Any, binary: bool | None = None) -> str:
    """A CEL value as the selector's author would write it (``binary``: quantity units)."""
    if isinstance(value, CelEvalError):
        return f"<error: {value}>"
    if isinstance(value, celtypes.BoolType):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, Quantity):
        return quantity_text(value, binary)
    if isinstance(value, Semver):
        return str(value)
    if isinstance(value, OptionalValue):
        return f"optional.of({value_text(value.value)})" if value.present else "optional.none()"
    if isinstance(value, celtypes.ListType):
        items = [value_text(v) for v in list(value)[:6]]
        return "[" + ", ".join(items) + (", …" if len(value) > 6 else "") + "]"
    if isinstance(value, celtypes.MapType):
        return f"{{… {len(value)} entries}}"
    return str(value)


def _false(value: Any) -> bool:
    return isinstance(value, celtypes.BoolType) and not value


def _true(value: Any) -> bool:
    return isinstance(value, celtypes.BoolType) and bool(value)


def _chain(node: Node, data: str) -> list[Node]:
    """The operands of ``a && b && c`` (the grammar nests them to the left)."""
    node = unwrap(node)
    if isinstance(node, lark.Tree) and node.data == data and len(node.children) == 2:
        left, right = node.children
        assert isinstance(left, lark.Tree) and isinstance(right, lark.Tree)
        return [*_chain(left, data), right]
    return [node]


def _args(node: Node, index: int) -> list[Node]:
    if len(node.children) <= index:
        return []
    exprlist = node.children[index]
    assert isinstance(exprlist, lark.Tree)
    return [c for c in exprlist.children if isinstance(c, lark.Tree)]


class _Explanation:
    """One (selector, device): the evaluations behind one "why"."""

    def __init__(self, selector: Selector, view: DeviceView) -> None:
        self.selector = selector
        self.view = view

    def value(self, node: Node) -> Any:
        return self.selector.value_of(node, self.view)

    def source(self, node: Node) -> str:
        start = getattr(node.meta, "start_pos", None)
        end = getattr(node.meta, "end_pos", None)
        if start is None or end is None:
            return " ".join(str(t) for t in node.scan_values(lambda v: isinstance(v, lark.Token)))
        return self.selector.expression[start:end]

    def label(self, node: Node) -> str | None:
        """How to name an operand: ``memory``, ``productName.lowerAscii()``; None for a literal."""
        if not any(t.data in ("ident", "dot_ident") for t in node.iter_subtrees()):
            return None  # a constant (a literal, quantity('80Gi'), [0, 2]): its value says it
        text = _REFERENCE.sub(lambda m: m.group(2) or m.group(4), self.source(node))
        return shorten(re.sub(r"\bdevice\s*\.\s*driver\b", "driver", text), 60)

    def operand(self, node: Node, like: Any = None) -> str:
        """``label value``; a quantity is shown in the units of ``like``, if that is one."""
        label = self.label(node)
        value = self.value(node)
        if isinstance(value, CelEvalError):
            return f"{label or self.source(node)} (error: {value})"
        text = value_text(value, is_binary(like) if isinstance(like, Quantity) else None)
        return f"{label} {text}" if label else text

    def pair(self, left: Node, right: Node) -> tuple[str, str]:
        return self.operand(left), self.operand(right, like=self.value(left))

    def why(self, node: Node, want: bool) -> list[str]:
        """Why ``node`` is not ``want``."""
        inner = unwrap(node)
        data = inner.data
        if data in ("conditionaland", "conditionalor") and len(inner.children) == 2:
            # Whichever the operator, the parts that went the other way made the result:
            # the false parts of a false ``&&``, every part of a false ``||``, and so on.
            wrong = _false if want else _true
            found = [line for part in _chain(inner, data) if wrong(self.value(part))
                     for line in self.why(part, want)]
            if found:
                return found
        elif data == "unary" and inner.children[0].data == "unary_not":
            operand = inner.children[1]
            assert isinstance(operand, lark.Tree)
            return self.why(operand, not want)
        elif data == "relation" and len(inner.children) == 2:
            return [self.relation(inner, want)]
        elif data == "member_dot_arg" and str(inner.children[1]) in _PREDICATES:
            receiver = inner.children[0]
            assert isinstance(receiver, lark.Tree)
            args = _args(inner, 2)
            if len(args) == 1:
                return [self.predicate(str(inner.children[1]), receiver, args[0], want)]
        elif data == "ident_arg" and str(inner.children[0]) == "matches":
            args = _args(inner, 1)
            if len(args) == 2:
                return [self.predicate("matches", args[0], args[1], want)]
        elif data == "ident_arg" and str(inner.children[0]) == "has":
            args = _args(inner, 1)
            if len(args) == 1:
                name = self.label(args[0]) or self.source(args[0])
                return [f"{name} is {'not ' if want else ''}set on the device"]
        return [f"{shorten(self.label(inner) or self.source(inner), 60)} is "
                f"{'false' if want else 'true'}"]

    def relation(self, node: Node, want: bool) -> str:
        op, right = node.children
        assert isinstance(op, lark.Tree) and isinstance(right, lark.Tree)
        left = op.children[0]
        assert isinstance(left, lark.Tree)
        symbol = (_NEGATED if want else _SYMBOL)[op.data]
        call = unwrap(left)
        zero = unwrap(right)
        if call.data == "member_dot_arg" and str(call.children[1]) == "compareTo" and \
                zero.data == "literal" and str(zero.children[0]) == "0":
            # X.compareTo(Y) >= 0 is "X >= Y": say it that way, with both values
            receiver, args = call.children[0], _args(call, 2)
            if isinstance(receiver, lark.Tree) and len(args) == 1:
                first, second = self.pair(receiver, args[0])
                return f"{first} {symbol} {second}"
        first, second = self.pair(left, right)
        return f"{first} {symbol} {second}"

    def predicate(self, method: str, receiver: Node, argument: Node, want: bool) -> str:
        holds, fails = _PREDICATES[method]
        first, second = self.pair(receiver, argument)
        return f"{first} {fails if want else holds} {second}"


class SelectorWhy:
    """Explains false selectors with values, once per distinct device content."""

    def __init__(self) -> None:
        self._by_object: dict[tuple[str, int], tuple[Any, str]] = {}
        self._by_key: dict[tuple[str, Hashable], str] = {}

    def why(self, selector: Selector, view: DeviceView) -> str:
        """Why ``selector`` is false for this device: values, comparisons, ``; ``-separated."""
        seen = self._by_object.get((selector.expression, id(view.raw)))
        if seen is not None and seen[0] is view.raw:
            return seen[1]
        key = (selector.expression, selector.key(view))
        text = self._by_key.get(key)
        if text is None:
            lines = _Explanation(selector, view).why(selector.ast, True)
            text = shorten("; ".join(dict.fromkeys(lines)), _LIMIT)
            self._by_key[key] = text
        self._by_object[(selector.expression, id(view.raw))] = (view.raw, text)
        return text
