"""CEL operators with cel-go's semantics where celpy differs.

celpy raises on ``1 == '1'`` and lets ``true == 1``, ``1 + 1u`` through; cel-go (and so
the scheduler) has *heterogeneous equality*: values of different types are simply not
equal, numbers compare by value across int/uint/double, while an opaque type (Quantity,
Semver) on the left of ``==`` refuses anything but its own type ("no such overload").
Ordering and arithmetic never mix types, except that numbers may be *compared* across
types (Kubernetes enables ``CrossTypeNumericComparisons``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from gpudra.scheduling.cel.errors import cel_error
from gpudra.scheduling.cel.quantity import Quantity
from gpudra.scheduling.cel.semver import Semver
from gpudra.scheduling.cel.values import OptionalValue

_NUMBERS = (celtypes.IntType, celtypes.UintType, celtypes.DoubleType)


def type_name(value: Any) -> str:
    """The CEL type name of a value, for error messages."""
    for cls, name in (
        (celtypes.BoolType, "bool"),
        (celtypes.IntType, "int"),
        (celtypes.UintType, "uint"),
        (celtypes.DoubleType, "double"),
        (celtypes.StringType, "string"),
        (celtypes.BytesType, "bytes"),
        (celtypes.ListType, "list"),
        (celtypes.MapType, "map"),
        (celtypes.TimestampType, "google.protobuf.Timestamp"),
        (celtypes.DurationType, "google.protobuf.Duration"),
        (Quantity, "Quantity"),
        (Semver, "Semver"),
        (OptionalValue, "optional_type"),
    ):
        if isinstance(value, cls):
            return name
    if value is None:
        return "null_type"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _kind(value: Any) -> str:
    """Like :func:`type_name` but all numbers are one kind (they compare by value)."""
    if isinstance(value, celtypes.BoolType):
        return "bool"
    if isinstance(value, _NUMBERS):
        return "number"
    return type_name(value)


def _error_operand(*values: Any) -> CELEvalError | None:
    for value in values:
        if isinstance(value, CELEvalError):
            return value
    return None


def _equal(a: Any, b: Any) -> bool | CELEvalError:
    if isinstance(a, Quantity | Semver):
        if type(a) is not type(b):
            return cel_error(f"no such overload: {type_name(a)} == {type_name(b)}")
        return bool(a == b)
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        return False
    if ka == "list":
        if len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=True):
            same = _equal(x, y)
            if same is not True:
                return same
        return True
    if ka == "map":
        if len(a) != len(b):
            return False
        for key, value in a.items():
            if not _contains_key(b, key):
                return False
            same = _equal(value, _get_key(b, key))
            if same is not True:
                return same
        return True
    if ka == "number":
        return bool(float(a) == float(b)) if isinstance(a, celtypes.DoubleType) or isinstance(
            b, celtypes.DoubleType) else int(a) == int(b)
    return bool(a == b)


def _contains_key(mapping: Mapping[Any, Any], key: Any) -> bool:
    return any(_equal(key, k) is True for k in mapping)


def _get_key(mapping: Mapping[Any, Any], key: Any) -> Any:
    for k, v in mapping.items():
        if _equal(key, k) is True:
            return v
    raise KeyError(key)  # pragma: no cover - guarded by _contains_key


def equal(a: Any, b: Any) -> Any:
    """``a == b``."""
    error = _error_operand(a, b)
    if error is not None:
        return error
    result = _equal(a, b)
    return celtypes.BoolType(result) if isinstance(result, bool) else result


def not_equal(a: Any, b: Any) -> Any:
    """``a != b``."""
    result = equal(a, b)
    return celtypes.BoolType(not result) if isinstance(result, celtypes.BoolType) else result


_ORDERED = {"number", "string", "bytes", "bool", "google.protobuf.Timestamp",
            "google.protobuf.Duration"}


def _relation(symbol: str, compare: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    def relation(a: Any, b: Any) -> Any:
        error = _error_operand(a, b)
        if error is not None:
            return error
        ka, kb = _kind(a), _kind(b)
        if ka != kb or ka not in _ORDERED:
            return cel_error(f"no such overload: {type_name(a)} {symbol} {type_name(b)}")
        if ka == "number":
            return celtypes.BoolType(compare(_exact(a), _exact(b)))
        return celtypes.BoolType(compare(a, b))

    return relation


def _exact(number: Any) -> Any:
    """Compare ints exactly (a float conversion would lose precision above 2**53)."""
    return float(number) if isinstance(number, celtypes.DoubleType) else int(number)


_ARITHMETIC: dict[str, set[str]] = {
    "+": {"int", "uint", "double", "string", "bytes", "list"},
    "-": {"int", "uint", "double"},
    "*": {"int", "uint", "double"},
    "/": {"int", "uint", "double"},
    "%": {"int", "uint"},
}


def _arithmetic(symbol: str, op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def arithmetic(a: Any, b: Any) -> Any:
        error = _error_operand(a, b)
        if error is not None:
            return error
        ta, tb = type_name(a), type_name(b)
        timestamps = {"google.protobuf.Timestamp", "google.protobuf.Duration"}
        if (ta != tb or ta not in _ARITHMETIC[symbol]) and not (
                symbol in "+-" and {ta, tb} <= timestamps):
            return cel_error(f"no such overload: {ta} {symbol} {tb}")
        try:
            result = op(a, b)
        except ZeroDivisionError:
            return cel_error("division by zero" if symbol == "/" else "modulus by zero")
        except (ValueError, OverflowError):
            return cel_error("return error for overflow")
        except TypeError:
            return cel_error(f"no such overload: {ta} {symbol} {tb}")
        # list + list is a plain Python list: keep it a CEL list for size(), join() …
        return celtypes.ListType(result) if type(result) is list else result

    return arithmetic


def logical_and(a: Any, b: Any) -> Any:
    """``&&``: false wins over an error on either side; anything else non-bool is an error."""
    if (isinstance(a, celtypes.BoolType) and not a) or (isinstance(b, celtypes.BoolType) and not b):
        return celtypes.BoolType(False)
    return _logical_rest(a, b, "&&")


def logical_or(a: Any, b: Any) -> Any:
    """``||``: true wins over an error on either side."""
    if (isinstance(a, celtypes.BoolType) and a) or (isinstance(b, celtypes.BoolType) and b):
        return celtypes.BoolType(True)
    return _logical_rest(a, b, "||")


def _logical_rest(a: Any, b: Any, symbol: str) -> Any:
    error = _error_operand(a, b)
    if error is not None:
        return error
    if isinstance(a, celtypes.BoolType) and isinstance(b, celtypes.BoolType):
        return celtypes.BoolType(bool(a) and bool(b)) if symbol == "&&" else celtypes.BoolType(
            bool(a) or bool(b))
    return cel_error(f"no such overload: {type_name(a)} {symbol} {type_name(b)}")


def logical_not(a: Any) -> Any:
    if isinstance(a, CELEvalError):
        return a
    if not isinstance(a, celtypes.BoolType):
        return cel_error(f"no such overload: !{type_name(a)}")
    return celtypes.BoolType(not a)


def negate(a: Any) -> Any:
    if isinstance(a, CELEvalError):
        return a
    if type_name(a) not in ("int", "double", "google.protobuf.Duration"):
        return cel_error(f"no such overload: -{type_name(a)}")
    try:
        return -a
    except (ValueError, OverflowError):
        return cel_error("return error for overflow")


def contained_in(item: Any, container: Any) -> Any:
    """``item in container`` for lists (any equal element) and maps (keys)."""
    error = _error_operand(item, container)
    if error is not None:
        return error
    if isinstance(container, celtypes.MapType):
        return celtypes.BoolType(_contains_key(container, item))
    if isinstance(container, celtypes.ListType):
        for element in container:
            if _equal(item, element) is True:
                return celtypes.BoolType(True)
        return celtypes.BoolType(False)
    return cel_error(f"no such overload: {type_name(item)} in {type_name(container)}")


def conditional(condition: Any, then: Any, otherwise: Any) -> Any:
    if isinstance(condition, CELEvalError):
        return condition
    if not isinstance(condition, celtypes.BoolType):
        return cel_error(f"no such overload: {type_name(condition)} ? _ : _")
    return then if condition else otherwise


OPERATORS: dict[str, Callable[..., Any]] = {
    "_==_": equal,
    "_!=_": not_equal,
    "_<_": _relation("<", operator.lt),
    "_<=_": _relation("<=", operator.le),
    "_>_": _relation(">", operator.gt),
    "_>=_": _relation(">=", operator.ge),
    "_+_": _arithmetic("+", operator.add),
    "_-_": _arithmetic("-", operator.sub),
    "_*_": _arithmetic("*", operator.mul),
    "_/_": _arithmetic("/", operator.truediv),
    "_%_": _arithmetic("%", operator.mod),
    "_&&_": logical_and,
    "_||_": logical_or,
    "!_": logical_not,
    "-_": negate,
    "_in_": contained_in,
    "_?_:_": conditional,
}
"""celpy operator names → implementations overriding ``celpy.evaluation.base_functions``."""
