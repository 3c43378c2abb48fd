"""Declared overloads of the Kubernetes DRA CEL environment, for the static type check.

CEL's standard library (with ``CrossTypeNumericComparisons``), ``ext.Strings``, the
Kubernetes regex, lists, Quantity and Semver libraries, and optionals. Macros, ``cel.bind``
and ``optional.*`` are typed in ``typecheck``. A function missing here but accepted by
``checks`` is typed ``dyn``: unknown is never an error.
"""

from __future__ import annotations

from gpudra.scheduling.cel.types import (
    BOOL,
    BYTES,
    DOUBLE,
    DURATION,
    DYN,
    INT,
    QUANTITY,
    SEMVER,
    STRING,
    TIMESTAMP,
    UINT,
    A,
    B,
    CelType,
    Overload,
    list_of,
    map_of,
    optional_of,
    type_of,
)

_NUMBERS = (INT, UINT, DOUBLE)
_ORDERED = (BOOL, INT, UINT, DOUBLE, STRING, BYTES, TIMESTAMP, DURATION)


def _same(types: tuple[CelType, ...], arity: int, result: CelType | None = None) -> list[Overload]:
    return [((t,) * arity, result or t) for t in types]


def _conversion(result: CelType, *sources: CelType) -> list[Overload]:
    return [((source,), result) for source in sources]


_RELATION: list[Overload] = _same(_ORDERED, 2, BOOL) + [
    ((a, b), BOOL) for a in _NUMBERS for b in _NUMBERS if a != b]
_SIZE: list[Overload] = [((STRING,), INT), ((BYTES,), INT), ((list_of(A),), INT),
                         ((map_of(A, B),), INT)]

GLOBAL: dict[str, list[Overload]] = {
    "_==_": [((A, A), BOOL)],
    "_!=_": [((A, A), BOOL)],
    "_<_": _RELATION,
    "_<=_": _RELATION,
    "_>_": _RELATION,
    "_>=_": _RELATION,
    "_+_": [*_same((INT, UINT, DOUBLE, STRING, BYTES), 2),
            ((list_of(A), list_of(A)), list_of(A)), ((TIMESTAMP, DURATION), TIMESTAMP),
            ((DURATION, TIMESTAMP), TIMESTAMP), ((DURATION, DURATION), DURATION)],
    "_-_": [*_same(_NUMBERS, 2),
            ((TIMESTAMP, TIMESTAMP), DURATION), ((TIMESTAMP, DURATION), TIMESTAMP),
            ((DURATION, DURATION), DURATION)],
    "_*_": _same(_NUMBERS, 2),
    "_/_": _same(_NUMBERS, 2),
    "_%_": _same((INT, UINT), 2),
    "-_": _same((INT, DOUBLE), 1),
    "!_": [((BOOL,), BOOL)],
    "_&&_": [((BOOL, BOOL), BOOL)],
    "_||_": [((BOOL, BOOL), BOOL)],
    "_?_:_": [((BOOL, A, A), A)],
    "_in_": [((A, list_of(A)), BOOL), ((A, map_of(A, B)), BOOL)],
    "_[_]": [((list_of(A), INT), A), ((map_of(A, B), A), B)],
    "size": _SIZE,
    "matches": [((STRING, STRING), BOOL)],
    "int": _conversion(INT, INT, UINT, DOUBLE, STRING, TIMESTAMP),
    "uint": _conversion(UINT, INT, UINT, DOUBLE, STRING),
    "double": _conversion(DOUBLE, INT, UINT, DOUBLE, STRING),
    # No Quantity or Semver overload: string(version attribute) fails on a real scheduler.
    "string": _conversion(STRING, INT, UINT, DOUBLE, BOOL, BYTES, STRING, TIMESTAMP, DURATION),
    "bool": _conversion(BOOL, BOOL, STRING),
    "bytes": _conversion(BYTES, BYTES, STRING),
    "dyn": [((A,), DYN)],
    "type": [((A,), type_of(A))],
    "duration": _conversion(DURATION, STRING, DURATION),
    "timestamp": _conversion(TIMESTAMP, STRING, INT, TIMESTAMP),
    "quantity": [((STRING,), QUANTITY)],
    "isQuantity": [((STRING,), BOOL)],
    "semver": [((STRING,), SEMVER), ((STRING, BOOL), SEMVER)],
    "isSemver": [((STRING,), BOOL), ((STRING, BOOL), BOOL)],
}
"""Global functions and operators (cel-go's names: ``_==_``, ``_[_]``, ``!_`` …)."""

_TIME_GETTERS = ("getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear",
                 "getMonth")
_CLOCK_GETTERS = ("getHours", "getMilliseconds", "getMinutes", "getSeconds")
_STRING_PREDICATE: list[Overload] = [((STRING, STRING), BOOL)]
_COMPARE: list[Overload] = [((QUANTITY, QUANTITY), INT), ((SEMVER, SEMVER), INT)]
_ORDER: list[Overload] = [((QUANTITY, QUANTITY), BOOL), ((SEMVER, SEMVER), BOOL)]

MEMBER: dict[str, list[Overload]] = {
    "size": _SIZE,
    "contains": _STRING_PREDICATE,
    "startsWith": _STRING_PREDICATE,
    "endsWith": _STRING_PREDICATE,
    "matches": _STRING_PREDICATE,
    "charAt": [((STRING, INT), STRING)],
    "indexOf": [((STRING, STRING), INT), ((STRING, STRING, INT), INT), ((list_of(A), A), INT)],
    "lastIndexOf": [((STRING, STRING), INT), ((STRING, STRING, INT), INT),
                    ((list_of(A), A), INT)],
    "lowerAscii": [((STRING,), STRING)],
    "upperAscii": [((STRING,), STRING)],
    "trim": [((STRING,), STRING)],
    "reverse": [((STRING,), STRING)],
    "replace": [((STRING, STRING, STRING), STRING), ((STRING, STRING, STRING, INT), STRING)],
    "split": [((STRING, STRING), list_of(STRING)), ((STRING, STRING, INT), list_of(STRING))],
    "substring": [((STRING, INT), STRING), ((STRING, INT, INT), STRING)],
    "join": [((list_of(STRING),), STRING), ((list_of(STRING), STRING), STRING)],
    "find": [((STRING, STRING), STRING)],
    "findAll": [((STRING, STRING), list_of(STRING)), ((STRING, STRING, INT), list_of(STRING))],
    "min": [((list_of(A),), A)],
    # Quantity and Semver
    "compareTo": _COMPARE,
    "isGreaterThan": _ORDER,
    "isLessThan": _ORDER,
    "add": [((QUANTITY, QUANTITY), QUANTITY), ((QUANTITY, INT), QUANTITY)],
    "sub": [((QUANTITY, QUANTITY), QUANTITY), ((QUANTITY, INT), QUANTITY)],
    "isInteger": [((QUANTITY,), BOOL)],
    "asInteger": [((QUANTITY,), INT)],
    "asApproximateFloat": [((QUANTITY,), DOUBLE)],
    "sign": [((QUANTITY,), INT)],
    "major": [((SEMVER,), INT)],
    "minor": [((SEMVER,), INT)],
    "patch": [((SEMVER,), INT)],
    # optionals
    "hasValue": [((optional_of(A),), BOOL)],
    "value": [((optional_of(A),), A)],
    "orValue": [((optional_of(A), A), A)],
    "or": [((optional_of(A), optional_of(A)), optional_of(A))],
    **{name: [((TIMESTAMP,), INT), ((TIMESTAMP, STRING), INT)] for name in _TIME_GETTERS},
    **{name: [((TIMESTAMP,), INT), ((TIMESTAMP, STRING), INT), ((DURATION,), INT)]
       for name in _CLOCK_GETTERS},
}
"""Methods, receiver first: ``x.contains(y)`` is ``contains(string, string) -> bool``."""

OPTIONAL_CONSTRUCTORS: dict[str, list[Overload]] = {
    "of": [((A,), optional_of(A))],
    "ofNonZeroValue": [((A,), optional_of(A))],
    "none": [((), optional_of(DYN))],
}
"""``optional.of(x)``, ``optional.ofNonZeroValue(x)``, ``optional.none()``."""
