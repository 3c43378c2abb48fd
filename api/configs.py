"""Opaque device configs, drop-in with NVIDIA's ``resource.nvidia.com/v1beta1``.

``GpuConfig`` applies to full GPUs and ``MigDeviceConfig`` to MIG devices. Decoding is
strict: unknown fields, wrong types (``"50"`` for an int), snake_case keys and unknown
enum values are errors whose message names the field path. ``computeMode`` is an additive
gpudra extension. Nothing here applies a config; the driver does.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    StrictStr,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpudra.api.quantity import QuantityError, parse_quantity

GROUP_VERSION = "resource.nvidia.com/v1beta1"
MIB = 1 << 20
OPAQUE_PARAMETERS_MAX_BYTES = 10 * 1024

TimeSliceInterval = Literal["Default", "Short", "Medium", "Long"]
TIME_SLICE_VALUES: dict[str, int] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
"""``nvidia-smi compute-policy --set-timeslice`` values per interval name."""

ComputeMode = Literal["Default", "ExclusiveProcess", "Prohibited"]


class ConfigError(ValueError):
    """An opaque config is invalid; ``problems`` are ``field: message`` strings."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class _Strict(BaseModel):
    # camelCase on the wire only: snake_case input is rejected as an unknown field.
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
        frozen=True,
        strict=True,
    )


def _mib(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"{field} must be a quantity such as '8Gi'")
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from exc
    mib = int(amount // MIB)
    if mib < 1:
        raise ValueError(f"{field} must be at least 1Mi, got {value!r}")
    return mib


class MpsConfig(_Strict):
    default_active_thread_percentage: Annotated[StrictInt, Field(ge=0, le=100)] | None = None
    default_pinned_device_memory_limit: StrictStr | StrictInt | None = None
    default_per_device_pinned_memory_limit: dict[StrictStr, StrictStr | StrictInt] | None = None

    @field_validator("default_pinned_device_memory_limit")
    @classmethod
    def _check_default_limit(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            _mib(value, "defaultPinnedDeviceMemoryLimit")
        return value

    @field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _check_device_limits(
        cls, value: dict[str, str | int] | None
    ) -> dict[str, str | int] | None:
        for key, limit in (value or {}).items():
            if not key:
                raise ValueError("device keys must be a GPU/MIG UUID or an index")
            _mib(limit, f"defaultPerDevicePinnedMemoryLimit[{key}]")
        return value

    def pinned_limits_mib(self, uuids: list[str]) -> dict[str, int]:
        """Per-device pinned-memory limits in MiB, keyed by UUID (index keys resolved)."""
        ordered = sorted(uuids)
        limits: dict[str, int] = {}
        if self.default_pinned_device_memory_limit is not None:
            mib = _mib(self.default_pinned_device_memory_limit, "defaultPinnedDeviceMemoryLimit")
            limits = dict.fromkeys(ordered, mib)
        for key, limit in (self.default_per_device_pinned_memory_limit or {}).items():
            if key in ordered:
                uuid = key
            elif key.isdigit() and int(key) < len(ordered):
                uuid = ordered[int(key)]
            else:
                raise ConfigError([f"sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: key "
                                   f"{key!r} is neither a UUID of the claim's devices nor an "
                                   f"index below {len(ordered)}"])
            limits[uuid] = _mib(limit, f"defaultPerDevicePinnedMemoryLimit[{key}]")
        return limits


class TimeSlicingConfig(_Strict):
    interval: TimeSliceInterval = "Default"


class GpuSharing(_Strict):
    strategy: Literal["TimeSlicing", "MPS"]
    time_slicing_config: TimeSlicingConfig | None = None
    mps_config: MpsConfig | None = None

    @model_validator(mode="after")
    def _one_strategy_config(self) -> GpuSharing:
        if self.strategy == "TimeSlicing" and self.mps_config is not None:
            raise ValueError("mpsConfig is only valid with strategy MPS")
        if self.strategy == "MPS" and self.time_slicing_config is not None:
            raise ValueError("timeSlicingConfig is only valid with strategy TimeSlicing")
        return self


class MigDeviceSharing(_Strict):
    # MIG devices cannot take a time-slice setting, so there is no timeSlicingConfig here.
    strategy: Literal["TimeSlicing", "MPS"]
    mps_config: MpsConfig | None = None

    @model_validator(mode="after")
    def _one_strategy_config(self) -> MigDeviceSharing:
        if self.strategy == "TimeSlicing" and self.mps_config is not None:
            raise ValueError("mpsConfig is only valid with strategy MPS")
        return self


def _check_compute_mode(mode: str | None, strategy: str | None) -> None:
    if mode is None or strategy is None:
        return
    if strategy == "MPS" and mode != "ExclusiveProcess":
        raise ValueError(f"computeMode {mode} conflicts with sharing strategy MPS, which runs "
                         "the GPU in ExclusiveProcess mode")
    if strategy == "TimeSlicing" and mode != "Default":
        raise ValueError(f"computeMode {mode} conflicts with sharing strategy TimeSlicing, which "
                         "needs compute mode Default")


class GpuConfig(_Strict):
    api_version: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None
    compute_mode: ComputeMode | None = None

    @model_validator(mode="after")
    def _consistent(self) -> GpuConfig:
        _check_compute_mode(self.compute_mode, self.sharing.strategy if self.sharing else None)
        return self


class MigDeviceConfig(_Strict):
    api_version: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["MigDeviceConfig"]
    sharing: MigDeviceSharing | None = None
    compute_mode: ComputeMode | None = None

    @model_validator(mode="after")
    def _consistent(self) -> MigDeviceConfig:
        _check_compute_mode(self.compute_mode, self.sharing.strategy if self.sharing else None)
        return self


DeviceConfig = GpuConfig | MigDeviceConfig


def _discriminate(value: Any) -> str | None:
    # Must return None for non-objects so a JSON list gives a ValidationError, not a crash.
    if isinstance(value, dict):
        return f"{value.get('apiVersion')}/{value.get('kind')}"
    if isinstance(value, GpuConfig | MigDeviceConfig):
        return f"{value.api_version}/{value.kind}"
    return None


_ADAPTER: TypeAdapter[DeviceConfig] = TypeAdapter(
    Annotated[
        Annotated[GpuConfig, Tag(f"{GROUP_VERSION}/GpuConfig")]
        | Annotated[MigDeviceConfig, Tag(f"{GROUP_VERSION}/MigDeviceConfig")],
        Discriminator(
            _discriminate,
            custom_error_type="unknown_config",
            custom_error_message=(
                f"unsupported apiVersion/kind: expected apiVersion {GROUP_VERSION} and kind "
                "GpuConfig or MigDeviceConfig"
            ),
        ),
    ]
)


def _path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        text = str(item)
        if text.startswith(f"{GROUP_VERSION}/"):
            continue  # the discriminator tag is noise in a user-facing path
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + text)
    return "".join(parts) or "parameters"


def _problems(exc: ValidationError) -> list[str]:
    problems = []
    for error in exc.errors(include_url=False):
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        elif error["type"] == "unknown_config" and isinstance(error.get("input"), dict):
            got = error["input"]
            message = (f"{message} (got apiVersion {got.get('apiVersion')!r}, "
                       f"kind {got.get('kind')!r})")
        elif message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
        problems.append(f"{_path(tuple(error['loc']))}: {message}")
    return problems


def decode_config(parameters: object) -> DeviceConfig:
    """Decode and validate one opaque config (a dict, or the JSON text of one)."""
    if isinstance(parameters, str | bytes):
        if len(parameters) > OPAQUE_PARAMETERS_MAX_BYTES:
            raise ConfigError([f"parameters: larger than {OPAQUE_PARAMETERS_MAX_BYTES} bytes"])
        try:
            parameters = json.loads(parameters)
        except json.JSONDecodeError as exc:
            raise ConfigError([f"parameters: not valid JSON: {exc}"]) from exc
    if not isinstance(parameters, dict):
        raise ConfigError([f"parameters: must be a JSON object, got {type(parameters).__name__}"])
    try:
        return _ADAPTER.validate_python(parameters)
    except ValidationError as exc:
        raise ConfigError(_problems(exc)) from exc


def validate_opaque(parameters: object) -> list[str]:
    """Problems with one opaque config for this driver; empty when it is valid."""
    try:
        decode_config(parameters)
    except ConfigError as exc:
        return exc.problems
    return []
