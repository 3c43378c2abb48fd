"""``fieldSelector`` and ``labelSelector`` parsing and matching.

Field selectors: ``a=b``, ``a==b``, ``a!=b`` joined by commas (with ``\\,`` ``\\=`` ``\\\\``
escapes), only on the field labels a resource supports; an unknown label is a 400 like the
apiserver's. Label selectors: equality (``=``, ``==``, ``!=``) and set-based (``in``,
``notin``, ``key``, ``!key``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpudra.testing.fakeapi.errors import ApiError, bad_request

Obj = dict[str, Any]
FieldGetter = Callable[[Obj], str]


@dataclass(frozen=True)
class FieldTerm:
    field: str
    op: str  # "=" or "!="
    value: str


@dataclass(frozen=True)
class LabelTerm:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, i = [], "", 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current += text[i: i + 2]
            i += 2
            continue
        if ch == sep:
            parts.append(current)
            current = ""
        else:
            current += ch
        i += 1
    parts.append(current)
    return parts


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_field_selector(text: str) -> list[FieldTerm]:
    terms = []
    for part in _split_unescaped(text, ","):
        raw = part.strip()
        if not raw:
            continue
        for op, norm in (("!=", "!="), ("==", "="), ("=", "=")):
            idx = raw.find(op)
            if idx > 0:
                terms.append(FieldTerm(raw[:idx].strip(), norm, _unescape(raw[idx + len(op):])))
                break
        else:
            raise bad_request(f'invalid selector: \'{text}\'; can\'t understand \'{raw}\'')
    return terms


_SET_RE = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*(?:(in|notin)\s*\((.*)\))?\s*$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses (set-based values contain commas)."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text: str) -> list[LabelTerm]:
    terms = []
    for raw in _split_top_level(text):
        for op, norm in (("!=", "!="), ("==", "="), ("=", "=")):
            idx = raw.find(op)
            if idx > 0 and "(" not in raw:
                terms.append(LabelTerm(raw[:idx].strip(), norm, (raw[idx + len(op):].strip(),)))
                break
        else:
            match = _SET_RE.match(raw)
            if match is None:
                raise bad_request(f"unable to parse requirement: {raw!r}")
            negate, key, set_op, values = match.groups()
            if set_op:
                if negate:
                    raise bad_request(f"unable to parse requirement: {raw!r}")
                items = tuple(v.strip() for v in values.split(",") if v.strip())
                terms.append(LabelTerm(key, set_op, items))
            else:
                terms.append(LabelTerm(key, "!exists" if negate else "exists"))
    return terms


def _label_ok(term: LabelTerm, labels: Mapping[str, str]) -> bool:
    present = term.key in labels
    value = labels.get(term.key)
    if term.op == "exists":
        return present
    if term.op == "!exists":
        return not present
    if term.op in ("=", "in"):
        return present and value in term.values
    return not present or value not in term.values  # "!=" and "notin"


def labels_match(terms: list[LabelTerm], labels: Mapping[str, str]) -> bool:
    return all(_label_ok(term, labels) for term in terms)


def fields_match(terms: list[FieldTerm], obj: Obj, getters: Mapping[str, FieldGetter]) -> bool:
    for term in terms:
        actual = getters[term.field](obj)
        if (actual == term.value) != (term.op == "="):
            return False
    return True


def check_field_labels(terms: list[FieldTerm], getters: Mapping[str, FieldGetter],
                       gvr: str, field_text: str, label_text: str) -> None:
    """Reject unsupported field labels with the apiserver's 400 message."""
    for term in terms:
        if term.field not in getters:
            raise ApiError(400, "BadRequest",
                           f'Unable to find "{gvr}" that match label selector "{label_text}", '
                           f'field selector "{field_text}": field label not supported: '
                           f"{term.field}")


def path_getter(*path: str) -> FieldGetter:
    """A field-label getter reading a nested value; missing or null reads as ""."""

    def get(obj: Obj) -> str:
        value: Any = obj
        for key in path:
            if not isinstance(value, dict):
                return ""
            value = value.get(key)
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return get


@dataclass(frozen=True)
class Selector:
    """A parsed field + label selector, ready to test objects."""

    fields: tuple[FieldTerm, ...]
    labels: tuple[LabelTerm, ...]
    getters: Mapping[str, FieldGetter]

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return (fields_match(list(self.fields), obj, self.getters)
                and labels_match(list(self.labels), labels))
