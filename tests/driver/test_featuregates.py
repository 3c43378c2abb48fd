"""Feature gates: gpudra's names, and NVIDIA's accepted so its values files work unchanged."""

from __future__ import annotations

import pytest

from gpudra.driver.featuregates import (
    ALIASES,
    DEFAULTS,
    IGNORED,
    KNOWN,
    OFF_ONLY,
    FeatureGateError,
    parse_feature_gates,
)


def test_defaults_and_overrides():
    gates = parse_feature_gates("DynamicMIG=false, MPSSupport=TRUE")
    assert not gates.enabled("DynamicMIG") and gates.enabled("MPSSupport")
    assert gates.enabled("DeviceHealthCheck") is DEFAULTS["DeviceHealthCheck"]
    assert gates.notes == ()
    assert parse_feature_gates(None).values == {} and parse_feature_gates("").values == {}


def test_nvidia_health_check_name_is_a_deprecated_alias():
    gates = parse_feature_gates("NVMLDeviceHealthCheck=false")
    assert not gates.enabled("DeviceHealthCheck")
    assert not gates.enabled("NVMLDeviceHealthCheck")
    assert gates.values == {"DeviceHealthCheck": False}
    (note,) = gates.notes
    assert "NVMLDeviceHealthCheck is NVIDIA's name for DeviceHealthCheck" in note
    assert "deprecated: use DeviceHealthCheck=false" in note


def test_alias_and_name_must_agree():
    assert parse_feature_gates("NVMLDeviceHealthCheck=true,DeviceHealthCheck=true").enabled(
        "DeviceHealthCheck")
    with pytest.raises(FeatureGateError, match="DeviceHealthCheck and NVMLDeviceHealthCheck"):
        parse_feature_gates("DeviceHealthCheck=true,NVMLDeviceHealthCheck=false")


@pytest.mark.parametrize("name", sorted(IGNORED))
def test_gates_of_components_gpudra_lacks_are_ignored_with_a_note(name):
    for value in ("true", "false"):
        gates = parse_feature_gates(f"{name}={value}")
        assert gates.values == {}
        assert f"feature gate {name} is ignored" in gates.notes[0]


@pytest.mark.parametrize("name", sorted(OFF_ONLY))
def test_features_gpudra_lacks_may_only_be_off(name):
    assert parse_feature_gates(f"{name}=false").values == {}
    with pytest.raises(FeatureGateError, match=f"{name}=true: gpudra does not implement"):
        parse_feature_gates(f"{name}=true")


@pytest.mark.parametrize(("text", "complaint"), [
    ("DynamicMig=true", "unknown feature gate 'DynamicMig'"),
    ("DynamicMIG", "expected Name=true or Name=false"),
    ("DynamicMIG=yes", "expected Name=true or Name=false"),
])
def test_bad_gates(text, complaint):
    with pytest.raises(FeatureGateError, match=complaint):
        parse_feature_gates(text)


def test_every_nvidia_gate_is_known():
    """NVIDIA's chart (v0.4) lists these gates; each one has a meaning here."""
    nvidia = {"TimeSlicingSettings", "MPSSupport", "DynamicMIG", "PassthroughSupport",
              "NVMLDeviceHealthCheck", "DeviceMetadata", "IMEXDaemonsWithDNSNames",
              "ComputeDomainCliques", "CrashOnNVLinkFabricErrors"}
    assert nvidia <= KNOWN
    assert set(ALIASES.values()) <= set(DEFAULTS)
