"""The Kubernetes CEL ``Semver`` library: ``semver()``, ``isSemver()`` and its methods.

Mirrors ``k8s.io/apiserver/pkg/cel/library/semverlib.go`` (blang/semver underneath):
strict semver 2.0.0 unless the optional ``normalize`` argument is true, which accepts a
``v`` prefix, missing minor/patch and leading zeros. ``version`` device attributes are
Semver values too, so ``driverVersion == '580.95.5'`` is an error, as on a real cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celpy import celtypes

from gpudra.driver.shown import shown
from gpudra.scheduling.cel.errors import cel_error

_IDENT = re.compile(r"^[0-9A-Za-z-]+$")


@dataclass(frozen=True, eq=False)
class Semver:
    """A parsed semantic version; equality and order follow semver precedence."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __repr__(self) -> str:
        return f"semver({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Semver):
            return compare(self, other) == 0
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))


_MAX_NUMBER = 2**64 - 1
"""blang/semver keeps each number in a uint64: a longer one is an error there, and here
(a 400-digit version must not be accepted, compared and printed whole)."""


def _number(text: str, what: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"Invalid character(s) found in {what} number {shown(text)}")
    if len(text) > 1 and text[0] == "0":
        raise ValueError(f"{what.capitalize()} number must not contain leading zeroes "
                         f"{shown(text)}")
    if len(text) > len(str(_MAX_NUMBER)):  # before int(): past 4300 digits it raises
        raise ValueError(f"{what.capitalize()} number of {len(text)} digits is out of range "
                         "(at most 2^64-1)")
    if int(text) > _MAX_NUMBER:
        raise ValueError(f"{what.capitalize()} number {text} is out of range (at most 2^64-1)")
    return int(text)


def _identifiers(text: str, what: str, numeric_rules: bool) -> tuple[str, ...]:
    parts = tuple(text.split("."))
    for part in parts:
        if not part:
            raise ValueError(f"{what} is empty")
        if not _IDENT.match(part):
            raise ValueError(f"Invalid character(s) found in {what} {shown(part)}")
        if numeric_rules and part.isdigit() and len(part) > 1 and part[0] == "0":
            raise ValueError(f"{what.capitalize()} must not contain leading zeroes "
                             f"{shown(part)}")
    return parts


def parse(text: str) -> Semver:
    """Strict semver 2.0.0; raises ``ValueError`` worded like blang/semver."""
    if not text:
        raise ValueError("Version string empty")
    core, _, build = text.partition("+")
    core, dash, pre = core.partition("-")
    numbers = core.split(".")
    if len(numbers) != 3:
        raise ValueError("No Major.Minor.Patch elements found")
    major = _number(numbers[0], "major")
    minor = _number(numbers[1], "minor")
    patch = _number(numbers[2], "patch")
    pre_ids = _identifiers(pre, "prerelease", True) if dash else ()
    build_ids = _identifiers(build, "build metadata", False) if "+" in text else ()
    return Semver(major, minor, patch, pre_ids, build_ids)


def normalize(text: str) -> str:
    """What ``semver(s, true)`` accepts: ``v1.2`` → ``1.2.0``, ``01.02.03`` → ``1.2.3``."""
    text = text.removeprefix("v")
    core_end = len(text)
    for marker in ("-", "+"):
        index = text.find(marker)
        if index != -1:
            core_end = min(core_end, index)
    numbers = text[:core_end].split(".")
    if len(numbers) > 3:
        return text
    numbers = [(n.lstrip("0") or "0") if n.isdigit() else n for n in numbers]
    numbers += ["0"] * (3 - len(numbers))
    return ".".join(numbers) + text[core_end:]


def compare(a: Semver, b: Semver) -> int:
    """Semver precedence: build metadata is ignored, a pre-release sorts before its release."""
    left = (a.major, a.minor, a.patch)
    right = (b.major, b.minor, b.patch)
    if left != right:
        return -1 if left < right else 1
    if a.pre == b.pre:
        return 0
    if not a.pre or not b.pre:
        return 1 if not a.pre else -1
    for x, y in zip(a.pre, b.pre, strict=False):
        if x == y:
            continue
        if x.isdigit() and y.isdigit():
            return -1 if int(x) < int(y) else 1
        if x.isdigit() != y.isdigit():
            return -1 if x.isdigit() else 1
        return -1 if x < y else 1
    return -1 if len(a.pre) < len(b.pre) else 1


def _parse_arg(text: Any, flag: Any) -> Semver:
    if not isinstance(text, str) or (flag is not None and not isinstance(flag, celtypes.BoolType)):
        raise TypeError("no such overload")
    return parse(normalize(text) if flag else text)


def semver(text: Any, flag: Any = None) -> Any:
    try:
        return _parse_arg(text, flag)
    except TypeError:
        return cel_error("no such overload: semver() takes a string (and a bool)")
    except ValueError as exc:
        return cel_error(f"invalid semver {shown(str(text))}: {exc}")


def is_semver(text: Any, flag: Any = None) -> Any:
    try:
        _parse_arg(text, flag)
    except TypeError:
        return cel_error("no such overload: isSemver() takes a string (and a bool)")
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _other(name: str, other: Any) -> Semver | Any:
    if isinstance(other, Semver):
        return other
    return cel_error(f"no such overload: Semver.{name}() takes a Semver")


def compare_to(v: Semver, other: Any) -> Any:
    o = _other("compareTo", other)
    return celtypes.IntType(compare(v, o)) if isinstance(o, Semver) else o


def is_greater_than(v: Semver, other: Any) -> Any:
    o = _other("isGreaterThan", other)
    return celtypes.BoolType(compare(v, o) > 0) if isinstance(o, Semver) else o


def is_less_than(v: Semver, other: Any) -> Any:
    o = _other("isLessThan", other)
    return celtypes.BoolType(compare(v, o) < 0) if isinstance(o, Semver) else o


GLOBALS: dict[str, Callable[..., Any]] = {"semver": semver, "isSemver": is_semver}
METHODS: dict[str, Callable[..., Any]] = {
    "compareTo": compare_to,
    "isGreaterThan": is_greater_than,
    "isLessThan": is_less_than,
    "major": lambda v: celtypes.IntType(v.major),
    "minor": lambda v: celtypes.IntType(v.minor),
    "patch": lambda v: celtypes.IntType(v.patch),
}
"""Methods on a Semver receiver, by CEL name."""
