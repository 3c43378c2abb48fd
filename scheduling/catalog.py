"""What this driver publishes, as the offline checks see it: attribute names with their DRA
types, and capacity names, taken from the device model's schema (never a second list).

``validate`` and ``explain`` check CEL selectors against it: a misspelt attribute compiles
fine but fails every allocation at scheduling time.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Final

from gpudra.driver.device_model import (
    MEMORY_SLICE_CAPACITY,
    PUBLISHED_ATTRIBUTES,
    PUBLISHED_CAPACITIES,
)
from gpudra.driver.devices import AttributeValue, Version

STANDARD_DOMAIN: Final = "resource.kubernetes.io"

_DRA_TYPES: Final[Mapping[type[AttributeValue], str]] = {
    str: "string", int: "int", bool: "bool", Version: "version",
}
"""The Python type of a published value → the ``DeviceAttribute`` field it is sent in."""


def _attributes(domain: str | None) -> dict[str, str]:
    """Name → DRA type of every attribute in ``domain`` (None: the driver's own), any type."""
    found: dict[str, str] = {}
    for attributes in PUBLISHED_ATTRIBUTES.values():
        for qualified, value_type in attributes.items():
            prefix, _, name = qualified.rpartition("/")
            if (prefix or None) == domain:
                found[name] = _DRA_TYPES[value_type]
    return found


ATTRIBUTES: Final = _attributes(None)
"""Attributes in the driver's own domain, with their DRA types (GPU and MIG devices)."""
STANDARD_ATTRIBUTES: Final = _attributes(STANDARD_DOMAIN)
"""Attributes in ``resource.kubernetes.io``."""
CAPACITIES: Final = tuple(dict.fromkeys(
    name for names in PUBLISHED_CAPACITIES.values() for name in names))
"""Capacities in the driver's own domain (GPU and MIG devices), besides ``memorySlice<i>``."""
_MEMORY_SLICE: Final = re.compile(rf"^{re.escape(MEMORY_SLICE_CAPACITY)}\d+$")

REMOVED: Final[Mapping[str, str]] = {
    "index": "NVIDIA's driver removed 'index' (Sept 2025); select on uuid, "
             "resource.kubernetes.io/pciBusID or numaNode instead",
    "minor": "NVIDIA's driver removed 'minor' (Sept 2025); select on uuid or "
             "resource.kubernetes.io/pciBusID instead",
    "pcieBusID": "replaced by the standard attribute resource.kubernetes.io/pciBusID",
}
"""Attributes claims written for older drivers still use, with what to select on instead."""


def suggest(name: str, candidates: Iterable[str]) -> str | None:
    """The closest known name, for "did you mean" hints."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def known_attributes(domain: str, driver: str) -> Mapping[str, str] | None:
    """Attribute name → type for a domain this driver publishes in; None for other domains."""
    if domain == driver:
        return ATTRIBUTES
    if domain == STANDARD_DOMAIN:
        return STANDARD_ATTRIBUTES
    return None


def is_known_capacity(name: str) -> bool:
    return name in CAPACITIES or bool(_MEMORY_SLICE.match(name))
