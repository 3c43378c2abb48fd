"""What CEL sees of a device: ``device.driver``, ``.attributes``, ``.capacity``, ….

A :class:`DeviceView` is made once per device from a ResourceSlice device dict. It is cheap
(it keeps the dict) and builds the CEL values only when an expression really has to run,
because selectors are mostly answered from a cache keyed by the few values they read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from celpy import celtypes

from gpudra.driver.shown import shown
from gpudra.scheduling.cel import semver
from gpudra.scheduling.cel.errors import CelEvalError
from gpudra.scheduling.cel.quantity import Quantity
from gpudra.scheduling.cel.quantity import parse as parse_quantity


class OptionalValue:
    """CEL ``optional(T)``: the result of ``x.?field`` and ``m[?key]``."""

    __slots__ = ("present", "value")

    def __init__(self, value: Any = None, present: bool = False) -> None:
        self.value = value
        self.present = present

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OptionalValue):
            return NotImplemented
        return self.present == other.present and (not self.present or self.value == other.value)

    def __hash__(self) -> int:
        return hash(self.present)

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.present else "optional.none()"


OPTIONAL_NONE = OptionalValue()


class OptionalNamespace:
    """The ``optional`` identifier, so ``optional.of(x)`` / ``optional.none()`` resolve."""

    def __repr__(self) -> str:
        return "optional"


OPTIONAL_NAMESPACE = OptionalNamespace()


class DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map.

    Kubernetes wraps these maps so ``device.attributes["other.vendor.com"].x`` is a plain
    "no such key" on ``x`` rather than on the domain; ``in`` still sees only real domains.
    """

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


def split_name(driver: str, qualified: str) -> tuple[str, str]:
    """``d/x`` → (``d``, ``x``); a bare ``x`` lives in the device's driver domain."""
    domain, slash, name = qualified.partition("/")
    return (domain, name) if slash else (driver, qualified)


def attribute_value(encoded: Mapping[str, Any]) -> Any:
    """One ResourceSlice attribute (``{"int": 3}``, ``{"version": "1.2.3"}`` …) as a CEL value."""
    for kind, value in encoded.items():
        if kind == "int":
            return celtypes.IntType(value)
        if kind == "bool":
            return celtypes.BoolType(value)
        if kind == "string":
            return celtypes.StringType(value)
        if kind == "version":
            return _version(value)
        if kind in ("ints", "bools", "strings", "versions"):
            return celtypes.ListType(attribute_value({kind[:-1]: v}) for v in value)
    raise CelEvalError(f"unsupported attribute value {dict(encoded)!r}")


def _version(text: str) -> semver.Semver:
    try:
        return semver.parse(text)
    except ValueError as exc:
        raise CelEvalError(f"attribute version {shown(text)} is not semver: {exc}") from None


def _capacity_value(encoded: Mapping[str, Any]) -> Quantity:
    text = str(encoded.get("value", ""))
    try:
        return parse_quantity(text)
    except ValueError as exc:
        raise CelEvalError(f"capacity {text!r}: {exc}") from None


def frozen(value: Any) -> Any:
    """A hashable stand-in for a JSON value (attribute encodings are small dicts)."""
    if type(value) is dict:
        # The common case, {"string": "gpu"} or {"value": "80Gi"}: scalar entries.
        items = tuple(value.items())
        try:
            hash(items)
        except TypeError:
            pass
        else:
            return items
    if isinstance(value, Mapping):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    return value


MISSING = ("<missing>",)
"""Cache-key part for an attribute or capacity the device does not have."""


class DeviceView:
    """One device as CEL sees it; build with :func:`device_view`."""

    __slots__ = ("_activation", "_content_key", "driver", "raw")

    def __init__(self, driver: str, raw: Mapping[str, Any]) -> None:
        self.driver = driver
        self.raw = raw
        self._activation: dict[str, Any] | None = None
        self._content_key: tuple[Any, ...] | None = None

    @property
    def name(self) -> str:
        return str(self.raw.get("name", ""))

    def entry_key(self, field: str, domain: str, name: str) -> Any:
        """One attribute (``field="attributes"``) or capacity as a hashable cache-key part.

        ``MISSING`` when absent. For the driver's own domain both spellings (``x`` and
        ``<driver>/x``) are part of the key, since either may be the one CEL sees.
        """
        table = self.raw.get(field)
        if not table:
            return MISSING
        qualified = table.get(f"{domain}/{name}")
        if domain != self.driver:
            return MISSING if qualified is None else frozen(qualified)
        bare = table.get(name)
        if qualified is None:
            return MISSING if bare is None else frozen(bare)
        return (MISSING if bare is None else frozen(bare), frozen(qualified))

    def content_key(self) -> tuple[Any, ...]:
        """Everything CEL can see of this device, hashable; for expressions read as a whole."""
        if self._content_key is None:
            visible = {k: self.raw.get(k) for k in ("attributes", "capacity",
                                                    "allowMultipleAllocations")}
            self._content_key = (self.driver, json.dumps(visible, sort_keys=True))
        return self._content_key

    def activation(self) -> dict[str, Any]:
        """The CEL variables (``device``), built on first use."""
        if self._activation is None:
            self._activation = {"device": self._device(), "optional": OPTIONAL_NAMESPACE}
        return self._activation

    def _device(self) -> celtypes.MapType:
        attributes: dict[str, dict[str, Any]] = {}
        for qualified, encoded in (self.raw.get("attributes") or {}).items():
            domain, name = split_name(self.driver, qualified)
            attributes.setdefault(domain, {})[name] = attribute_value(encoded)
        capacity: dict[str, dict[str, Any]] = {}
        for qualified, encoded in (self.raw.get("capacity") or {}).items():
            domain, name = split_name(self.driver, qualified)
            capacity.setdefault(domain, {})[name] = _capacity_value(encoded)
        return celtypes.MapType({
            celtypes.StringType("driver"): celtypes.StringType(self.driver),
            celtypes.StringType("attributes"): _domains(attributes),
            celtypes.StringType("capacity"): _domains(capacity),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                bool(self.raw.get("allowMultipleAllocations", False))),
        })


def _domains(by_domain: dict[str, dict[str, Any]]) -> DomainMap:
    return DomainMap({
        celtypes.StringType(domain): celtypes.MapType(
            {celtypes.StringType(k): v for k, v in values.items()})
        for domain, values in by_domain.items()
    })


def device_view(driver: str, device: Mapping[str, Any]) -> DeviceView:
    """The CEL view of one ResourceSlice device dict published by ``driver``."""
    return DeviceView(driver, device)
