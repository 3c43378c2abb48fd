"""Feature gates: ``--feature-gates DynamicMIG=false,MPSSupport=true``.

NVIDIA's gate names are accepted too, so a values file written for NVIDIA's chart works:
the ones for features gpudra has under another name are aliases (deprecated: the daemon
logs the name to use), the ones for components gpudra does not ship are accepted and
ignored, and the ones for features gpudra lacks may only be turned off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

DEFAULTS: Mapping[str, bool] = {
    "DynamicMIG": True,
    "TimeSlicingSettings": True,
    "MPSSupport": True,
    "ComputeModeSettings": True,
    "DeviceHealthCheck": True,
    "ConsumableCapacity": True,
    "PassthroughSupport": False,
}

ALIASES: Final[Mapping[str, str]] = {"NVMLDeviceHealthCheck": "DeviceHealthCheck"}
"""NVIDIA's name → gpudra's, for the same feature (``TimeSlicingSettings``, ``MPSSupport``,
``DynamicMIG`` and ``PassthroughSupport`` are the same name in both)."""
IGNORED: Final[Mapping[str, str]] = {
    "IMEXDaemonsWithDNSNames": "NVIDIA's ComputeDomain (IMEX) components",
    "ComputeDomainCliques": "NVIDIA's ComputeDomain (IMEX) components",
    "CrashOnNVLinkFabricErrors": "NVIDIA's ComputeDomain (IMEX) components",
    "LoggingAlphaOptions": "Kubernetes' Go logging (gpudra logs with its own --log-level)",
    "LoggingBetaOptions": "Kubernetes' Go logging (gpudra logs with its own --log-level)",
    "ContextualLogging": "Kubernetes' Go logging (gpudra logs with its own --log-level)",
    "HostManagedIMEXDaemon": "NVIDIA's ComputeDomain (IMEX) components",
    # Off, NVIDIA publishes the same scalar attributes gpudra does, so ignoring it is safe.
    "DRAListTypeAttributes": "NVIDIA's list-valued device attributes",
    "ConsumableShares": ("NVIDIA's --consumable-shares (gpudra shares a GPU through its "
                         "gpu-share devices: --shareable-gpus and ConsumableCapacity)"),
}
"""NVIDIA gates for parts gpudra does not have: accepted with either value, and ignored."""
OFF_ONLY: Final[Mapping[str, str]] = {
    "DeviceMetadata": "device metadata in prepare results",
    "FabricManagerPartitioning": "Fabric Manager (NVSwitch) partitions",
}
"""NVIDIA gates for features gpudra does not implement: ``false`` is accepted, ``true`` is an
error rather than a silent no-op."""
KNOWN: Final = frozenset(DEFAULTS) | frozenset(ALIASES) | frozenset(IGNORED) | frozenset(OFF_ONLY)
"""Every name ``--feature-gates`` accepts (the chart's values schema lists the same)."""


class FeatureGateError(ValueError):
    """A ``--feature-gates`` value names an unknown gate or is not ``Name=true|false``."""


@dataclass(frozen=True)
class FeatureGates:
    values: Mapping[str, bool]
    """By gpudra's names (aliases resolved)."""
    notes: tuple[str, ...] = ()
    """What the daemon should log about the names it was given (deprecated, ignored)."""

    def enabled(self, name: str) -> bool:
        name = ALIASES.get(name, name)
        if name not in DEFAULTS:
            raise KeyError(f"unknown feature gate {name!r}")
        return self.values.get(name, DEFAULTS[name])


def parse_feature_gates(text: str | None) -> FeatureGates:
    values: dict[str, bool] = {}
    given_as: dict[str, str] = {}
    notes: list[str] = []
    for raw_item in (text or "").split(","):
        item = raw_item.strip()
        if not item:
            continue
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or raw.strip().lower() not in ("true", "false"):
            raise FeatureGateError(f"feature gate {item!r}: expected Name=true or Name=false")
        value = raw.strip().lower() == "true"
        if name not in KNOWN:
            raise FeatureGateError(
                f"unknown feature gate {name!r} (known: {', '.join(sorted(DEFAULTS))}; "
                f"NVIDIA's names accepted too: {', '.join(sorted(KNOWN - set(DEFAULTS)))})")
        if name in IGNORED:
            notes.append(f"feature gate {name} is ignored: it is for {IGNORED[name]}, which "
                         "gpudra does not include")
            continue
        if name in OFF_ONLY:
            if value:
                raise FeatureGateError(f"feature gate {name}=true: gpudra does not implement "
                                       f"{OFF_ONLY[name]}; remove it or set it to false")
            continue
        canonical = ALIASES.get(name, name)
        if name in ALIASES:
            notes.append(f"feature gate {name} is NVIDIA's name for {canonical}, accepted for "
                         f"compatibility and deprecated: use {canonical}={str(value).lower()}")
        if canonical in values and values[canonical] != value:
            raise FeatureGateError(f"feature gates {given_as[canonical]} and {name} name the same "
                                   "gate with different values")
        values[canonical] = value
        given_as[canonical] = name
    return FeatureGates(values, tuple(notes))
