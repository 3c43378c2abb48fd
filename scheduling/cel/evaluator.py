"""celpy's InterpretedRunner, extended with optional selection, ``cel.bind`` and cel-go's wording.

Field selection and indexing are overridden: they are where optional values (``x.?f``,
``m[?k]``, and selecting through an optional) come in, and where cel-go says "no such
key: x" for a missing map entry. Method calls are overridden for ``cel.bind(x, v, body)``
(``ext.Bindings``, which Kubernetes adds for DRA selectors).
"""

from __future__ import annotations

from typing import Any, cast

import lark
from celpy import InterpretedRunner, celtypes
from celpy.evaluation import CELEvalError, Evaluator

from gpudra.scheduling.cel.errors import cel_error
from gpudra.scheduling.cel.grammar import Node
from gpudra.scheduling.cel.operators import type_name
from gpudra.scheduling.cel.values import OPTIONAL_NONE, OptionalValue


def _select(receiver: Any, key: Any) -> Any:
    """``receiver[key]`` (also ``receiver.key``) with cel-go's errors."""
    if isinstance(receiver, celtypes.MapType):
        try:
            return receiver[key]
        except KeyError:
            return cel_error(f"no such key: {key}")
        except TypeError:
            return cel_error(f"unsupported map key type: {type_name(key)}")
    if isinstance(receiver, celtypes.ListType):
        if not isinstance(key, celtypes.IntType | celtypes.UintType) or isinstance(
                key, celtypes.BoolType):
            return cel_error(f"no such overload: list[{type_name(key)}]")
        if not 0 <= int(key) < len(receiver):
            return cel_error(f"index out of range: {int(key)}")
        return receiver[int(key)]
    return cel_error(f"type '{type_name(receiver)}' does not support field selection")


def _optional_select(receiver: Any, key: Any) -> Any:
    """``receiver.?key``: optional.none() when the key is absent."""
    if isinstance(receiver, OptionalValue):
        if not receiver.present:
            return OPTIONAL_NONE
        receiver = receiver.value
    if isinstance(receiver, celtypes.MapType):
        found = _select(receiver, key)
        if isinstance(found, CELEvalError):
            return OPTIONAL_NONE if key not in receiver else found
        return OptionalValue(found, True)
    if isinstance(receiver, celtypes.ListType):
        found = _select(receiver, key)
        return OPTIONAL_NONE if isinstance(found, CELEvalError) else OptionalValue(found, True)
    return cel_error(f"type '{type_name(receiver)}' does not support field selection")


def _through_optional(receiver: Any, key: Any) -> Any:
    """Plain selection; selecting on an optional yields an optional (cel-go semantics)."""
    if isinstance(receiver, CELEvalError):
        return receiver
    if isinstance(receiver, OptionalValue):
        return _optional_select(receiver, key)
    return _select(receiver, key)


def _is_ident(node: Any, name: str) -> bool:
    """Whether ``node`` is the bare identifier ``name`` (through the precedence wrappers)."""
    while isinstance(node, lark.Tree) and len(node.children) == 1:
        node = node.children[0]
    return isinstance(node, lark.Token) and node.type == "IDENT" and str(node) == name


class DeviceEvaluator(Evaluator):
    """Evaluates one parsed selector against one activation."""

    def sub_evaluator(self, ast: Node) -> Evaluator:
        return DeviceEvaluator(ast, activation=self.activation)

    def member_dot(self, tree: Node) -> Any:
        member_tree, name = cast(tuple[Node, lark.Token], tree.children)
        receiver = self.visit(member_tree)
        if isinstance(receiver, celtypes.MapType | OptionalValue | CELEvalError):
            return _through_optional(receiver, celtypes.StringType(name.value))
        # Packages, protobuf types and the like: celpy's own rules.
        return super().member_dot(tree)

    def member_dot_arg(self, tree: Node) -> Any:
        receiver, method = tree.children[0], tree.children[1]
        if str(method) == "bind" and _is_ident(receiver, "cel"):
            return self._bind(tree)
        return super().member_dot_arg(tree)

    def _bind(self, tree: Node) -> Any:
        """``cel.bind(name, value, body)``: ``body`` with ``name`` bound to ``value``.

        An error in ``value`` only matters if the body uses it (cel-go binds lazily).
        """
        exprlist = tree.children[2]
        assert isinstance(exprlist, lark.Tree)
        name_tree, value_tree, body = cast(list[Node], exprlist.children)
        name = next(name_tree.find_data("ident")).children[0]
        value = self.visit(value_tree)
        nested = self.sub_evaluator(body)
        nested.set_activation({str(name): value})
        return nested.visit(body)

    def member_dot_opt(self, tree: Node) -> Any:
        member_tree, name = cast(tuple[Node, lark.Token], tree.children)
        receiver = self.visit(member_tree)
        if isinstance(receiver, CELEvalError):
            return receiver
        return _optional_select(receiver, celtypes.StringType(name.value))

    def member_index(self, tree: Node) -> Any:
        receiver, key = self.visit_children(tree)
        if isinstance(key, CELEvalError):
            return key
        return _through_optional(receiver, key)

    def member_index_opt(self, tree: Node) -> Any:
        receiver, key = self.visit_children(tree)
        for value in (receiver, key):
            if isinstance(value, CELEvalError):
                return value
        return _optional_select(receiver, key)


class DeviceRunner(InterpretedRunner):
    """An InterpretedRunner whose evaluator is :class:`DeviceEvaluator`."""

    def evaluate(self, context: Any) -> Any:
        return DeviceEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)
