"""Compile DRA device selectors and evaluate them against devices, as the scheduler would.

``compile_selector`` parses and checks an expression once (cached by text);
``Selector.matches`` answers for one :class:`DeviceView`. Answers are cached by the values
of exactly the attributes/capacities the expression reads, so a thousand nodes of one GPU
model cost a handful of real evaluations, not a million.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from functools import cache
from typing import Any

import celpy
from celpy import celtypes
from celpy.evaluation import CELEvalError

from gpudra.api.api_limits import CEL_SELECTOR_EXPRESSION_MAX_LENGTH
from gpudra.scheduling.cel.checks import Analysis, Footprint, analyse
from gpudra.scheduling.cel.errors import CelCompileError, CelEvalError
from gpudra.scheduling.cel.evaluator import DeviceEvaluator, DeviceRunner
from gpudra.scheduling.cel.grammar import Node, environment, parse
from gpudra.scheduling.cel.library import FUNCTIONS
from gpudra.scheduling.cel.operators import type_name
from gpudra.scheduling.cel.values import DeviceView

_RESULT_CACHE_LIMIT = 1 << 16


@cache
def _environment() -> celpy.Environment:
    """One celpy environment, built on first use (not at import: it needs the parser)."""
    return environment()



def _message(error: CELEvalError) -> str:
    """celpy's error value as one line, in cel-go's words where they differ."""
    args = error.args
    text = str(args[0]) if args else "error"
    if text == "no such key" and len(args) > 2 and args[2]:
        return f"no such key: {args[2][0]}"
    if text.startswith("found no matching overload"):
        return "no such overload"
    if text.startswith("undeclared reference"):
        return text.split(" (in activation", 1)[0]
    return text


Result = bool | CelEvalError


class Selector:
    """One compiled CEL selector; thread-safe, shared through :func:`compile_selector`."""

    def __init__(self, expression: str, ast: Node, analysis: Analysis) -> None:
        self.expression = expression
        self.ast = ast
        self.analysis = analysis
        self._runner = DeviceRunner(_environment(), ast, FUNCTIONS)
        self._results: dict[Hashable, Result] = {}
        self._by_object: dict[int, tuple[Mapping[str, Any], str, Result]] = {}
        self._lock = threading.Lock()
        self.key: Callable[[DeviceView], Hashable] = _key_function(analysis.footprint)
        self.evaluations = 0
        """How many devices really went through the interpreter (the rest were cached)."""

    @property
    def footprint(self) -> Footprint:
        return self.analysis.footprint

    def matches(self, view: DeviceView) -> bool:
        """Whether the device is selected; raises :class:`CelEvalError` on a runtime error."""
        result = self.result(view)
        if isinstance(result, CelEvalError):
            raise result
        return result

    def result(self, view: DeviceView) -> Result:
        """Like :meth:`matches`, with the runtime error returned instead of raised.

        Device dicts are treated as immutable once seen: answers are also remembered per
        dict object, which makes nodes that share device dicts (simulated ones) nearly free.
        """
        raw = view.raw
        seen = self._by_object.get(id(raw))
        if seen is not None and seen[0] is raw and seen[1] == view.driver:
            return seen[2]
        key = self.key(view)
        result = self._results.get(key)
        if result is None:
            result = self.evaluate(view)
        with self._lock:
            if len(self._results) >= _RESULT_CACHE_LIMIT:
                self._results.clear()
            if len(self._by_object) >= _RESULT_CACHE_LIMIT:
                self._by_object.clear()
            self._results[key] = result
            self._by_object[id(raw)] = (raw, view.driver, result)
        return result

    def evaluate(self, view: DeviceView) -> Result:
        """Run the interpreter for this device, bypassing the cache."""
        self.evaluations += 1
        try:
            value = self._runner.evaluate(view.activation())
        except CELEvalError as exc:
            return CelEvalError(_message(exc))
        except CelEvalError as exc:  # raised while building the device's CEL values
            return exc
        except RecursionError:
            return CelEvalError("expression nested too deeply")
        if isinstance(value, CELEvalError):
            return CelEvalError(_message(value))
        if not isinstance(value, celtypes.BoolType):
            return CelEvalError(f"CEL result of type {type_name(value)} could not be "
                                "converted to bool")
        return bool(value)

    def value_of(self, node: Node, view: DeviceView) -> Any:
        """One sub-expression's value for this device (a CEL value, or :class:`CelEvalError`).

        Not cached and not counted: this is for explaining a result, never for deciding one.
        The node must not use comprehension or ``cel.bind`` variables of outer nodes.
        """
        evaluator = DeviceEvaluator(ast=node, activation=self._runner.new_activation())
        try:
            value = evaluator.evaluate(view.activation())
        except CELEvalError as exc:
            return CelEvalError(_message(exc))
        except CelEvalError as exc:
            return exc
        except RecursionError:
            return CelEvalError("expression nested too deeply")
        return CelEvalError(_message(value)) if isinstance(value, CELEvalError) else value

    def __repr__(self) -> str:
        return f"Selector({self.expression!r})"


def _key_function(footprint: Footprint) -> Callable[[DeviceView], Hashable]:
    """The cache key: the device's values for exactly what the expression reads."""
    if footprint.whole:
        return DeviceView.content_key
    reads = [("attributes", d, n) for d, n in footprint.attributes] + [
        ("capacity", d, n) for d, n in footprint.capacities]
    allow = footprint.allow_multiple

    def key(view: DeviceView) -> Hashable:
        parts: list[Any] = [view.driver]
        if allow:
            parts.append(bool(view.raw.get("allowMultipleAllocations", False)))
        for field, domain, name in reads:
            parts.append(view.entry_key(field, domain, name))
        return tuple(parts)

    return key


_compiled: dict[str, Selector | CelCompileError] = {}
_compiled_lock = threading.Lock()


def compile_selector(expression: str) -> Selector:
    """Parse and check one selector (cached); raises :class:`CelCompileError`."""
    found = _compiled.get(expression)
    if found is None:
        found = _compile(expression)
        with _compiled_lock:
            _compiled[expression] = found
    if isinstance(found, CelCompileError):
        raise found
    return found


def _compile(expression: str) -> Selector | CelCompileError:
    size = len(expression.encode())
    if size > CEL_SELECTOR_EXPRESSION_MAX_LENGTH:
        return CelCompileError(f"expression too long: {size} bytes, the limit is "
                               f"{CEL_SELECTOR_EXPRESSION_MAX_LENGTH}")
    if not expression.strip():
        return CelCompileError("expression is empty")
    try:
        ast = parse(expression)
        return Selector(expression, ast, analyse(ast, expression))
    except CelCompileError as exc:
        return exc
