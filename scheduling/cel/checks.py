"""Static analysis of a parsed selector: what Kubernetes rejects at create time, and what it reads.

cel-go checks selectors when a claim or class is created; celpy does not. This walk finds
undeclared functions and identifiers, unknown ``device`` fields and invalid regex literals;
``typecheck`` then checks the types. On the way, the walk records which
``device.attributes[d].x`` / ``device.capacity[d].x`` the expression reads (its
*footprint*), so results can be cached per distinct value of just those entries.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import lark
from celpy.evaluation import celstr

from gpudra.scheduling.cel.errors import CelCompileError
from gpudra.scheduling.cel.grammar import Node
from gpudra.scheduling.cel.library import KNOWN_GLOBALS, KNOWN_METHODS, MACROS, UNSUPPORTED
from gpudra.scheduling.cel.strings import compile_regex
from gpudra.scheduling.cel.typecheck import check_types
from gpudra.scheduling.cel.types import CelType

DEVICE_FIELDS = frozenset({"driver", "attributes", "capacity", "allowMultipleAllocations"})
_NAMESPACES = frozenset({"optional", "cel", "sets", "strings", "lists", "math", "base64"})
_TYPE_NAMES = frozenset({"int", "uint", "double", "string", "bool", "bytes", "list", "map",
                         "null_type", "type"})
_WRAPPERS = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition",
                       "multiplication", "unary", "member", "primary", "paren_expr"})
_LITERAL_TYPES = {"STRING_LIT": "string", "MLSTRING_LIT": "string", "INT_LIT": "int",
                  "UINT_LIT": "uint", "FLOAT_LIT": "double", "BOOL_LIT": "bool",
                  "NULL_LIT": "null", "BYTES_LIT": "bytes"}
_RELATIONS = {"relation_lt": "<", "relation_le": "<=", "relation_gt": ">", "relation_ge": ">=",
              "relation_eq": "==", "relation_ne": "!=", "relation_in": "in"}

Kind = Literal["attribute", "capacity"]


@dataclass(frozen=True)
class Reference:
    """One ``device.attributes[domain].name`` (or capacity) read, with its position."""

    kind: Kind
    domain: str
    name: str
    line: int
    column: int
    guarded: bool = False
    """Read through ``has()`` or ``.?``: a missing entry is not an error."""


@dataclass(frozen=True)
class Comparison:
    """``<reference> <op> <literal>`` (either order): lets validate check the types."""

    reference: Reference
    op: str
    literal_type: str
    literal: str
    reference_first: bool = True
    """The reference is the left operand: for ``==`` the left side picks the overload."""


@dataclass(frozen=True)
class LiteralCall:
    """``quantity('…')`` / ``semver('…')`` of a literal: Kubernetes checks it only at runtime."""

    function: str
    argument: str
    line: int
    column: int


@dataclass(frozen=True)
class Footprint:
    """What of a device an expression can observe; the cache key is built from it."""

    driver: bool = False
    allow_multiple: bool = False
    attributes: tuple[tuple[str, str], ...] = ()
    capacities: tuple[tuple[str, str], ...] = ()
    whole: bool = False
    """The expression looks at a whole map (``in``, ``exists``, a computed key …)."""


@dataclass
class Analysis:
    footprint: Footprint
    references: list[Reference] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    literal_calls: list[LiteralCall] = field(default_factory=list)
    converted: list[Reference] = field(default_factory=list)
    """References passed to ``string()``: a version attribute there fails at runtime."""
    types: dict[int, CelType] = field(default_factory=dict)
    """The static type of every node of the parsed expression, by ``id``."""


def _tree(node: object) -> Node:
    """A child that the grammar guarantees is a subtree."""
    assert isinstance(node, lark.Tree), node
    return node


def _args(node: Node, index: int) -> list[Node]:
    """The expressions of an ``exprlist`` child, if the call has one."""
    if len(node.children) <= index:
        return []
    return [_tree(c) for c in _tree(node.children[index]).children]


def _position(node: Node | lark.Token) -> tuple[int, int]:
    if isinstance(node, lark.Token):
        return node.line or 1, node.column or 1
    meta = node.meta
    return getattr(meta, "line", 1), getattr(meta, "column", 1)


def unwrap(node: Any) -> Any:
    """Skip the single-child precedence wrappers the grammar puts around every node."""
    while isinstance(node, lark.Tree) and node.data in _WRAPPERS and len(node.children) == 1:
        node = node.children[0]
    return node


def _string_literal(node: Any) -> str | None:
    node = unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "literal":
        token = node.children[0]
        if isinstance(token, lark.Token) and token.type in ("STRING_LIT", "MLSTRING_LIT"):
            return str(celstr(token))
    return None


def _literal_type(node: Any) -> tuple[str, str] | None:
    node = unwrap(node)
    if not isinstance(node, lark.Tree):
        return None
    if node.data == "literal":
        token = node.children[0]
        assert isinstance(token, lark.Token)
        kind = _LITERAL_TYPES.get(token.type, "?")
        return kind, str(celstr(token)) if kind == "string" else str(token.value)
    if node.data == "ident_arg" and len(_args(node, 1)) == 1:
        name = str(node.children[0])
        if name in ("quantity", "semver"):
            argument = _string_literal(_args(node, 1)[0])
            if argument is not None:
                return ("Quantity" if name == "quantity" else "Semver"), argument
    return None


def _ident_name(node: Any) -> str | None:
    node = unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


class _Walker:
    """One pass over the tree: scope-aware checks, then footprint and references."""

    def __init__(self) -> None:
        self.parents: dict[int, Node] = {}
        self.device_fields: list[tuple[Node, str]] = []
        self.device_idents: list[Node] = []
        self.guarded: set[int] = set()
        self.analysis = Analysis(Footprint())
        self.literal_calls: list[LiteralCall] = []
        self.converted: list[Any] = []

    def walk(self, node: Node, scope: frozenset[str]) -> None:
        handler = getattr(self, f"_on_{node.data}", None)
        if handler is not None and handler(node, scope):
            return
        self._children(node, scope)

    def _children(self, node: Node, scope: frozenset[str]) -> None:
        for child in node.children:
            if isinstance(child, lark.Tree):
                self.parents[id(child)] = node
                self.walk(child, scope)

    # --- identifiers and calls -------------------------------------------------------

    def _on_ident(self, node: Node, scope: frozenset[str]) -> bool:
        name = str(node.children[0])
        if name == "device" and name not in scope:
            self.device_idents.append(node)
            return True
        if name in scope or name in _TYPE_NAMES or name == "optional":
            return True
        line, column = _position(node)
        raise CelCompileError(f"undeclared reference to '{name}'", line=line, column=column)

    def _on_ident_arg(self, node: Node, scope: frozenset[str]) -> bool:
        token = node.children[0]
        assert isinstance(token, lark.Token)
        self._check_function(token, str(token), global_call=True)
        args = _args(node, 1)
        if str(token) == "has":
            for inner in args:
                self.guarded.add(id(unwrap(inner)))
        if str(token) in ("quantity", "semver") and len(args) == 1:
            argument = _string_literal(args[0])
            if argument is not None:
                line, column = _position(token)
                self.literal_calls.append(LiteralCall(str(token), argument, line, column))
        if str(token) == "string" and len(args) == 1:
            self.converted.append(unwrap(args[0]))
        return False

    _on_dot_ident_arg = _on_ident_arg

    def _on_member_dot_arg(self, node: Node, scope: frozenset[str]) -> bool:
        receiver, token = _tree(node.children[0]), node.children[1]
        assert isinstance(token, lark.Token)
        method = str(token)
        args = _args(node, 2)
        namespace = _ident_name(receiver)
        if namespace == "cel" and method == "bind" and "cel" not in scope:
            self._bind(node, token, args, scope)
            return True
        if namespace in _NAMESPACES and namespace not in scope:
            self._check_namespaced(namespace, token)
            for arg in args:
                self.parents[id(arg)] = node
                self.walk(arg, scope)
            return True
        self._check_function(token, method, global_call=False)
        if method in ("matches", "find", "findAll") and args:
            self._check_regex(args[0])
        if method in MACROS - {"has"}:
            self.parents[id(receiver)] = node
            self.walk(receiver, scope)
            variable = _ident_name(args[0]) if args else None
            if variable is None or len(args) not in (2, 3):
                line, column = _position(token)
                raise CelCompileError(f"{method}() needs a variable name and an expression",
                                      line=line, column=column)
            if len(args) == 3 and method != "map":
                line, column = _position(token)
                raise CelCompileError(f"two-variable {method}() is not supported by the "
                                      "local CEL evaluator", line=line, column=column,
                                      unsupported=True)
            for arg in args[1:]:
                self.parents[id(arg)] = node
                self.walk(arg, scope | {variable})
            return True
        return False

    def _bind(self, node: Node, token: lark.Token, args: list[Node],
              scope: frozenset[str]) -> None:
        """``cel.bind(name, value, body)`` (``ext.Bindings``): ``name`` is in scope in the body."""
        variable = _ident_name(args[0]) if len(args) == 3 else None
        if variable is None:
            line, column = _position(token)
            raise CelCompileError("cel.bind() needs a variable name, a value and an expression",
                                  line=line, column=column)
        for arg, inner in ((args[1], scope), (args[2], scope | {variable})):
            self.parents[id(arg)] = node
            self.walk(arg, inner)

    def _check_namespaced(self, namespace: str, token: lark.Token) -> None:
        line, column = _position(token)
        if namespace == "optional" and str(token) in ("of", "none", "ofNonZeroValue"):
            return
        if namespace in ("optional", "cel"):  # cel.bind() is handled by the caller
            raise CelCompileError(f"undeclared reference to '{namespace}.{token}'",
                                  line=line, column=column)
        raise CelCompileError(f"{namespace}.{token}() is valid Kubernetes CEL but not supported "
                              "by the local CEL evaluator", line=line, column=column,
                              unsupported=True)

    def _check_function(self, token: lark.Token, name: str, *, global_call: bool) -> None:
        known = KNOWN_GLOBALS if global_call else KNOWN_METHODS
        if name in known:
            return
        line, column = _position(token)
        if name in UNSUPPORTED:
            raise CelCompileError(f"{name}() is valid Kubernetes CEL but not supported by the "
                                  "local CEL evaluator", line=line, column=column,
                                  unsupported=True)
        raise CelCompileError(f"undeclared reference to '{name}'", line=line, column=column)

    def _check_regex(self, argument: Node) -> None:
        pattern = _string_literal(argument)
        if pattern is None:
            return
        try:
            compile_regex(pattern)
        except ValueError as exc:
            line, column = _position(argument)
            raise CelCompileError(str(exc), line=line, column=column) from None

    def _on_member_object(self, node: Node, scope: frozenset[str]) -> bool:
        if len(node.children) > 1:
            line, column = _position(node)
            raise CelCompileError("message construction is not available in this environment",
                                  line=line, column=column)
        return False

    # --- the device variable --------------------------------------------------------

    def _on_member_dot(self, node: Node, scope: frozenset[str]) -> bool:
        receiver, token = node.children
        if _ident_name(receiver) == "device" and "device" not in scope:
            name = str(token)
            if name not in DEVICE_FIELDS:
                line, column = _position(token)
                raise CelCompileError(f"undefined field '{name}'", line=line, column=column)
            self.device_fields.append((node, name))
        return False

    def _on_member_dot_opt(self, node: Node, scope: frozenset[str]) -> bool:
        self.guarded.add(id(node))
        return False

    def _on_member_index_opt(self, node: Node, scope: frozenset[str]) -> bool:
        self.guarded.add(id(node))
        return False

    # --- footprint ------------------------------------------------------------------

    def _up(self, node: Node) -> tuple[Node | None, Node]:
        """The nearest ancestor that is not a wrapper, and the child we came from."""
        child = node
        parent = self.parents.get(id(child))
        while parent is not None and parent.data in _WRAPPERS and len(parent.children) == 1:
            child = parent
            parent = self.parents.get(id(child))
        return parent, child

    def _key_of(self, node: Node | None, via: Node) -> tuple[str | None, Node]:
        """If ``node`` selects a constant key out of ``via`` (``.x``, ``[lit]``), that key."""
        if node is None or node.children[0] is not via:
            return None, via
        if node.data in ("member_dot", "member_dot_opt"):
            return str(node.children[1]), node
        if node.data in ("member_index", "member_index_opt"):
            return _string_literal(node.children[1]), node
        return None, via

    def finish(self, root: Node) -> Analysis:
        driver = allow = False
        # ``device`` used other than as ``device.<field>`` (``device['attributes']``,
        # ``dyn(device)``): the expression may read anything.
        field_nodes = {id(node) for node, _ in self.device_fields}
        whole = any(id(self._up(ident)[0]) not in field_nodes for ident in self.device_idents)
        attributes: list[tuple[str, str]] = []
        capacities: list[tuple[str, str]] = []
        ref_nodes: dict[int, Reference] = {}
        for node, name in self.device_fields:
            if name == "driver":
                driver = True
                continue
            if name == "allowMultipleAllocations":
                allow = True
                continue
            parent, via = self._up(node)
            domain, domain_node = self._key_of(parent, via)
            if domain is None:
                whole = True
                continue
            parent, via = self._up(domain_node)
            key, key_node = self._key_of(parent, via)
            if key is None:
                whole = True
                continue
            kind: Kind = "attribute" if name == "attributes" else "capacity"
            (attributes if kind == "attribute" else capacities).append((domain, key))
            name_token = key_node.children[1]
            line, column = _position(name_token if isinstance(name_token, lark.Token)
                                     else key_node)
            guarded = id(key_node) in self.guarded or id(domain_node) in self.guarded
            reference = Reference(kind, domain, key, line, column, guarded)
            ref_nodes[id(key_node)] = reference
            self.analysis.references.append(reference)
        self.analysis.footprint = Footprint(
            driver, allow, tuple(dict.fromkeys(attributes)), tuple(dict.fromkeys(capacities)),
            whole)
        self.analysis.comparisons = list(_comparisons(root, ref_nodes))
        self.analysis.literal_calls = self.literal_calls
        self.analysis.converted = [ref_nodes[id(n)] for n in self.converted if id(n) in ref_nodes]
        return self.analysis


def _comparisons(root: Node, refs: dict[int, Reference]) -> Iterator[Comparison]:
    for node in root.iter_subtrees():
        if node.data != "relation" or len(node.children) != 2:
            continue
        op_node, right = node.children
        assert isinstance(op_node, lark.Tree)
        left = op_node.children[0]
        for first, (ref_side, other) in ((True, (left, right)), (False, (right, left))):
            reference = refs.get(id(unwrap(ref_side)))
            literal = _literal_type(other)
            if reference is not None and literal is not None:
                yield Comparison(reference, _RELATIONS[op_node.data], *literal, first)


def analyse(root: Node, text: str) -> Analysis:
    """Check one parsed selector; raises :class:`CelCompileError` for what cel-go rejects.

    Names first (undeclared functions and variables, libraries the local evaluator lacks),
    then the static types, as the API server does when a claim or class is created.
    """
    walker = _Walker()
    walker.walk(root, frozenset())
    analysis = walker.finish(root)
    analysis.types = check_types(root, text)
    return analysis
