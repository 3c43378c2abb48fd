"""The API server's static type check of a selector, with the DRA environment's declared types.

``device.driver`` is a string, attribute values are ``dyn`` (only a device says whether
``numaNode`` is an int), capacities are ``kubernetes.Quantity``. So
``device.attributes[d].productName == 'x'`` type-checks, while
``device.capacity[d].memory >= '60Gi'`` and a selector whose type is not bool are refused
when the claim or class is created, with cel-go's words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import lark

from gpudra.scheduling.cel.errors import CelCompileError
from gpudra.scheduling.cel.grammar import Node
from gpudra.scheduling.cel.signatures import GLOBAL, MEMBER, OPTIONAL_CONSTRUCTORS
from gpudra.scheduling.cel.types import (
    BOOL,
    BYTES,
    DEVICE,
    DEVICE_FIELDS,
    DOUBLE,
    DYN,
    ERROR,
    INT,
    NULL,
    QUANTITY,
    SEMVER,
    STRING,
    UINT,
    CelType,
    assignable,
    join,
    list_of,
    map_of,
    optional_of,
    resolve,
    signature,
    type_of,
)

_LITERALS = {"STRING_LIT": STRING, "MLSTRING_LIT": STRING, "INT_LIT": INT, "UINT_LIT": UINT,
             "FLOAT_LIT": DOUBLE, "BOOL_LIT": BOOL, "NULL_LIT": NULL, "BYTES_LIT": BYTES}
_TYPE_NAMES = {"int": INT, "uint": UINT, "double": DOUBLE, "string": STRING, "bool": BOOL,
               "bytes": BYTES, "null_type": NULL, "list": list_of(DYN),
               "map": map_of(DYN, DYN), "type": type_of(DYN), "dyn": DYN}
_BINARY = {"relation_lt": "_<_", "relation_le": "_<=_", "relation_gt": "_>_",
           "relation_ge": "_>=_", "relation_eq": "_==_", "relation_ne": "_!=_",
           "relation_in": "_in_", "addition_add": "_+_", "addition_sub": "_-_",
           "multiplication_mul": "_*_", "multiplication_div": "_/_",
           "multiplication_mod": "_%_"}
_SYMBOLS = {"_<_": "<", "_<=_": "<=", "_>_": ">", "_>=_": ">=", "_==_": "==", "_!=_": "!="}
_PASS_THROUGH = frozenset({"member", "primary", "paren_expr"})
_NAMESPACES = frozenset({"optional", "cel", "sets", "strings", "lists", "math", "base64"})
_COMPREHENSIONS = frozenset({"all", "exists", "exists_one", "map", "filter"})

Scope = Mapping[str, CelType]


def _args(node: Node, index: int) -> list[Node]:
    if len(node.children) <= index:
        return []
    exprlist = node.children[index]
    assert isinstance(exprlist, lark.Tree)
    return [c for c in exprlist.children if isinstance(c, lark.Tree)]


def _ident(node: Node) -> str | None:
    """The name, if ``node`` is a bare identifier (through the precedence wrappers)."""
    while len(node.children) == 1 and isinstance(node.children[0], lark.Tree):
        node = node.children[0]
    if node.data == "ident":
        return str(node.children[0])
    return None


class _Checker:
    def __init__(self, text: str) -> None:
        self.text = text
        self.types: dict[int, CelType] = {}

    # --- positions and errors ------------------------------------------------------------

    def _at(self, offset: int) -> tuple[int, int]:
        before = self.text[:offset]
        return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1

    def _fail(self, message: str, where: Node | lark.Token, *, after: Node | None = None,
              hint: str | None = None) -> CelType:
        """Raise a compile error at ``where`` (or at the operator following ``after``)."""
        end = getattr(after.meta, "end_pos", None) if after is not None else None
        if end is not None:
            while end < len(self.text) and self.text[end].isspace():
                end += 1
            line, column = self._at(end)
        elif isinstance(where, lark.Token):
            line, column = where.line or 1, where.column or 1
        else:
            line = getattr(where.meta, "line", None) or 1
            column = getattr(where.meta, "column", None) or 1
        raise CelCompileError(message, line=line, column=column, hint=hint)

    def _source(self, node: Node) -> str:
        meta = node.meta
        return self.text[getattr(meta, "start_pos", None) or 0:getattr(meta, "end_pos", None) or 0]

    def _call(self, name: str, args: Sequence[CelType], where: Node | lark.Token, *,
              member: bool = False, operands: Sequence[Node] = (),
              after: Node | None = None) -> CelType:
        if ERROR in args:
            return ERROR
        overloads = (MEMBER if member else GLOBAL).get(name)
        if overloads is None:
            return DYN
        result = resolve(overloads, args)
        if result is None:
            self._fail(signature(name, args, member=member), where, after=after,
                       hint=self._hint(name, args, operands))
        assert result is not None
        return result

    def _hint(self, name: str, args: Sequence[CelType], operands: Sequence[Node]) -> str | None:
        """For ``quantity >= '60Gi'`` and the like: the method call that does it."""
        symbol = _SYMBOLS.get(name)
        kinds = [t for t in args if t in (QUANTITY, SEMVER)]
        if symbol is None or len(operands) != 2 or not kinds:
            return None
        kind = kinds[0]
        (left, right), (left_type, right_type) = operands, args
        if left_type == STRING:  # '60Gi' <= memory: the quantity must be the receiver
            left, right, left_type, right_type = right, left, right_type, left_type
            symbol = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(symbol, symbol)
        argument = self._source(right)
        if right_type == STRING:
            argument = f"{'quantity' if kind == QUANTITY else 'semver'}({argument})"
        elif right_type not in (kind, DYN) or left_type not in (kind, DYN):
            return None
        what = "quantities" if kind == QUANTITY else "versions"
        return f"{what} are compared with methods: {self._source(left)}.compareTo({argument}) " \
               f"{symbol} 0"

    # --- the walk ---------------------------------------------------------------------------

    def visit(self, node: Node, scope: Scope) -> CelType:
        handler = getattr(self, f"_on_{node.data}", None)
        if handler is not None:
            found: CelType = handler(node, scope)
        elif len(node.children) == 1 and isinstance(node.children[0], lark.Tree):
            found = self.visit(node.children[0], scope)
        else:
            found = self._operator(node, scope)
        self.types[id(node)] = found
        return found

    def _operator(self, node: Node, scope: Scope) -> CelType:
        """``expr`` (ternary), ``conditionalor``/``and``, relations, arithmetic, unary."""
        children = [c for c in node.children if isinstance(c, lark.Tree)]
        if node.data == "expr":
            args = [self.visit(c, scope) for c in children]
            return self._call("_?_:_", args, children[0], after=children[0])
        if node.data in ("conditionalor", "conditionaland"):
            args = [self.visit(c, scope) for c in children]
            name = "_||_" if node.data == "conditionalor" else "_&&_"
            return self._call(name, args, children[0], after=children[0])
        if node.data == "unary":
            op, operand = children
            name = "!_" if op.data == "unary_not" else "-_"
            return self._call(name, [self.visit(operand, scope)], node)
        op, right = children
        left = op.children[0]
        assert isinstance(left, lark.Tree)
        name = _BINARY[op.data]
        args = [self.visit(left, scope), self.visit(right, scope)]
        return self._call(name, args, left, operands=(left, right), after=left)

    def _on_literal(self, node: Node, scope: Scope) -> CelType:
        token = node.children[0]
        assert isinstance(token, lark.Token)
        return _LITERALS.get(token.type, DYN)

    def _on_ident(self, node: Node, scope: Scope) -> CelType:
        name = str(node.children[0])
        if name in scope:
            return scope[name]
        if name == "device":
            return DEVICE
        if name in _TYPE_NAMES:
            return type_of(_TYPE_NAMES[name])
        return DYN  # namespaces; undeclared names were refused before the type check

    _on_dot_ident = _on_ident

    def _on_list_lit(self, node: Node, scope: Scope) -> CelType:
        return list_of(join([self.visit(e, scope) for e in _args(node, 0)]))

    def _on_map_lit(self, node: Node, scope: Scope) -> CelType:
        entries = [self.visit(e, scope) for e in _args(node, 0)]
        return map_of(join(entries[0::2]), join(entries[1::2]))

    def _on_member_object(self, node: Node, scope: Scope) -> CelType:
        return DYN

    def _on_ident_arg(self, node: Node, scope: Scope) -> CelType:
        token = node.children[0]
        assert isinstance(token, lark.Token)
        args = _args(node, 1)
        if str(token) == "has":
            if len(args) != 1 or _selection(args[0]) is None:
                self._fail("invalid argument to has() macro", token)
            self.visit(args[0], scope)
            return BOOL
        return self._call(str(token), [self.visit(a, scope) for a in args], token)

    _on_dot_ident_arg = _on_ident_arg

    # --- selection and indexing ---------------------------------------------------------

    def _select(self, receiver: CelType, field: str, where: lark.Token) -> CelType:
        if receiver in (DYN, ERROR):
            return receiver
        if receiver.name == "optional_type":
            return optional_of(self._select(receiver.params[0], field, where))
        if receiver == DEVICE:
            found = DEVICE_FIELDS.get(field)
            if found is None:
                self._fail(f"undefined field '{field}'", where)
            assert found is not None
            return found
        if receiver.name == "map" and assignable(receiver.params[0], STRING, {}):
            return receiver.params[1]
        return self._fail(f"type '{receiver}' does not support field selection", where)

    def _on_member_dot(self, node: Node, scope: Scope) -> CelType:
        receiver, token = node.children
        assert isinstance(receiver, lark.Tree) and isinstance(token, lark.Token)
        return self._select(self.visit(receiver, scope), str(token), token)

    def _on_member_dot_opt(self, node: Node, scope: Scope) -> CelType:
        receiver, token = node.children
        assert isinstance(receiver, lark.Tree) and isinstance(token, lark.Token)
        found = self._select(_unwrap_optional(self.visit(receiver, scope)), str(token), token)
        return found if found in (DYN, ERROR) else optional_of(_unwrap_optional(found))

    def _index(self, node: Node, scope: Scope) -> CelType:
        receiver, key = node.children
        assert isinstance(receiver, lark.Tree) and isinstance(key, lark.Tree)
        target = self.visit(receiver, scope)
        key_type = self.visit(key, scope)
        if target.name == "optional_type":
            return optional_of(self._call("_[_]", [target.params[0], key_type], key,
                                          after=receiver))
        return self._call("_[_]", [target, key_type], key, after=receiver)

    def _on_member_index(self, node: Node, scope: Scope) -> CelType:
        return self._index(node, scope)

    def _on_member_index_opt(self, node: Node, scope: Scope) -> CelType:
        found = self._index(node, scope)
        return found if found in (DYN, ERROR) else optional_of(_unwrap_optional(found))

    # --- calls: methods, macros, namespaces ------------------------------------------------

    def _on_member_dot_arg(self, node: Node, scope: Scope) -> CelType:
        receiver, token = node.children[0], node.children[1]
        assert isinstance(receiver, lark.Tree) and isinstance(token, lark.Token)
        method = str(token)
        args = _args(node, 2)
        namespace = _ident(receiver)
        if namespace in _NAMESPACES and namespace not in scope:
            return self._namespaced(namespace, method, args, token, scope)
        if method in _COMPREHENSIONS:
            return self._comprehension(method, self.visit(receiver, scope), args, token, scope)
        types = [self.visit(receiver, scope), *(self.visit(a, scope) for a in args)]
        return self._call(method, types, token, member=True)

    def _namespaced(self, namespace: str, method: str, args: list[Node], token: lark.Token,
                    scope: Scope) -> CelType:
        if namespace == "cel" and method == "bind" and len(args) == 3:
            name = _ident(args[0])
            if name is None:
                return self._fail("cel.bind() variable name must be a simple identifier",
                                  token)
            bound = self.visit(args[1], scope)
            return self.visit(args[2], {**scope, name: bound})
        types = [self.visit(a, scope) for a in args]
        if namespace == "optional" and method in OPTIONAL_CONSTRUCTORS:
            if ERROR in types:
                return ERROR
            result = resolve(OPTIONAL_CONSTRUCTORS[method], types)
            if result is None:
                self._fail(signature(f"optional.{method}", types, member=False), token)
            assert result is not None
            return result
        return DYN  # libraries the local evaluator lacks (refused as unsupported before)

    def _comprehension(self, macro: str, range_type: CelType, args: list[Node],
                       token: lark.Token, scope: Scope) -> CelType:
        if range_type.name in ("list", "map"):  # a list's elements, a map's keys
            variable_type = range_type.params[0]
        elif range_type in (DYN, ERROR):
            variable_type = range_type
        else:
            return self._fail(f"expression of type '{range_type}' cannot be range of a "
                              "comprehension (must be list, map, or dynamic)", token)
        name = _ident(args[0]) if args else None
        inner = {**scope, name: variable_type} if name else scope
        body = [self.visit(a, inner) for a in args[1:]]
        predicates = body if macro in ("all", "exists", "exists_one", "filter") else body[:-1]
        for predicate, node in zip(predicates, args[1:], strict=False):
            if not assignable(BOOL, predicate, {}):
                step = {"all": "_&&_", "exists": "_||_"}.get(macro)
                applied = [BOOL, predicate] if step else [predicate, INT, INT]
                self._fail(signature(step or "_?_:_", applied, member=False), node)
        if macro == "map":
            return list_of(body[-1] if body else DYN)
        if macro == "filter":
            return list_of(variable_type)
        return BOOL


def _unwrap_optional(kind: CelType) -> CelType:
    return kind.params[0] if kind.name == "optional_type" else kind


def _selection(node: Node) -> Node | None:
    """The ``x.f`` inside the argument of ``has()``, if that is what it is."""
    while len(node.children) == 1 and isinstance(node.children[0], lark.Tree):
        node = node.children[0]
    return node if node.data in ("member_dot", "member_dot_opt") else None


def check_types(root: Node, text: str) -> dict[int, CelType]:
    """Type-check a parsed selector; raises :class:`CelCompileError` where cel-go would.

    Returns the static type of every node (by ``id``), for the callers that explain values.
    """
    checker = _Checker(text)
    result = checker.visit(root, {})
    if result not in (BOOL, DYN, ERROR):
        raise CelCompileError(f"must evaluate to bool or the unknown type, not {result}",
                              line=1, column=1)
    return checker.types
