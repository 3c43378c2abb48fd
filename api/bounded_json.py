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
_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class JsonTooDeep(ValueError):
    """A JSON document nests deeper than allowed."""


def depth(body: bytes) -> int:
    """How deep the arrays and objects of the JSON text ``body`` nest (0: a scalar).

    For a well-formed document; a malformed one gets some number and then fails to decode.
    """
    opening = body.count(b"[") + body.count(b"{")
    if opening <= 1:
        return opening
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(_STEP[b] for b in brackets))


def loads(body: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that refuses a document nested deeper than ``max_depth`` first.

    The nesting is counted only when the body holds more brackets than ``max_depth`` (any
    Kubernetes claim does not): a count of two bytes, then one regular expression pass.
    """
    data = body.encode() if isinstance(body, str) else body
    if data.count(b"[") + data.count(b"{") > max_depth:
        found = depth(data)
        if found > max_depth:
            raise JsonTooDeep(f"JSON nested {found} levels deep (at most {max_depth})")
    return json.loads(data)
