"""Opaque device configs, drop-in with NVIDIA's ``resource.nvidia.com/v1beta1``.

``GpuConfig`` applies to full GPUs and ``MigDeviceConfig`` to MIG devices. Decoding is
strict: unknown fields, wrong types (``"50"`` for an int), snake_case keys and unknown
enum values are errors whose message names the field path. ``computeMode`` is an additive
gpudra extension. Nothing here applies a config; the driver does.

The models are also the source of the chart's admission policy
(``gpudra.scheduling.admission_policy`` turns their JSON schema into CEL), so every rule
that is not a plain type, enum or range lives in a table below that both the validators
and the schema read, and messages quote values as ``'text'`` (never ``repr``), which CEL
can reproduce.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Annotated, Any, Final, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    StrictInt,
    StrictStr,
    Tag,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel, to_snake
from pydantic.config import JsonDict

from gpudra.api.quantity import QuantityError, parse_quantity

GROUP_VERSION = "resource.nvidia.com/v1beta1"
MIB = 1 << 20
OPAQUE_PARAMETERS_MAX_BYTES = 10 * 1024

TimeSliceInterval = Literal["Default", "Short", "Medium", "Long"]
TIME_SLICE_VALUES: dict[str, int] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
"""``nvidia-smi compute-policy --set-timeslice`` values per interval name."""

ComputeMode = Literal["Default", "ExclusiveProcess", "Prohibited"]

# --- rules beyond types, enums and ranges: read by the validators and by the JSON schema ---

ONLY_WITH_STRATEGY: Final[Mapping[str, str]] = {
    "timeSlicingConfig": "TimeSlicing", "mpsConfig": "MPS"}
"""A sharing field that belongs to one strategy; set with the other strategy it is an error."""
COMPUTE_MODE_OF_STRATEGY: Final[Mapping[str, tuple[str, str]]] = {
    "MPS": ("ExclusiveProcess", "runs the GPU in ExclusiveProcess mode"),
    "TimeSlicing": ("Default", "needs compute mode Default"),
}
"""The only ``computeMode`` a sharing strategy works with, and why."""
QUANTITY_PATTERN: Final = (r"^[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)"
                           r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
"""A Kubernetes quantity as ``resource.ParseQuantity`` (NVIDIA's decoder) accepts it: ASCII
digits, no surrounding blanks. The policy checks it with CEL's ``isQuantity()``."""
QUANTITY_FORMAT: Final = ("expected a number with an optional suffix "
                          "(Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E)")
PINNED_MEMORY_MINIMUM: Final = "1Mi"
EMPTY_DEVICE_KEY: Final = "device keys must be a GPU/MIG UUID or an index"
_QUANTITY = re.compile(QUANTITY_PATTERN)


def quoted(value: object) -> str:
    """A value as messages show it: ``'text'`` for strings, plain for numbers."""
    return f"'{value}'" if isinstance(value, str) else str(value)


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


def _pinned_memory_limit(value: object) -> str | int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError("must be a quantity such as '8Gi'")
    if isinstance(value, str) and not _QUANTITY.match(value):
        raise ValueError(f"invalid quantity {quoted(value)}: {QUANTITY_FORMAT}")
    if parse_quantity(value) < Fraction(parse_quantity(PINNED_MEMORY_MINIMUM)):
        raise ValueError(f"must be at least {PINNED_MEMORY_MINIMUM}, got {quoted(value)}")
    return value


PinnedMemoryLimit = Annotated[
    str | int,
    PlainValidator(_pinned_memory_limit),
    WithJsonSchema({"type": ["string", "integer"], "format": "quantity",
                    "x-gpudra-quantity-minimum": PINNED_MEMORY_MINIMUM}),
]
"""Bytes as a quantity (``'8Gi'``) or an integer, at least 1Mi: NVIDIA's driver passes it
to MPS in whole MiB."""


class MpsConfig(_Strict):
    default_active_thread_percentage: Annotated[StrictInt, Field(ge=0, le=100)] | None = None
    default_pinned_device_memory_limit: PinnedMemoryLimit | None = None
    default_per_device_pinned_memory_limit: Annotated[
        dict[StrictStr, PinnedMemoryLimit] | None,
        Field(json_schema_extra={"x-gpudra-nonempty-keys": EMPTY_DEVICE_KEY}),
    ] = None

    @field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _check_device_keys(
        cls, value: dict[str, str | int] | None
    ) -> dict[str, str | int] | None:
        if any(not key for key in value or {}):
            raise ValueError(EMPTY_DEVICE_KEY)
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


def _check_strategy_fields(sharing: _Strict, strategy: str) -> None:
    for alias, owner in ONLY_WITH_STRATEGY.items():
        name = to_snake(alias)
        if owner != strategy and getattr(sharing, name, None) is not None:
            raise ValueError(f"{alias} is only valid with strategy {owner}")


def _strategy_rules(fields: tuple[str, ...]) -> JsonDict:
    return {"x-gpudra-only-with-strategy": {f: ONLY_WITH_STRATEGY[f] for f in fields}}


class GpuSharing(_Strict):
    model_config = ConfigDict(json_schema_extra=_strategy_rules(("timeSlicingConfig",
                                                                 "mpsConfig")))
    strategy: Literal["TimeSlicing", "MPS"]
    time_slicing_config: TimeSlicingConfig | None = None
    mps_config: MpsConfig | None = None

    @model_validator(mode="after")
    def _one_strategy_config(self) -> GpuSharing:
        _check_strategy_fields(self, self.strategy)
        return self


class MigDeviceSharing(_Strict):
    # MIG devices cannot take a time-slice setting, so there is no timeSlicingConfig here.
    model_config = ConfigDict(json_schema_extra=_strategy_rules(("mpsConfig",)))
    strategy: Literal["TimeSlicing", "MPS"]
    mps_config: MpsConfig | None = None

    @model_validator(mode="after")
    def _one_strategy_config(self) -> MigDeviceSharing:
        _check_strategy_fields(self, self.strategy)
        return self


def _check_compute_mode(mode: str | None, strategy: str | None) -> None:
    if mode is None or strategy is None:
        return
    wanted, why = COMPUTE_MODE_OF_STRATEGY[strategy]
    if mode != wanted:
        raise ValueError(f"computeMode {mode} conflicts with sharing strategy {strategy}, "
                         f"which {why}")


_COMPUTE_MODE_RULE: Final[JsonDict] = {"x-gpudra-compute-mode-of-strategy": {
    strategy: {"computeMode": mode, "because": why}
    for strategy, (mode, why) in COMPUTE_MODE_OF_STRATEGY.items()}}


class GpuConfig(_Strict):
    model_config = ConfigDict(json_schema_extra=_COMPUTE_MODE_RULE)
    api_version: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None
    compute_mode: ComputeMode | None = None

    @model_validator(mode="after")
    def _consistent(self) -> GpuConfig:
        _check_compute_mode(self.compute_mode, self.sharing.strategy if self.sharing else None)
        return self


class MigDeviceConfig(_Strict):
    model_config = ConfigDict(json_schema_extra=_COMPUTE_MODE_RULE)
    api_version: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["MigDeviceConfig"]
    sharing: MigDeviceSharing | None = None
    compute_mode: ComputeMode | None = None

    @model_validator(mode="after")
    def _consistent(self) -> MigDeviceConfig:
        _check_compute_mode(self.compute_mode, self.sharing.strategy if self.sharing else None)
        return self


DeviceConfig = GpuConfig | MigDeviceConfig
CONFIG_KINDS: Final[Mapping[str, type[GpuConfig] | type[MigDeviceConfig]]] = {
    "GpuConfig": GpuConfig, "MigDeviceConfig": MigDeviceConfig}
"""Kinds of ``resource.nvidia.com/v1beta1`` this driver decodes, with their models."""


def shown_field(name: str, value: object) -> str:
    """How the unsupported-kind message shows ``apiVersion``/``kind`` as found."""
    if value is None:
        return f"no {name}"
    if isinstance(value, str):
        return f"{name} '{value}'"
    return f"a non-string {name}"


UNSUPPORTED_KIND: Final = (f"unsupported apiVersion/kind: expected apiVersion {GROUP_VERSION} "
                           f"and kind {' or '.join(CONFIG_KINDS)}")


def _discriminate(value: Any) -> str | None:
    # Must return None for non-objects so a JSON list gives a ValidationError, not a crash.
    if isinstance(value, dict):
        kind = value.get("kind")
        if value.get("apiVersion") == GROUP_VERSION and isinstance(kind, str):
            return kind
        return None
    if isinstance(value, GpuConfig | MigDeviceConfig):
        return value.kind
    return None


_ADAPTER: TypeAdapter[DeviceConfig] = TypeAdapter(
    Annotated[
        Annotated[GpuConfig, Tag("GpuConfig")] | Annotated[MigDeviceConfig, Tag("MigDeviceConfig")],
        Discriminator(_discriminate, custom_error_type="unknown_config",
                      custom_error_message=UNSUPPORTED_KIND),
    ]
)


def _map_fields(models: tuple[type[BaseModel], ...]) -> frozenset[str]:
    """Aliases of dict-valued fields: their keys are shown as ``field[key]`` in paths."""
    found: set[str] = set()
    for model in models:
        for name, info in model.model_fields.items():
            types = (info.annotation, *get_args(info.annotation))
            if any(get_origin(t) is dict for t in types):
                found.add(info.alias or name)
    return frozenset(found)


_MAP_FIELDS: Final = _map_fields((MpsConfig,))


def _path(loc: tuple[int | str, ...]) -> str:
    if loc and loc[0] in CONFIG_KINDS:
        loc = loc[1:]  # the discriminator tag is noise in a user-facing path
    parts: list[str] = []
    for i, item in enumerate(loc):
        if isinstance(item, int) or (i and loc[i - 1] in _MAP_FIELDS):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "parameters"


def _problems(exc: ValidationError) -> list[str]:
    problems = []
    for error in exc.errors(include_url=False):
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        elif error["type"] == "unknown_config" and isinstance(error.get("input"), dict):
            got = error["input"]
            message = (f"{message} (got {shown_field('apiVersion', got.get('apiVersion'))}, "
                       f"{shown_field('kind', got.get('kind'))})")
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


def config_schemas() -> dict[str, dict[str, Any]]:
    """The JSON schema of each config kind, as the admission policy generator reads it."""
    return {kind: model.model_json_schema(by_alias=True, mode="validation")
            for kind, model in CONFIG_KINDS.items()}
