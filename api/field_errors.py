"""apimachinery's ``field.Error``, and the apiserver's 422 message built from a list of them.

Rendered as the apiserver renders them (``k8s.io/apimachinery/pkg/util/validation/field``
at ``api_limits.KUBERNETES_VERSION``): a local check can then fail with the words the
apiserver would have used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

RESOURCE_SLICE_KIND: Final = "ResourceSlice.resource.k8s.io"
"""The qualified kind the apiserver names in its "is invalid" messages."""

ErrorType = Literal[
    "Invalid value",
    "Required value",
    "Too many",
    "Duplicate value",
    "Unsupported value",
    "Too long",
    "Forbidden",
]


@dataclass(frozen=True)
class FieldError:
    """One field-level problem, rendered exactly like apimachinery's ``field.Error``."""

    field: str
    type: ErrorType
    value: object = ""
    detail: str = ""

    def __str__(self) -> str:
        # Go omits the value for these types (a too-long value would swamp the message).
        body: str = self.type
        if self.type not in ("Required value", "Forbidden", "Too long"):
            body = f"{self.type}: {render_value(self.value)}"
        if self.detail:
            body += f": {self.detail}"
        return f"{self.field}: {body}"


def format_invalid(
    name: str, errors: Sequence[FieldError], *, kind: str = RESOURCE_SLICE_KIND
) -> str:
    """The apiserver's 422 message: ``<kind> "<name>" is invalid: [e1, e2]``.

    Like ``errors.NewInvalid`` + ``ErrorList.ToAggregate``: identical messages collapse, and
    brackets appear only around two or more.
    """
    messages = list(dict.fromkeys(str(error) for error in errors))
    head = f"{kind} {go_quote(name)} is invalid"
    if not messages:
        return head
    if len(messages) == 1:
        return f"{head}: {messages[0]}"
    return f"{head}: [{', '.join(messages)}]"


# --- rendering --------------------------------------------------------------------------------


def render_value(value: object) -> str:
    """Render a bad value like Go's ``%q``/``%v``; composite values as compact JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return go_quote(value)
    # Go prints structs with %#v, which has no Python equivalent; JSON is the readable stand-in.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


_GO_ESCAPES: Final = {
    '"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f",
    "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
}


def go_quote(text: str) -> str:
    """``strconv.Quote``: escape quotes, backslashes and non-printable runes."""
    out = []
    for char in text:
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


# --- constructors (named after apimachinery's field package) -------------------------------


def invalid(path: str, value: object, detail: str) -> FieldError:
    return FieldError(path, "Invalid value", value, detail)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, "Required value", "", detail)


def too_long(path: str, max_length: int) -> FieldError:
    # The wording of apimachinery since 1.32 (it said "must have at most N bytes" before).
    unit = "byte" if max_length == 1 else "bytes"
    return FieldError(path, "Too long", "", f"may not be more than {max_length} {unit}")


def too_many(path: str, actual: int, max_items: int) -> FieldError:
    unit = "item" if max_items == 1 else "items"
    return FieldError(path, "Too many", actual, f"must have at most {max_items} {unit}")


def duplicate(path: str, value: object, detail: str = "") -> FieldError:
    return FieldError(path, "Duplicate value", value, detail)


def not_supported(path: str, value: object, supported: Iterable[str]) -> FieldError:
    detail = "supported values: " + ", ".join(go_quote(v) for v in supported)
    return FieldError(path, "Unsupported value", value, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(path, "Forbidden", "", detail)


def key_path(path: str, key: str, max_length: int) -> str:
    """``fldPath.Key(truncateIfTooLong(key))``: long keys shortened in the middle."""
    max_length = max(max_length, 16)
    if len(key) > max_length:
        remaining = max_length - 3
        key = key[: (remaining + 1) // 2] + "..." + key[len(key) - remaining // 2 :]
    return f"{path}[{key}]"
