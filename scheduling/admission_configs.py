"""The opaque-config rules of ``gpudra.api.configs`` as CEL, for the chart's admission policy.

The input is the JSON schema pydantic writes for each config kind (plus the ``x-gpudra-*``
keys where the models keep their cross-field rules); the output is one CEL expression that
lists the problems of a config ``p`` as strings, each ``.<field path>: <message>`` (or
``: <message>`` for the config as a whole) with the decoder's own path and wording, so
``kubectl apply`` shows what ``gpudra validate`` shows.

The expression follows the schema's tree, and keeps pydantic's order of work where it
changes the answer: nothing inside a field is checked once the field has the wrong type, and
a rule across fields (a model validator) speaks only when every field under it is valid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpudra.api.configs import (
    EMPTY_DEVICE_KEY,
    GROUP_VERSION,
    QUANTITY_FORMAT,
    UNSUPPORTED_KIND,
    config_schemas,
)
from gpudra.api.quantity import parse_quantity

Schema = Mapping[str, Any]
KEY: Final = "k"
"""The comprehension variable over the keys of a map (never nested in itself)."""
NO_PROBLEMS: Final = "[]"
# Types by example, not by name: ``type(x) == string`` is the same in cel-go, but an
# environment that binds ``string`` to a conversion function alone would break it.
STRING: Final = "type('')"
INT: Final = "type(0)"
MAP: Final = "type({})"


class SchemaNotSupported(ValueError):
    """The config schema uses a construct this generator cannot turn into CEL."""


def lit(text: str) -> str:
    """A CEL string literal (single quotes; backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _strings(items: Iterable[str]) -> str:
    return "[" + ", ".join(lit(i) for i in items) + "]"


@dataclass(frozen=True)
class Path:
    """Where a value is: its CEL expression, and its path as the decoder prints it."""

    expr: str
    shown: str
    """The path with a leading ``.`` (empty: the config itself); may end in a CEL suffix."""
    key: str | None = None
    """CEL string expression appended to ``shown`` (a map key), if any."""

    def field(self, name: str) -> Path:
        if self.key is not None:
            raise SchemaNotSupported("fields under a map's values")
        return Path(f"{self.expr}.{name}", f"{self.shown}.{name}")

    def entry(self) -> Path:
        """The value under key ``k`` of this map, shown as ``field[<k>]``."""
        return Path(f"{self.expr}[{KEY}]", self.shown, f"'[' + {KEY} + ']'")

    def unknown(self) -> Path:
        """Key ``k`` of this object, as a field: ``.sharing.<k>``."""
        return Path(f"{self.expr}[{KEY}]", self.shown, f"'.' + {KEY}")

    def problem(self, message: str) -> str:
        """CEL string ``<path>: <message>`` (``message`` is plain text)."""
        return self.problem_cel(lit(message))

    def problem_cel(self, message: str) -> str:
        """CEL string ``<path>: <message>`` (``message`` is a CEL string expression)."""
        head = lit(self.shown) if self.key is None else (
            f"{lit(self.shown)} + {self.key}" if self.shown else self.key)
        if message.startswith("'") and self.key is None:
            return lit(self.shown + ": ")[:-1] + message[1:]
        return f"{head} + ': ' + {message}"


def _enum_message(values: list[Any]) -> str:
    """pydantic's ``literal_error`` message."""
    shown = [f"'{v}'" for v in values]
    listed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
    return f"Input should be {listed}"


def _quoted(value: str) -> str:
    """CEL for ``configs.quoted``: strings as ``'text'``, numbers plain."""
    return f"(type({value}) == {STRING} ? \"'\" + {value} + \"'\" : string({value}))"


def _first(*cases: tuple[str, str]) -> str:
    """CEL: the message of the first case whose condition holds, as a one-item list."""
    out = NO_PROBLEMS
    for condition, message in reversed(cases):
        out = f"{condition} ? [{message}] : {out}"
    return f"({out})"


class _Walker:
    def __init__(self, schema: Schema) -> None:
        self.defs: Schema = schema.get("$defs", {})
        self.depth = 0
        self.in_entry = False

    def resolve(self, node: Schema) -> tuple[Schema, bool]:
        """The node behind ``$ref``/``anyOf [x, null]``, and whether null is allowed."""
        nullable = False
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            nullable = len(options) < len(node["anyOf"])
            if len(options) != 1:
                raise SchemaNotSupported(f"a union of {len(options)} non-null types")
            node = options[0]
        if "$ref" in node:
            node = self.defs[node["$ref"].rsplit("/", 1)[-1]]
        return node, nullable

    def bind(self, at: Path, prefix: str) -> tuple[Path, str]:
        """A short name for the value at ``at``: CEL ``[<value>].map(<name>, …)[0]``."""
        self.depth += 1
        name = f"{prefix}{self.depth}"
        return Path(name, at.shown, at.key), f"[{at.expr}].map({name}, "

    def value(self, node: Schema, at: Path) -> str:
        """CEL list of the problems of the value at ``at`` (present, not null)."""
        v = at.expr
        if node.get("format") == "quantity":
            bound, head = self.bind(at, "q")
            return f"{head}{self.quantity(node, bound)})[0]"
        if "enum" in node:
            return _first((f"!({v} in {_strings(node['enum'])})",
                           at.problem(_enum_message(node["enum"]))))
        kind = node.get("type")
        if kind == "integer":
            cases = [(f"type({v}) != {INT}", at.problem("Input should be a valid integer"))]
            if "minimum" in node:
                cases.append((f"{v} < {int(node['minimum'])}", at.problem(
                    f"Input should be greater than or equal to {node['minimum']}")))
            if "maximum" in node:
                cases.append((f"{v} > {int(node['maximum'])}", at.problem(
                    f"Input should be less than or equal to {node['maximum']}")))
            return _first(*cases)
        if kind == "object" and "properties" in node:
            return self.model(node, at)
        if kind == "object" and isinstance(node.get("additionalProperties"), Mapping):
            return self.map(node, at)
        raise SchemaNotSupported(f"schema node {dict(node)!r}")

    def quantity(self, node: Schema, at: Path) -> str:
        v = at.expr
        cases = [
            (f"!(type({v}) == {STRING} || type({v}) == {INT})",
             at.problem("must be a quantity such as '8Gi'")),
            (f"type({v}) == {STRING} && !isQuantity({v})",
             at.problem_cel(f"'invalid quantity ' + {_quoted(v)} + {lit(': ' + QUANTITY_FORMAT)}")),
        ]
        minimum = node.get("x-gpudra-quantity-minimum")
        if minimum is not None:
            cases.append((
                f"(type({v}) == {INT} ? {v} < {int(parse_quantity(minimum))} : "
                f"quantity({v}).compareTo(quantity({lit(minimum)})) < 0)",
                at.problem_cel(f"{lit(f'must be at least {minimum}, got ')} + {_quoted(v)}")))
        return _first(*cases)

    def map(self, node: Schema, at: Path) -> str:
        """A ``dict[str, V]``: every bad value is a problem of its own, named by its key."""
        if self.in_entry:
            raise SchemaNotSupported("a map inside a map's values")
        self.in_entry = True
        problems = self.value(node["additionalProperties"], at.entry())
        self.in_entry = False
        # A value's list has at most one problem (its first): one problem per bad key.
        self.depth += 1
        found = f"found{self.depth}"
        each = (f"{at.expr}.map({KEY}, {problems}).filter({found}, size({found}) > 0)"
                f".map({found}, {found}[0])")
        return (f"(type({at.expr}) != {MAP} ? [{at.problem('Input should be a valid dictionary')}]"
                f" : {each})")

    def model(self, node: Schema, at: Path) -> str:
        """A pydantic model: its type, unknown and required fields, fields, then its rules."""
        if self.in_entry:
            raise SchemaNotSupported("a model inside a map's values")
        if at.expr.isidentifier():
            return self.bound_model(node, at)
        bound, head = self.bind(at, "m")
        return f"{head}{self.bound_model(node, bound)})[0]"

    def bound_model(self, node: Schema, at: Path) -> str:
        v = at.expr
        title = node.get("title", "object")
        known = list(node["properties"])
        parts = [f"{v}.filter({KEY}, !({KEY} in {_strings(known)}))"
                 f".map({KEY}, {at.unknown().problem('unknown field')})"]
        for name in node.get("required", ()):
            if "const" not in node["properties"][name]:  # apiVersion/kind: the discriminator's
                parts.append(_first((f"!has({v}.{name})",
                                     at.field(name).problem("Field required"))))
        for name, prop in node["properties"].items():
            if "const" in prop:
                continue
            resolved, nullable = self.resolve(prop)
            child = at.field(name)
            present = f"has({child.expr})" + (f" && {child.expr} != null" if nullable else "")
            problems = self.value(resolved, child)
            if "x-gpudra-nonempty-keys" in prop:  # a field validator: after the entries
                problems = self.after(problems, _first((
                    f"{child.expr}.exists({KEY}, {KEY} == '')", child.problem(EMPTY_DEVICE_KEY))))
            parts.append(f"({present} ? {problems} : {NO_PROBLEMS})")
        fields = "\n  + ".join(parts)
        rules = self.rules(node, at)
        body = self.after(f"({fields})", rules) if rules else f"({fields})"
        return (f"(type({v}) != {MAP} ? "
                f"[{at.problem(f'Input should be a valid dictionary or instance of {title}')}]"
                f" : {body})")

    def after(self, problems: str, more: str) -> str:
        """CEL: ``problems``, and when there are none, ``more`` (a model validator)."""
        self.depth += 1
        name = f"found{self.depth}"
        return f"[{problems}].map({name}, size({name}) > 0 ? {name} : {more})[0]"

    def rules(self, node: Schema, at: Path) -> str:
        """The ``x-gpudra-*`` rules of a model (all its fields valid), as a CEL list."""
        v = at.expr
        cases: list[tuple[str, str]] = []
        for field, strategy in node.get("x-gpudra-only-with-strategy", {}).items():
            cases.append((f"{v}.strategy != {lit(strategy)} && has({v}.{field}) && "
                          f"{v}.{field} != null",
                          at.problem(f"{field} is only valid with strategy {strategy}")))
        for strategy, rule in node.get("x-gpudra-compute-mode-of-strategy", {}).items():
            mode, sharing = f"{v}.computeMode", f"{v}.sharing"
            why = f" conflicts with sharing strategy {strategy}, which {rule['because']}"
            cases.append((f"has({mode}) && {mode} != null && {mode} != {lit(rule['computeMode'])}"
                          f" && has({sharing}) && {sharing} != null && "
                          f"{sharing}.strategy == {lit(strategy)}",
                          at.problem_cel(f"'computeMode ' + {mode} + {lit(why)}")))
        # One model validator checks them in this order and raises at the first.
        return _first(*cases) if cases else ""


def _field_shown(expr: str, name: str) -> str:
    """CEL for ``configs.shown_field``: how the unsupported-kind message shows a field."""
    value = f"{expr}.{name}"
    return (f"(!has({value}) || {value} == null ? 'no {name}' : type({value}) == {STRING} ? "
            f"'{name} \\'' + {value} + '\\'' : 'a non-string {name}')")


def problems_expression(param: str = "p", schemas: Mapping[str, Schema] | None = None) -> str:
    """CEL list of the problem strings (``.<path>: <message>``) of config ``param``."""
    schemas = config_schemas() if schemas is None else schemas
    root = Path(param, "")
    ours = (f"has({param}.apiVersion) && {param}.apiVersion == {lit(GROUP_VERSION)} && "
            f"has({param}.kind) && {param}.kind in {_strings(schemas)}")
    unsupported = root.problem_cel(
        f"{lit(UNSUPPORTED_KIND + ' (got ')} + {_field_shown(param, 'apiVersion')} + ', ' + "
        f"{_field_shown(param, 'kind')} + ')'")
    kinds = NO_PROBLEMS
    for kind, schema in reversed(list(schemas.items())):
        kinds = f"{param}.kind == {lit(kind)} ? {_Walker(schema).model(schema, root)}\n: {kinds}"
    return f"!({ours}) ? [{unsupported}]\n: {kinds}"
