"""A hostile (or badly broken) API server: objects served exactly as given, and the bodies
such a server sends.

The stand-in validates and canonicalises what it stores, as the apiserver does; a client
must still survive a server that does neither. ``FakeApiServer.serve_as_given(kind, name,
body)`` makes every GET of that object answer 200 with ``body``: bytes are sent as they
are, anything else is JSON-encoded as it is (no defaults, no validation, no uid filled in).
The builders below make the bodies: path-shaped UIDs, wrong-typed fields, deep and huge
documents. Deep ones are built as text, without recursion, so any depth can be sent.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Final

Key = tuple[str, str, str]  # (plural, namespace or "", name)

PATH_SHAPED_UIDS: Final = (
    "/", "/etc", "..", ".", "../../../../tmp", "a/../../b", "./x", "x/", "\0", "a\0b",
    "0b0e3a9c-1d2e-4f30-8a4b-5c6d7e8f9a0b/../..", "~root", "$(touch /tmp/x)", "-rf",
    "0B0E3A9C-1D2E-4F30-8A4B-5C6D7E8F9A0B", " 0b0e3a9c-1d2e-4f30-8a4b-5c6d7e8f9a0", "x" * 5000,
)
"""``metadata.uid`` values no apiserver makes, each aimed at a path or a command line."""


class AsGiven:
    """Bodies to answer GETs of single objects with, by (resource, namespace, name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: dict[Key, bytes] = {}

    def set(self, key: Key, body: bytes) -> None:
        with self._lock:
            self._bodies[key] = body

    def forget(self, key: Key | None = None) -> None:
        with self._lock:
            if key is None:
                self._bodies.clear()
            else:
                self._bodies.pop(key, None)

    def get(self, key: Key) -> bytes | None:
        with self._lock:
            return self._bodies.get(key)


def encoded(body: object) -> bytes:
    """What :class:`AsGiven` sends for ``body``: bytes as they are, else compact JSON."""
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    return json.dumps(body, separators=(",", ":")).encode()


def deep_json(depth: int, *, kind: str = "[", leaf: str = "0") -> str:
    """JSON text of ``depth`` nested arrays (``kind="["``) or objects (``"{"``)."""
    if kind == "[":
        return "[" * depth + leaf + "]" * depth
    return '{"a":' * depth + leaf + "}" * depth


def with_raw(obj: dict[str, Any], path: tuple[str | int, ...], raw_json: str) -> bytes:
    """``obj`` as JSON with the value at ``path`` replaced by the JSON text ``raw_json``
    (which may be deeper than ``json.dumps`` can write)."""
    marker = "\x00HOSTILE\x00"
    copied = json.loads(json.dumps(obj))
    target: Any = copied
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = marker
    return json.dumps(copied, separators=(",", ":")).replace(
        json.dumps(marker), raw_json).encode()


def huge_string(size: int) -> str:
    """A string of ``size`` characters (for annotations, names, parameters)."""
    return "x" * size
