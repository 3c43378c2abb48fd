"""String functions: the CEL standard ones plus ``ext.Strings`` and the Kubernetes regex library.

Regular expressions use RE2 (``google-re2``, a cel-python dependency), as cel-go does, so a
pattern RE2 rejects (lookahead, backreferences) is rejected here too.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from celpy import celtypes

from gpudra.scheduling.cel.errors import cel_error

_re2: Any = importlib.import_module("re2")  # untyped extension module


@lru_cache(maxsize=256)
def compile_regex(pattern: str) -> Any:
    """Compile with RE2; raises ``ValueError`` with RE2's message (no stderr logging)."""
    options = _re2.Options()
    options.log_errors = False
    try:
        return _re2.compile(pattern, options)
    except _re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(f"invalid regular expression {pattern!r}: {detail}") from None


def _str(*values: Any) -> bool:
    return all(isinstance(v, str) for v in values)


def _int(value: Any) -> bool:
    return isinstance(value, celtypes.IntType)


def _overload(name: str) -> Any:
    return cel_error(f"no such overload: string.{name}")


def matches(text: Any, pattern: Any) -> Any:
    if not _str(text, pattern):
        return _overload("matches")
    try:
        return celtypes.BoolType(compile_regex(pattern).search(text) is not None)
    except ValueError as exc:
        return cel_error(str(exc))


def find(text: Any, pattern: Any) -> Any:
    if not _str(text, pattern):
        return _overload("find")
    try:
        found = compile_regex(pattern).search(text)
    except ValueError as exc:
        return cel_error(str(exc))
    return celtypes.StringType(found.group(0) if found is not None else "")


def find_all(text: Any, pattern: Any, limit: Any = None) -> Any:
    if not _str(text, pattern) or (limit is not None and not _int(limit)):
        return _overload("findAll")
    try:
        regex = compile_regex(pattern)
    except ValueError as exc:
        return cel_error(str(exc))
    found = [celtypes.StringType(m.group(0)) for m in regex.finditer(text)]
    if limit is not None and int(limit) >= 0:
        found = found[: int(limit)]
    return celtypes.ListType(found)


def _simple(name: str, fn: Callable[..., Any], arity: int) -> Callable[..., Any]:
    def method(text: Any, *args: Any) -> Any:
        if len(args) != arity or not _str(text, *args):
            return _overload(name)
        return fn(text, *args)

    return method


def lower_ascii(text: Any) -> Any:
    if not _str(text):
        return _overload("lowerAscii")
    return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in text))


def upper_ascii(text: Any) -> Any:
    if not _str(text):
        return _overload("upperAscii")
    return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in text))


def replace(text: Any, old: Any, new: Any, limit: Any = None) -> Any:
    if not _str(text, old, new) or (limit is not None and not _int(limit)):
        return _overload("replace")
    count = -1 if limit is None else int(limit)
    return celtypes.StringType(text.replace(old, new, count))


def split(text: Any, separator: Any, limit: Any = None) -> Any:
    if not _str(text, separator) or (limit is not None and not _int(limit)):
        return _overload("split")
    if limit is not None and int(limit) == 0:
        return celtypes.ListType()
    if separator == "":
        parts = list(text)
        if limit is not None and 0 < int(limit) < len(parts):
            parts = [*parts[: int(limit) - 1], "".join(parts[int(limit) - 1:])]
    else:
        parts = text.split(separator, -1 if limit is None or int(limit) < 0 else int(limit) - 1)
    return celtypes.ListType(celtypes.StringType(p) for p in parts)


def substring(text: Any, start: Any, end: Any = None) -> Any:
    if not _str(text) or not _int(start) or (end is not None and not _int(end)):
        return _overload("substring")
    stop = len(text) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(text):
        return cel_error(f"index out of range: substring({int(start)}, {stop}) of "
                         f"{len(text)} characters")
    return celtypes.StringType(text[int(start):stop])


def char_at(text: Any, index: Any) -> Any:
    if not _str(text) or not _int(index):
        return _overload("charAt")
    if not 0 <= int(index) <= len(text):
        return cel_error(f"index out of range: {int(index)}")
    return celtypes.StringType(text[int(index): int(index) + 1])


def index_of(text: Any, needle: Any, start: Any = None) -> Any:
    if not _str(text, needle) or (start is not None and not _int(start)):
        return _overload("indexOf")
    begin = 0 if start is None else int(start)
    if not 0 <= begin <= len(text):
        return cel_error(f"index out of range: {begin}")
    return celtypes.IntType(text.find(needle, begin))


def last_index_of(text: Any, needle: Any, start: Any = None) -> Any:
    if not _str(text, needle) or (start is not None and not _int(start)):
        return _overload("lastIndexOf")
    end = len(text) if start is None else int(start)
    if not 0 <= end <= len(text):
        return cel_error(f"index out of range: {end}")
    return celtypes.IntType(text.rfind(needle, 0, end + len(needle)))


def join(items: Any, separator: Any = None) -> Any:
    if not isinstance(items, celtypes.ListType) or not _str(*items) or (
            separator is not None and not _str(separator)):
        return cel_error("no such overload: list.join")
    return celtypes.StringType((separator or "").join(str(i) for i in items))


def size(value: Any) -> Any:
    if isinstance(value, str | bytes | celtypes.ListType | celtypes.MapType):
        return celtypes.IntType(len(value))
    return cel_error(f"no such overload: size({type(value).__name__})")


def to_string(value: Any) -> Any:
    """``string(x)``: cel-go's conversions; none for Quantity or Semver ("no such overload",
    as a real scheduler says for ``string(device.attributes[d].driverVersion)``)."""
    if isinstance(value, celtypes.BoolType):
        return celtypes.StringType("true" if value else "false")
    if isinstance(value, celtypes.BytesType):
        try:
            return celtypes.StringType(bytes(value).decode())
        except UnicodeDecodeError:
            return cel_error("invalid UTF-8 in bytes, cannot convert to string")
    if isinstance(value, str | celtypes.IntType | celtypes.UintType | celtypes.DoubleType
                  | celtypes.TimestampType | celtypes.DurationType):
        return celtypes.StringType(str(value))
    return cel_error(f"no such overload: string({type(value).__name__})")


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "matches": matches,
    "find": find,
    "findAll": find_all,
    "contains": _simple("contains", lambda t, s: celtypes.BoolType(s in t), 1),
    "startsWith": _simple("startsWith", lambda t, s: celtypes.BoolType(t.startswith(s)), 1),
    "endsWith": _simple("endsWith", lambda t, s: celtypes.BoolType(t.endswith(s)), 1),
    "lowerAscii": lower_ascii,
    "upperAscii": upper_ascii,
    "trim": _simple("trim", lambda t: celtypes.StringType(t.strip()), 0),
    "reverse": _simple("reverse", lambda t: celtypes.StringType(t[::-1]), 0),
    "replace": replace,
    "split": split,
    "substring": substring,
    "charAt": char_at,
    "indexOf": index_of,
    "lastIndexOf": last_index_of,
    "join": join,
    "size": size,
}
"""String (and ``list.join``) functions, usable as methods: ``x.f(y)`` calls ``f(x, y)``."""
