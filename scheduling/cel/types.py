"""Static CEL types, named as cel-go's checker names them in its error messages.

The API server type-checks every new selector against the declared types of the DRA
environment; these are the pieces of that: type values, type parameters for generic
overloads (``_==_`` is ``(A, A) -> bool``), assignability with ``dyn`` matching anything,
and overload resolution.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CelType:
    """A CEL type: a name and, for ``list``/``map``/``optional_type``/``type``, parameters.

    A name that starts with ``?`` is a type parameter of a generic overload.
    """

    name: str
    params: tuple[CelType, ...] = ()

    @property
    def is_param(self) -> bool:
        return self.name.startswith("?")

    def __str__(self) -> str:
        if self.name == "map":
            return f"map({self.params[0]}, {self.params[1]})"
        if self.params:
            return f"{self.name}({', '.join(map(str, self.params))})"
        return self.name


DYN = CelType("dyn")
ERROR = CelType("*error*")
"""The type of a sub-expression that already failed: matches anything, reports nothing."""
BOOL = CelType("bool")
INT = CelType("int")
UINT = CelType("uint")
DOUBLE = CelType("double")
STRING = CelType("string")
BYTES = CelType("bytes")
NULL = CelType("null_type")
TIMESTAMP = CelType("google.protobuf.Timestamp")
DURATION = CelType("google.protobuf.Duration")
QUANTITY = CelType("kubernetes.Quantity")
SEMVER = CelType("kubernetes.Semver")
DEVICE = CelType("kubernetes.DRADevice")

A = CelType("?A")
B = CelType("?B")


def list_of(element: CelType) -> CelType:
    return CelType("list", (element,))


def map_of(key: CelType, value: CelType) -> CelType:
    return CelType("map", (key, value))


def optional_of(value: CelType) -> CelType:
    return CelType("optional_type", (value,))


def type_of(value: CelType) -> CelType:
    return CelType("type", (value,))


DEVICE_FIELDS: dict[str, CelType] = {
    "driver": STRING,
    # Attribute values are declared with an unknown type: int, bool, string or Semver
    # is only known when a device is looked at.
    "attributes": map_of(STRING, map_of(STRING, DYN)),
    "capacity": map_of(STRING, map_of(STRING, QUANTITY)),
    "allowMultipleAllocations": BOOL,
}
"""``kubernetes.DRADevice``, the type of the ``device`` variable (1.34+ with consumable
capacity, beta and on by default since 1.36)."""

_OBJECTS = frozenset({QUANTITY.name, SEMVER.name, DEVICE.name, TIMESTAMP.name, DURATION.name})
"""Message-like types: ``null`` is assignable to them."""

Bindings = dict[str, CelType]


def _bind_all(target: CelType, value: CelType, bindings: Bindings) -> None:
    """Bind every unbound parameter inside ``target`` to ``value`` (used for dyn)."""
    if target.is_param:
        bindings.setdefault(target.name, value)
    for param in target.params:
        _bind_all(param, value, bindings)


def assignable(target: CelType, actual: CelType, bindings: Bindings) -> bool:
    """Whether a value of type ``actual`` may be passed where ``target`` is declared."""
    if target.is_param:
        bound = bindings.get(target.name)
        if bound is None:
            bindings[target.name] = actual
            return True
        if assignable(bound, actual, {}):
            return True
        if assignable(actual, bound, {}):
            bindings[target.name] = actual  # the more general type wins (dyn over int)
            return True
        return False
    if target in (DYN, ERROR) or actual in (DYN, ERROR):
        _bind_all(target, DYN, bindings)
        return True
    if actual == NULL and target.name in _OBJECTS:
        return True
    if target.name != actual.name or len(target.params) != len(actual.params):
        return False
    return all(assignable(t, a, bindings) for t, a in zip(target.params, actual.params,
                                                          strict=True))


def substitute(declared: CelType, bindings: Bindings) -> CelType:
    """``declared`` with its parameters replaced; parameters left unbound become dyn."""
    if declared.is_param:
        return bindings.get(declared.name, DYN)
    if not declared.params:
        return declared
    return CelType(declared.name, tuple(substitute(p, bindings) for p in declared.params))


Overload = tuple[tuple[CelType, ...], CelType]
"""(parameter types, result type); for a method the receiver is the first parameter."""


def resolve(overloads: Iterable[Overload], args: Sequence[CelType]) -> CelType | None:
    """The result type of a call, or None when no overload accepts the arguments.

    Several matching overloads (a ``dyn`` argument) give their common result type, or dyn.
    """
    found: CelType | None = None
    for params, result in overloads:
        if len(params) != len(args):
            continue
        bindings: Bindings = {}
        if not all(assignable(p, a, bindings) for p, a in zip(params, args, strict=True)):
            continue
        result_type = substitute(result, bindings)
        found = result_type if found is None or found == result_type else DYN
    return found


def join(types: Sequence[CelType]) -> CelType:
    """The element type of a list (or map) literal: the common type, else dyn."""
    if not types:
        return DYN
    first = types[0]
    return first if all(t == first for t in types) else DYN


def signature(name: str, args: Sequence[CelType], *, member: bool) -> str:
    """cel-go's rendering of a failed call: ``'_>=_' applied to '(int, string)'``."""
    if member:
        receiver, rest = args[0], args[1:]
        applied = f"{receiver}.({', '.join(map(str, rest))})"
    else:
        applied = f"({', '.join(map(str, args))})"
    return f"found no matching overload for '{name}' applied to '{applied}'"
