"""Values from files and peers, shown in one bounded line: a hostile or corrupt input (a
400-digit version, a megabyte string) must not become a megabyte log line or error."""

from __future__ import annotations

import math

MAX_DIGITS = 20
"""Longer integers are described by their length, not printed."""
MAX_CHARS = 64
"""Longer texts are cut, saying how long they were."""


def shown(value: object, limit: int = MAX_CHARS) -> str:
    """``repr(value)`` when short; otherwise a bounded description of it."""
    if isinstance(value, int) and not isinstance(value, bool):
        digits = _digits(value)
        if digits > MAX_DIGITS:
            return f"a {digits}-digit number"
        return str(value)
    if isinstance(value, str):
        if len(value) > limit:
            return f"{value[:limit]!r}… ({len(value)} characters)"
        return repr(value)
    text = repr(value) if _cheap(value) else f"a {type(value).__name__}"
    return text if len(text) <= limit else f"{text[:limit]}… ({type(value).__name__})"


def _digits(value: int) -> int:
    """Decimal digits of ``value`` without ``str()`` (which refuses past 4300 digits)."""
    magnitude = abs(value)
    if magnitude < 10:
        return 1
    estimate = int(magnitude.bit_length() * math.log10(2))
    return estimate + (1 if magnitude >= 10 ** estimate else 0)


def _cheap(value: object) -> bool:
    """Whether ``repr`` is bounded by the value's own size (no nested containers)."""
    return isinstance(value, float | bool | type(None) | bytes)
