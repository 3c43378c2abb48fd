"""Kubernetes objects as raw JSON dicts, and the few fields every caller reads from them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]
"""An object as the API server sends it: nothing dropped, nothing converted."""


def object_name(obj: Mapping[str, Any]) -> str:
    """``metadata.name``, or "" where the object has none."""
    return str((obj.get("metadata") or {}).get("name") or "")
