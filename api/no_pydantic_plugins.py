"""Pydantic without plugin discovery: import this before the first model class is built.

When pydantic builds a model's validator it asks its plugin loader for plugins (``pydantic``
entry points), and that loader's import pulls in ``importlib.metadata`` and with it
``email``, ``zipfile``, ``csv`` and ``calendar``: 1.1 MiB of the node daemon's idle memory
(issue 14), for plugins gpudra never uses. This puts a loader that finds none in its place,
the answer pydantic itself gives under ``PYDANTIC_DISABLE_PLUGINS=__all__``. If pydantic was
asked for plugins already (its loader is imported), nothing changes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from types import ModuleType

_LOADER = "pydantic.plugin._loader"


def _no_plugins() -> Iterable[object]:
    return ()


if _LOADER not in sys.modules:
    _module = ModuleType(_LOADER, "gpudra: pydantic's plugin loader, finding no plugins")
    _module.get_plugins = _no_plugins  # type: ignore[attr-defined]
    sys.modules[_LOADER] = _module
