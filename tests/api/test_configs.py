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
MIB = 1 << 20


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
     "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got '512Ki'"),
    ("bad per-device limit", gpu(sharing=mps(defaultPerDevicePinnedMemoryLimit={"0": "lots"})),
     "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: invalid quantity 'lots'"),
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

MORE_INVALID = [
    ("wrong apiVersion names what it got",
     {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
     "parameters: unsupported apiVersion/kind: expected apiVersion resource.nvidia.com/v1beta1 "
     "and kind GpuConfig or MigDeviceConfig (got apiVersion 'resource.nvidia.com/v1', "
     "kind 'GpuConfig')"),
    ("missing kind is named", {"apiVersion": GV}, f"(got apiVersion '{GV}', no kind)"),
    ("kind of the wrong type", {"apiVersion": GV, "kind": 7}, "a non-string kind)"),
    ("apiVersion split across kind", {"apiVersion": "resource.nvidia.com",
                                      "kind": "v1beta1/GpuConfig"}, "unsupported apiVersion/kind"),
    ("interval VeryLong", gpu(sharing={"strategy": "TimeSlicing",
                                       "timeSlicingConfig": {"interval": "VeryLong"}}),
     "sharing.timeSlicingConfig.interval: Input should be 'Default', 'Short', 'Medium' or 'Long'"),
    ("interval null", gpu(sharing={"strategy": "TimeSlicing",
                                   "timeSlicingConfig": {"interval": None}}),
     "sharing.timeSlicingConfig.interval: Input should be"),
    ("strategy null", gpu(sharing={"strategy": None}),
     "sharing.strategy: Input should be 'TimeSlicing' or 'MPS'"),
    ("sharing a list", mig(sharing=[]),
     "sharing: Input should be a valid dictionary or instance of MigDeviceSharing"),
    ("mpsConfig a string", gpu(sharing={"strategy": "MPS", "mpsConfig": "x"}),
     "sharing.mpsConfig: Input should be a valid dictionary or instance of MpsConfig"),
    ("timeSlicingConfig a number", gpu(sharing={"strategy": "TimeSlicing",
                                                "timeSlicingConfig": 3}),
     "sharing.timeSlicingConfig: Input should be a valid dictionary or instance of "
     "TimeSlicingConfig"),
    ("thread percentage a float", gpu(sharing=mps(defaultActiveThreadPercentage=50.0)),
     "sharing.mpsConfig.defaultActiveThreadPercentage: Input should be a valid integer"),
    ("thread percentage negative, exact message",
     gpu(sharing=mps(defaultActiveThreadPercentage=-1)),
     "sharing.mpsConfig.defaultActiveThreadPercentage: Input should be greater than or equal to 0"),
    ("memory limit a bool", gpu(sharing=mps(defaultPinnedDeviceMemoryLimit=True)),
     "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be a quantity such as '8Gi'"),
    ("memory limit a float", gpu(sharing=mps(defaultPinnedDeviceMemoryLimit=1.5)),
     "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be a quantity such as '8Gi'"),
    ("memory limit zero bytes", gpu(sharing=mps(defaultPinnedDeviceMemoryLimit=0)),
     "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got 0"),
    ("memory limit one byte short of 1Mi", gpu(sharing=mps(defaultPinnedDeviceMemoryLimit=MIB - 1)),
     "must be at least 1Mi, got 1048575"),
    ("memory limit negative", gpu(sharing=mps(defaultPinnedDeviceMemoryLimit="-2Gi")),
     "must be at least 1Mi, got '-2Gi'"),
    ("memory limit with blanks (Kubernetes quantities have none)",
     gpu(sharing=mps(defaultPinnedDeviceMemoryLimit=" 2Gi")), "invalid quantity ' 2Gi'"),
    ("memory limit with a non-ASCII digit", gpu(sharing=mps(defaultPinnedDeviceMemoryLimit="٣Gi")),
     "invalid quantity"),
    ("memory limit with a quote in it", gpu(sharing=mps(defaultPinnedDeviceMemoryLimit="8'Gi")),
     "invalid quantity '8'Gi'"),
    ("per-device limits a list", gpu(sharing=mps(defaultPerDevicePinnedMemoryLimit=[])),
     "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: Input should be a valid dictionary"),
    ("per-device limit below 1Mi", mig(sharing=mps(defaultPerDevicePinnedMemoryLimit={
        "MIG-a": "1Gi", "MIG-b": "1Ki"})),
     "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[MIG-b]: must be at least 1Mi"),
    ("per-device limit a bool", gpu(sharing=mps(defaultPerDevicePinnedMemoryLimit={"0": False})),
     "defaultPerDevicePinnedMemoryLimit[0]: must be a quantity such as '8Gi'"),
    ("empty device key", gpu(sharing=mps(defaultPerDevicePinnedMemoryLimit={"": "1Gi"})),
     "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: device keys must be a GPU/MIG UUID "
     "or an index"),
    ("unknown field in mpsConfig", mig(sharing=mps(defaultActiveThreadPercent=5)),
     "sharing.mpsConfig.defaultActiveThreadPercent: unknown field"),
    ("mps config with time slicing on a MIG device",
     mig(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}),
     "sharing: mpsConfig is only valid with strategy MPS"),
    ("compute mode against MPS on a MIG device",
     mig(sharing={"strategy": "MPS"}, computeMode="Prohibited"),
     "parameters: computeMode Prohibited conflicts with sharing strategy MPS, which runs the GPU "
     "in ExclusiveProcess mode"),
    ("compute mode not a string", gpu(computeMode=1),
     "computeMode: Input should be 'Default', 'ExclusiveProcess' or 'Prohibited'"),
    ("several problems at once", gpu(computMode="Default", sharing={"strategy": "X", "y": 2}),
     "sharing.y: unknown field"),
]
"""More bad configs: every kind of rule, with the exact message ``gpudra validate`` shows."""

VALID = [
    ("empty GPU config", gpu()),
    ("empty MIG config", mig()),
    ("time slicing", gpu(sharing={"strategy": "TimeSlicing"})),
    ("time slicing with an interval", gpu(sharing={"strategy": "TimeSlicing",
                                                   "timeSlicingConfig": {"interval": "Long"}}),),
    ("time slicing with an empty config", gpu(sharing={"strategy": "TimeSlicing",
                                                       "timeSlicingConfig": {}})),
    ("time slicing on a MIG device", mig(sharing={"strategy": "TimeSlicing"})),
    ("nulls mean unset", gpu(sharing=None, computeMode=None)),
    ("null configs inside sharing", gpu(sharing={"strategy": "MPS", "mpsConfig": None,
                                                 "timeSlicingConfig": None})),
    ("MPS with every limit", gpu(sharing=mps(defaultActiveThreadPercentage=0,
                                             defaultPinnedDeviceMemoryLimit="1Mi",
                                             defaultPerDevicePinnedMemoryLimit={
                                                 "0": 1 << 30, "GPU-a": "0.5Gi"}))),
    ("MPS at 100 percent", mig(sharing=mps(defaultActiveThreadPercentage=100))),
    ("limits as exponents and decimals", gpu(sharing=mps(defaultPinnedDeviceMemoryLimit="1.5e9",
                                                          defaultPerDevicePinnedMemoryLimit={
                                                              "1": "2M", "2": ".001Ti"}))),
    ("MPS with a matching compute mode", gpu(sharing={"strategy": "MPS"},
                                             computeMode="ExclusiveProcess")),
    ("time slicing with a matching compute mode", mig(sharing={"strategy": "TimeSlicing"},
                                                      computeMode="Default")),
    ("compute mode alone", gpu(computeMode="Prohibited")),
    ("empty per-device limits", gpu(sharing=mps(defaultPerDevicePinnedMemoryLimit={}))),
]
"""Configs NVIDIA's driver accepts: decoded without a problem (and admitted by the policy)."""


@pytest.mark.parametrize(("case", "parameters", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_configs_are_rejected_naming_the_field(case, parameters, expected):
    with pytest.raises(ConfigError) as info:
        decode_config(parameters)
    assert any(expected in problem for problem in info.value.problems), info.value.problems
    assert validate_opaque(parameters) == info.value.problems


@pytest.mark.parametrize(("case", "parameters", "expected"), MORE_INVALID,
                         ids=[c[0] for c in MORE_INVALID])
def test_more_invalid_configs_name_field_and_value(case, parameters, expected):
    problems = validate_opaque(parameters)
    assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize(("case", "parameters"), VALID, ids=[c[0] for c in VALID])
def test_valid_configs_decode(case, parameters):
    assert validate_opaque(parameters) == []


def test_every_bad_per_device_limit_is_named():
    """Each key is checked on its own, so all bad ones are reported (the admission policy
    reports them too, in whatever order the apiserver walks the map)."""
    problems = validate_opaque(gpu(sharing=mps(defaultPerDevicePinnedMemoryLimit={
        "0": "1Ki", "1": "1Gi", "2": "lots"})))
    assert [p.split(":")[0] for p in problems] == [
        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]",
        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[2]"]


def test_cross_field_rules_wait_for_the_fields_to_be_valid():
    """Like pydantic's model validators, a rule across fields speaks only when the fields
    under it are valid: one problem per mistake, not a cascade."""
    assert validate_opaque(gpu(sharing={"strategy": "MPS", "timeSlicingConfig": {"x": 1}},
                               computeMode="Default")) == [
        "sharing.timeSlicingConfig.x: unknown field"]
    assert validate_opaque(gpu(sharing={"strategy": "MPS"}, computeMode="Default", extra=1)) == [
        "extra: unknown field"]


def test_json_schema_carries_the_rules_beyond_types():
    from gpudra.api.configs import config_schemas

    schemas = config_schemas()
    assert set(schemas) == {"GpuConfig", "MigDeviceConfig"}
    gpu_schema = schemas["GpuConfig"]
    assert gpu_schema["x-gpudra-compute-mode-of-strategy"]["MPS"]["computeMode"] == \
        "ExclusiveProcess"
    assert gpu_schema["$defs"]["GpuSharing"]["x-gpudra-only-with-strategy"] == {
        "timeSlicingConfig": "TimeSlicing", "mpsConfig": "MPS"}
    mig_sharing = schemas["MigDeviceConfig"]["$defs"]["MigDeviceSharing"]
    assert "timeSlicingConfig" not in mig_sharing["properties"]


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
