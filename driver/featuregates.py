"""Feature gates: ``--feature-gates DynamicMIG=false,MPSSupport=true``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULTS: Mapping[str, bool] = {
    "DynamicMIG": True,
    "TimeSlicingSettings": True,
    "MPSSupport": True,
    "ComputeModeSettings": True,
    "DeviceHealthCheck": True,
}


class FeatureGateError(ValueError):
    """A ``--feature-gates`` value names an unknown gate or is not ``Name=true|false``."""


@dataclass(frozen=True)
class FeatureGates:
    values: Mapping[str, bool]

    def enabled(self, name: str) -> bool:
        if name not in DEFAULTS:
            raise KeyError(f"unknown feature gate {name!r}")
        return self.values.get(name, DEFAULTS[name])


def parse_feature_gates(text: str | None) -> FeatureGates:
    values: dict[str, bool] = {}
    for raw_item in (text or "").split(","):
        item = raw_item.strip()
        if not item:
            continue
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or raw.strip().lower() not in ("true", "false"):
            raise FeatureGateError(f"feature gate {item!r}: expected Name=true or Name=false")
        if name not in DEFAULTS:
            known = ", ".join(sorted(DEFAULTS))
            raise FeatureGateError(f"unknown feature gate {name!r} (known: {known})")
        values[name] = raw.strip().lower() == "true"
    return FeatureGates(values)
