"""CEL parser: cel-python's grammar plus the optional-field syntax Kubernetes accepts.

Kubernetes compiles selectors with cel-go's OptionalTypes, so ``attrs.?numaNode.orValue(-1)``
and ``m[?key]`` are valid there; cel-python's grammar rejects them. The grammar is extended
with two rules rather than forked, and parsed with the same Lark options celpy uses.

Building the LALR tables is most of an interactive ``gpudra explain``'s time; Lark
caches them in a file keyed by the grammar, the options and Lark's version, which we keep
in the user's cache directory (not a shared ``/tmp``, since it is a pickle). The trees of
expressions parsed before come from :mod:`~gpudra.scheduling.cel.tree_cache` in the same
directory: a run that parses nothing new never loads the tables or builds the lexer.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any, cast

import celpy
import lark
from celpy import celparser
from celpy.celparser import CELParser
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from gpudra.scheduling.cel import tree_cache
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
def _grammar() -> str:
    grammar = (Path(celpy.__file__).parent / "cel.lark").read_text()
    if _MEMBER_RULE not in grammar:  # pragma: no cover - a celpy upgrade changed its grammar
        raise RuntimeError("unexpected cel-python grammar; update scheduling/cel/grammar.py")
    return grammar.replace(_MEMBER_RULE, _EXTENSION.strip())


@cache
def _parser() -> lark.Lark:
    cache_file = _cache_file()
    parser = lark.Lark(
        _grammar(),
        cache=cache_file or False,
        parser="lalr",
        start="expr",
        g_regex_flags=re.M,
        lexer_callbacks={"IDENT": CELParser.ambiguous_literals},
        propagate_positions=True,
        maybe_placeholders=False,
        priority="invert",
    )
    if cache_file is not None:
        tree_cache.make_private(Path(cache_file))
    return parser


def _cache_directory() -> Path | None:
    """``$XDG_CACHE_HOME/gpudra`` (``~/.cache``); None when it cannot be created (a
    read-only home) or is not private to this user: then the tables are built each run."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    directory = Path(base) / "gpudra"
    return directory if tree_cache.private_directory(directory) else None


def _cache_file() -> str | None:
    """Where Lark keeps the analysed grammar."""
    directory = _cache_directory()
    if directory is None:
        return None
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    path = directory / f"cel-grammar-lark{lark.__version__}-py{version}.cache"
    # Lark unpickles this file: the file itself must be ours alone, not only its directory.
    return str(path) if tree_cache.private_file(path) else None


@cache
def _trees() -> tree_cache.TreeCache | None:
    """The parse-tree cache, in a directory named for everything that shapes a tree."""
    directory = _cache_directory()
    if directory is None:
        return None
    shape = "\0".join([_grammar(), Path(celparser.__file__).read_text(),
                       Path(__file__).read_text(), lark.__version__, str(tree_cache.FORMAT)])
    trees = directory / f"cel-trees-{hashlib.sha256(shape.encode()).hexdigest()[:16]}"
    return tree_cache.TreeCache(trees) if tree_cache.private_directory(trees) else None


class _ParserOnDemand:
    """Our parser for celpy, loaded when celpy first uses it (it never does: we parse)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_parser(), name)


def environment() -> celpy.Environment:
    """A celpy environment to run our parse trees in.

    celpy's constructor builds its own parser (a second LALR analysis, slow) unless one
    exists; we only ever parse with ours, so it is handed ours, a superset of its grammar,
    and only loaded if used: trees from the cache need no parser.
    """
    if CELParser.CEL_PARSER is None:
        CELParser.CEL_PARSER = cast(lark.Lark, _ParserOnDemand())
    return celpy.Environment()


def parse(text: str) -> Node:
    """Parse one expression; syntax errors become :class:`CelCompileError` with a position."""
    trees = _trees()
    found = trees.get(text) if trees is not None else None
    if found is not None:
        return found
    tree = _parse(text)
    if trees is not None:
        trees.put(text, tree)
    return tree


def _parse(text: str) -> Node:
    """Lark's parse, with its errors as :class:`CelCompileError`."""
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
