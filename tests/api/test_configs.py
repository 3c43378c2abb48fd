"""Opaque config decoding: NVIDIA-compatible meaning, strict errors that name the field."""

from __future__ import annotations

import pytest

from gpudra.api.configs import (
    ConfigError,
    GpuConfig,
    MigDeviceConfig,
    decode_config,
    validate_opaque,
)

GV = "resource.nvidia.com/v1beta1"


def gpu(**fields):
    return {"apiVersion": GV, "kind": "GpuConfig", **fields}


def mig(**fields):
    return {"apiVersion": GV, "kind": "MigDeviceConfig", **fields}


def mps(**config):
    return {"strategy": "MPS", "mpsConfig": config}


INVALID = [
    ("not an object", [1, 2], "parameters: must be a JSON object"),
    ("null", None, "parameters: must be a JSON object"),
    ("bad JSON text", "{nope", "parameters: not valid JSON"),
    ("unknown kind", {"apiVersion": GV, "kind": "GpuConfg"}, "unsupported apiVersion/kind"),
    ("unknown apiVersion", {"apiVersion": "resource.nvidia.com/v2", "kind": "GpuConfig"},
     "unsupported apiVersion/kind"),
    ("missing kind", {"apiVersion": GV}, "unsupported apiVersion/kind"),
    ("unknown top-level field", gpu(computMode="Default"), "computMode: unknown field"),
    ("snake_case key", gpu(compute_mode="Default"), "compute_mode: unknown field"),
    ("unknown strategy", gpu(sharing={"strategy": "Magic"}), "sharing.strategy:"),
    ("missing strategy", gpu(sharing={}), "sharing.strategy: Field required"),
    ("bad interval", gpu(sharing={"strategy": "TimeSlicing",
                                  "timeSlicingConfig": {"interval": "Forever"}}),
     "sharing.timeSlicingConfig.interval:"),
    ("unknown field in timeSlicingConfig",
     gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}}),
     "sharing.timeSlicingConfig.intervall: unknown field"),
    ("mps config with time slicing", gpu(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}),
     "sharing: mpsConfig is only valid with strategy MPS"),
    ("time slicing config with mps", gpu(sharing={"strategy": "MPS", "timeSlicingConfig": {}}),
     "sharing: timeSlicingConfig is only valid with strategy TimeSlicing"),
    ("thread percentage too high", gpu(sharing=mps(defaultActiveThreadPercentage=101)),
     "sharing.mpsConfig.defaultActiveThreadPercentage: Input should be less than or equal to 100"),
    ("thread percentage negative", gpu(sharing=mps(defaultActiveThreadPercentage=-1)),
     "sharing.mpsConfig.defaultActiveThreadPercentage:"),
    ("thread percentage as string", gpu(sharing=mps(defaultActiveThreadPercentage="50")),
     "sharing.mpsConfig.defaultActiveThreadPercentage: Input should be a valid integer"),
    ("thread percentage as bool", gpu(sharing=mps(defaultActiveThreadPercentage=True)),
     "sharing.mpsConfig.defaultActiveThreadPercentage:"),
    ("bad memory quantity", gpu(sharing=mps(defaultPinnedDeviceMemoryLimit="10Kx")),
     "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: invalid quantity"),
    ("memory limit below 1Mi", gpu(sharing=mps(defaultPinnedDeviceMemoryLimit="512Ki")),
     "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: defaultPinnedDeviceMemoryLimit must be"),
    ("bad per-device limit", gpu(sharing=mps(defaultPerDevicePinnedMemoryLimit={"0": "lots"})),
     "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: invalid quantity"),
    ("unknown compute mode", gpu(computeMode="Exclusive"), "computeMode:"),
    ("compute mode against MPS", gpu(sharing={"strategy": "MPS"}, computeMode="Default"),
     "computeMode Default conflicts with sharing strategy MPS"),
    ("compute mode against time slicing",
     gpu(sharing={"strategy": "TimeSlicing"}, computeMode="Prohibited"),
     "computeMode Prohibited conflicts with sharing strategy TimeSlicing"),
    ("time slicing config on a MIG device",
     mig(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {}}),
     "sharing.timeSlicingConfig: unknown field"),
    ("sharing not an object", gpu(sharing="MPS"), "sharing:"),
    ("oversized JSON text", '{"x": "' + "a" * 11000 + '"}', "larger than 10240 bytes"),
]


@pytest.mark.parametrize(("case", "parameters", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_configs_are_rejected_naming_the_field(case, parameters, expected):
    with pytest.raises(ConfigError) as info:
        decode_config(parameters)
    assert any(expected in problem for problem in info.value.problems), info.value.problems
    assert validate_opaque(parameters) == info.value.problems


def test_empty_gpu_config_means_nothing_to_do():
    config = decode_config(gpu())
    assert isinstance(config, GpuConfig)
    assert config.sharing is None and config.compute_mode is None


def test_time_slicing_defaults_to_default_interval():
    config = decode_config(gpu(sharing={"strategy": "TimeSlicing"}))
    assert isinstance(config, GpuConfig) and config.sharing is not None
    assert config.sharing.time_slicing_config is None  # applied as Default by the driver


def test_mps_limits_resolve_indexes_and_uuids():
    config = decode_config(mig(sharing=mps(
        defaultActiveThreadPercentage=50,
        defaultPinnedDeviceMemoryLimit="8Gi",
        defaultPerDevicePinnedMemoryLimit={"1": "1Gi", "MIG-a": "2048Mi"},
    )))
    assert isinstance(config, MigDeviceConfig)
    assert config.sharing is not None and config.sharing.mps_config is not None
    limits = config.sharing.mps_config.pinned_limits_mib(["MIG-b", "MIG-a"])
    # index 1 of the sorted UUIDs is MIG-b; the explicit UUID key wins for MIG-a
    assert limits == {"MIG-a": 2048, "MIG-b": 1024}


def test_unknown_device_key_in_limits_is_an_error_at_resolution():
    config = decode_config(gpu(sharing=mps(defaultPerDevicePinnedMemoryLimit={"7": "1Gi"})))
    assert isinstance(config, GpuConfig) and config.sharing and config.sharing.mps_config
    with pytest.raises(ConfigError, match="defaultPerDevicePinnedMemoryLimit: key '7'"):
        config.sharing.mps_config.pinned_limits_mib(["GPU-a"])


def test_json_text_is_accepted():
    assert isinstance(decode_config(b'{"apiVersion": "%s", "kind": "GpuConfig"}' % GV.encode()),
                      GpuConfig)
