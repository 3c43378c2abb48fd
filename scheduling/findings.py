"""What ``validate`` reports: one ``Problem`` per finding, collected by a ``Checker``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One finding: ``path`` is the field path inside the object."""

    path: str
    message: str
    warning: bool = False
    structural: bool = True
    """The apiserver would refuse the object; False for what only goes wrong later (CEL
    that cannot match or fails at scheduling time, opaque configs the driver rejects)."""


class Checker:
    """Collects the problems of one object, checked for ``driver``."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.problems: list[Problem] = []

    def error(self, path: str, message: str, *, structural: bool = True) -> None:
        self.problems.append(Problem(path, message, structural=structural))

    def later(self, path: str, message: str) -> None:
        """A problem the apiserver lets through: it shows at scheduling or prepare time."""
        self.error(path, message, structural=False)

    def warn(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, warning=True, structural=False))

    def names(self, path: str, value: Any, check: Callable[[str], list[str]],
              required: bool = True) -> None:
        if value is None or value == "":
            if required:
                self.error(path, "Required value")
            return
        if not isinstance(value, str):
            self.error(path, f"Invalid value: {value!r}: must be a string")
            return
        for message in check(value):
            self.error(path, f"Invalid value: {value!r}: {message}")

    def limit(self, path: str, items: Any, maximum: int) -> list[Any]:
        if items is None:
            return []
        if not isinstance(items, list):
            self.error(path, f"Invalid value: must be a list, got {type(items).__name__}")
            return []
        if len(items) > maximum:
            self.error(path, f"Too many: {len(items)}: must have at most {maximum} items")
        return items
