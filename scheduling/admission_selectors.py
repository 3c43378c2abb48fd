"""Selector names checked against the catalog at apply time: CEL for the chart's Warn policy.

A selector that reads ``device.attributes['<driver>'].productNmae`` compiles, and then fails
every allocation. The policy finds the names a CEL selector (or a ``matchAttribute`` /
``distinctAttribute`` constraint) reads in the driver's own domain, with a regular
expression, and warns about each one ``scheduling.catalog`` does not list, naming the
published name it is one typo away from (``near``: one letter changed, added, dropped or
two swapped, ignoring case).

Kubernetes CEL has no flatten before 1.33, so lists of findings are flattened by joining
them into one string and splitting it again (paths and names contain no newline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

from gpudra.api.api_limits import (
    DEVICE_CONSTRAINTS_MAX_SIZE,
    DEVICE_REQUESTS_MAX_SIZE,
    DEVICE_SELECTORS_MAX_SIZE,
    FIRST_AVAILABLE_DEVICE_REQUEST_MAX_SIZE,
)
from gpudra.driver.device_model import MEMORY_SLICE_CAPACITY
from gpudra.scheduling.admission_configs import lit
from gpudra.scheduling.catalog import ATTRIBUTES, CAPACITIES, REMOVED

ATTRIBUTE_NAMES: Final = tuple(ATTRIBUTES)
CAPACITY_NAMES: Final = CAPACITIES
MEMORY_SLICE_PATTERN: Final = f"^{MEMORY_SLICE_CAPACITY}[0-9]+$"
_SEP: Final = "\\n"
"""CEL escape of the newline that joins findings before they are split again."""
_FIELD_SEP: Final = "|"
_NAME_END: Final = (r"(\.\s*\??\s*[A-Za-z_][A-Za-z0-9_]*|"
                    r"\[\s*\??\s*[\"\x27][A-Za-z_][A-Za-z0-9_]*[\"\x27]\s*\])")
"""What follows ``device.<field>['<domain>']``: ``.name``, ``.?name`` or ``['name']``."""


def reference_pattern(field: str) -> str:
    """CEL string expression: the regex of one ``device.<field>['<driver>']<name>`` read."""
    head = rf"device\s*\.\s*{field}\s*\[\s*[\"\x27]"
    tail = rf"[\"\x27]\s*\]\s*{_NAME_END}"
    return f"r'{head}' + variables.driver.replace('.', '[.]') + r'{tail}'"


# --- "did you mean": the same test in Python (for tests) and CEL ----------------------------

def near(name: str, known: str) -> bool:
    """``name`` is one typo from ``known``: a letter changed, added or dropped, two swapped
    (case ignored)."""
    a, b = name.lower(), known.lower()
    if a == b:
        return True
    if len(a) == len(b):
        diff = [j for j in range(len(a)) if a[j] != b[j]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    longer, shorter = (a, b) if len(a) > len(b) else (b, a)
    return len(longer) == len(shorter) + 1 and any(
        longer[:j] + longer[j + 1:] == shorter for j in range(len(longer)))


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    return next((c for c in candidates if near(name, c)), None)


def _indexes(size: int) -> str:
    return "[" + ", ".join(str(i) for i in range(size)) + "]"


def _near_cel(a: str, b: str, indexes: str) -> str:
    """CEL for :func:`near` on two lower-case strings ``a`` and ``b``.

    Guards are ternaries, not ``&&``: cel-go short-circuits either, but an evaluator that
    runs both sides of ``&&`` must not index past the end of the shorter string.
    """
    def dropped(longer: str, shorter: str) -> str:
        return (f"(size({longer}) == size({shorter}) + 1 ? {indexes}.exists(j, j < size({longer})"
                f" ? {longer}.substring(0, j) + {longer}.substring(j + 1) == {shorter} : false)"
                " : false)")
    same = (f"(size({a}) == size({b}) ? [{indexes}.filter(j, j < size({a}) ? "
            f"{a}.charAt(j) != {b}.charAt(j) : false)].exists(d, size(d) == 1 || "
            f"(size(d) == 2 ? d[1] == d[0] + 1 && {a}.charAt(d[0]) == {b}.charAt(d[1]) && "
            f"{a}.charAt(d[1]) == {b}.charAt(d[0]) : false)) : false)")
    return f"{a} == {b} || {same} || {dropped(a, b)} || {dropped(b, a)}"


def _hint(name: str, candidates: Sequence[str]) -> str:
    """CEL string: `` (did you mean 'x'?)`` for the first near candidate, else ``''``."""
    indexes = _indexes(max(len(c) for c in candidates) + 2)
    listed = "[" + ", ".join(lit(c) for c in candidates) + "]"
    hits = (f"[{name}.lowerAscii()].map(a, {listed}.filter(c, [c.lowerAscii()].exists(b, "
            f"{_near_cel('a', 'b', indexes)})))[0]")
    return f"[{hits}].map(h, size(h) > 0 ? \" (did you mean '\" + h[0] + \"'?)\" : '')[0]"


# --- finding the names ---------------------------------------------------------------------

def _names(expression: str, field: str) -> str:
    """CEL list: the names read as ``device.<field>['<driver>'].<name>`` in ``expression``."""
    return (f"{expression}.findAll({reference_pattern(field)}).map(m, "
            f"m.substring(m.indexOf(']') + 1).find('[A-Za-z_][A-Za-z0-9_]*'))")


def _unknown_attribute(name: str) -> str:
    return f"!({name} in {_strings(ATTRIBUTE_NAMES)})"


def _unknown_capacity(name: str) -> str:
    return (f"!({name} in {_strings(CAPACITY_NAMES)} || "
            f"{name}.matches({lit(MEMORY_SLICE_PATTERN)}))")


def _strings(items: Iterable[str]) -> str:
    return "[" + ", ".join(lit(i) for i in items) + "]"


def _records(kind: str, path: str, names: str, unknown: Callable[[str], str]) -> str:
    """CEL list of ``kind|path|name`` records for the unknown ones among ``names``."""
    return (f"{names}.filter(n, {unknown('n')})"
            f".map(n, {lit(kind + _FIELD_SEP)} + {path} + {lit(_FIELD_SEP)} + n)")


def _expression_findings(expression: str, path: str) -> str:
    """CEL string: the findings of one selector expression, newline-separated."""
    attributes = _records("attribute", path, _names(expression, "attributes"),
                          _unknown_attribute)
    capacities = _records("capacity", path, _names(expression, "capacity"), _unknown_capacity)
    return f"({attributes} + {capacities}).join('{_SEP}')"


def _join(items: str) -> str:
    """CEL: a list of finding strings (each maybe empty) as one newline-separated string."""
    return f"{items}.filter(x, x != '').join('{_SEP}')"


def _selectors(selectors: str, path: str, var: str) -> str:
    """CEL string: the findings of a list of selectors at ``path`` (a CEL string)."""
    entry = f"{selectors}[{var}]"
    where = f"{path} + '[' + string({var}) + '].cel.expression'"
    return _join(f"{_indexes(DEVICE_SELECTORS_MAX_SIZE)}.filter({var}, {var} < size({selectors}))"
                 f".map({var}, has({entry}.cel) && has({entry}.cel.expression) ? "
                 f"{_expression_findings(f'{entry}.cel.expression', where)} : '')")


def _requests(devices: str, where: str) -> str:
    requests = f"{devices}.requests"
    r = f"{requests}[i]"
    at = f"{where} + '.requests[' + string(i) + ']'"
    exactly_at = f"{at} + {lit('.exactly.selectors')}"
    exactly = (f"has({r}.exactly) && has({r}.exactly.selectors) ? "
               f"{_selectors(f'{r}.exactly.selectors', exactly_at, 's')} : ''")
    sub = f"{r}.firstAvailable[f]"
    sub_at = f"{at} + '.firstAvailable[' + string(f) + '].selectors'"
    first = (f"has({r}.firstAvailable) ? "
             + _join(f"{_indexes(FIRST_AVAILABLE_DEVICE_REQUEST_MAX_SIZE)}.filter(f, f < size("
                     f"{r}.firstAvailable)).map(f, has({sub}.selectors) ? "
                     f"{_selectors(f'{sub}.selectors', sub_at, 't')} : '')")
             + " : ''")
    return (f"has({requests}) ? " + _join(
        f"{_indexes(DEVICE_REQUESTS_MAX_SIZE)}.filter(i, i < size({requests})).map(i, "
        f"{_join(f'[{exactly}, {first}]')})") + " : ''")


def _constraints(devices: str, where: str) -> str:
    constraints = f"{devices}.constraints"
    c = f"{constraints}[i]"
    records = []
    for key in ("matchAttribute", "distinctAttribute"):
        value = f"{c}.{key}"
        records.append(
            f"(has({value}) && {value}.startsWith(variables.driver + '/') && "
            f"{_unknown_attribute(f'{value}.substring(size(variables.driver) + 1)')} ? "
            f"{lit('attribute' + _FIELD_SEP)} + {where} + '.constraints[' + string(i) + "
            f"'].{key}{_FIELD_SEP}' + {value}.substring(size(variables.driver) + 1) : '')")
    return (f"has({constraints}) ? " + _join(
        f"{_indexes(DEVICE_CONSTRAINTS_MAX_SIZE)}.filter(i, i < size({constraints})).map(i, "
        f"{_join('[' + ', '.join(records) + ']')})") + " : ''")


def findings_expression() -> str:
    """CEL string: ``kind|path|name`` of every unknown name in ``object``, newline-separated.

    Needs ``variables.driver``; works on DeviceClasses, ResourceClaims and templates.
    """
    devices = "variables.devices"
    return (f"has(object.spec.selectors) ? "
            f"{_selectors('object.spec.selectors', lit('spec.selectors'), 's')} : "
            + _join(f"[{_requests(devices, 'variables.where')}, "
                    f"{_constraints(devices, 'variables.where')}]"))


def message_expression(record: str) -> str:
    """CEL string: the warning for one ``kind|path|name`` record."""
    fields = f"{record}.split('{_FIELD_SEP}')"
    removed = "{" + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in REMOVED.items()) + "}"
    name = "r[2]"
    attribute = (f"r[1] + ': ' + variables.driver + '/' + {name} + ': ' + ({name} in {removed} ? "
                 f"{removed}[{name}] : 'no such attribute: this driver never publishes it' + "
                 f"{_hint(name, ATTRIBUTE_NAMES)})")
    capacity = (f"r[1] + ': ' + variables.driver + '/' + {name} + ': no such capacity: this "
                f"driver never publishes it' + {_hint(name, CAPACITY_NAMES)}")
    return f"[{fields}].map(r, r[0] == 'attribute' ? {attribute} : {capacity})[0]"
