"""JSON from an untrusted peer (the API server's answers), decoded with its nesting bounded.

``json.loads`` recurses once per nesting level and raises ``RecursionError`` (not a
``ValueError``) at Python's recursion limit; and whatever walks the decoded value later
(validation, ``json.dumps`` into the checkpoint) recurses again, wherever its own stack
already is. Kubernetes objects nest a dozen levels; :data:`MAX_DEPTH` leaves room for any
real one and stays far below the recursion limit (1000), so a deeper body is refused
before it is decoded, as one :class:`JsonTooDeep`, a ``ValueError`` like any other bad JSON.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Final

MAX_DEPTH: Final = 100
"""Nested arrays and objects a document may have (the top-level object is 1)."""

# A JSON string (escapes included): its brackets are text, not nesting.
# Unrolled (runs of plain characters, then one escape at a time): a third faster than an
# alternation per character, on bodies with many strings.
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_TOKEN: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},:]', re.DOTALL)
PATH_SHOWN: Final = 12
"""Steps of the path to a too-deep value an error names."""
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class JsonTooDeep(ValueError):
    """A JSON document nests deeper than allowed."""


def depth(body: bytes) -> int:
    """How deep the arrays and objects of the JSON text ``body`` nest (0: a scalar).

    For a well-formed document; a malformed one gets some number and then fails to decode.
    """
    if b"[" not in body and b"{" not in body:
        return 0
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(_STEP[b] for b in brackets), default=0)


def loads(body: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that refuses a document nested deeper than ``max_depth`` first.

    The nesting is counted only when the body holds more brackets than ``max_depth`` (any
    Kubernetes claim does not): a count of two bytes, then one regular expression pass.
    """
    data = body.encode() if isinstance(body, str) else body
    if data.count(b"[") + data.count(b"{") > max_depth:
        found = depth(data)
        if found > max_depth:
            raise JsonTooDeep(f"JSON nested {found} levels deep (at most {max_depth}) at "
                              f"{path_to_depth(data, max_depth + 1)}")
    return json.loads(data)


def path_to_depth(body: bytes, level: int) -> str:
    """Where in ``body`` the nesting first reaches ``level``, as a field path
    (``status.allocation.devices.config[0].opaque.parameters.x[0]...``): its first
    :data:`PATH_SHOWN` steps. Only for a document being refused: one more pass."""
    steps: list[str] = []  # per open container: its key or index so far, "" before any
    kinds: list[bytes] = []
    key = b""
    for match in _TOKEN.finditer(body):
        token = match.group()
        if token in (b"{", b"["):
            kinds.append(token)
            steps.append("[0]" if token == b"[" else "")
            if len(kinds) >= level:
                break
        elif token in (b"}", b"]"):
            if kinds:
                kinds.pop()
                steps.pop()
        elif token == b",":
            if kinds and kinds[-1] == b"[":
                steps[-1] = f"[{int(steps[-1][1:-1]) + 1}]"
        elif token == b":":
            if kinds and kinds[-1] == b"{":
                steps[-1] = "." + _key(key)
        else:
            key = token
    path = "".join(steps[:-1][:PATH_SHOWN]).lstrip(".")
    return (path or "the top") + ("..." if len(steps) - 1 > PATH_SHOWN else "")


def _key(token: bytes) -> str:
    try:
        text = json.loads(token)
    except ValueError:
        return "?"
    return str(text)[:40]
