"""CEL parser: cel-python's grammar plus the optional-field syntax Kubernetes accepts.

Kubernetes compiles selectors with cel-go's OptionalTypes, so ``attrs.?numaNode.orValue(-1)``
and ``m[?key]`` are valid there; cel-python's grammar rejects them. The grammar is extended
with two rules rather than forked, and parsed with the same Lark options celpy uses.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import celpy
import lark
from celpy.celparser import CELParser
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from gpudra.scheduling.cel.errors import CelCompileError

Node = lark.Tree[lark.Token]
"""A parse-tree node (cel-python's grammar: ``expr``, ``member_dot``, ``literal`` …)."""

_MEMBER_RULE = ("member         : member_dot | member_dot_arg | member_index | member_object"
                " | primary")
_EXTENSION = """
member         : member_dot | member_dot_arg | member_index | member_object | primary
               | member_dot_opt | member_index_opt
member_dot_opt : member ".?" IDENT
member_index_opt : member "[" "?" expr "]"
"""


@cache
def _parser() -> lark.Lark:
    grammar = (Path(celpy.__file__).parent / "cel.lark").read_text()
    if _MEMBER_RULE not in grammar:  # pragma: no cover - a celpy upgrade changed its grammar
        raise RuntimeError("unexpected cel-python grammar; update controller/cel/grammar.py")
    grammar = grammar.replace(_MEMBER_RULE, _EXTENSION.strip())
    return lark.Lark(
        grammar,
        parser="lalr",
        start="expr",
        g_regex_flags=re.M,
        lexer_callbacks={"IDENT": CELParser.ambiguous_literals},
        propagate_positions=True,
        maybe_placeholders=False,
        priority="invert",
    )


def parse(text: str) -> Node:
    """Parse one expression; syntax errors become :class:`CelCompileError` with a position."""
    try:
        return _parser().parse(text)
    except UnexpectedToken as exc:
        found = "end of input" if exc.token.type == "$END" else repr(str(exc.token))
        raise CelCompileError(f"Syntax error: unexpected {found}", line=exc.line,
                              column=exc.column) from None
    except UnexpectedCharacters as exc:
        at = exc.pos_in_stream
        char = text[at] if at is not None and 0 <= at < len(text) else "?"
        raise CelCompileError(f"Syntax error: unexpected character {char!r}", line=exc.line,
                              column=exc.column) from None
    except UnexpectedInput as exc:  # pragma: no cover - other positional parse errors
        raise CelCompileError(f"Syntax error: {exc}", line=exc.line, column=exc.column) from None
    except LarkError as exc:  # pragma: no cover
        raise CelCompileError(f"Syntax error: {exc}") from None
