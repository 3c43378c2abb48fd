"""The parts of a ResourceClaim the node daemon reads, as strict pydantic models with the
apiserver's bounds: one claim from the API server is checked against them before any of it
is used, so a malformed one (a string where a list goes, 33 results, a device named like a
path) is that claim's error, naming the field, never an exception that fails the kubelet's
whole call.

Strict: no coercion (``"true"`` is not a bool, ``7`` not a string). Fields the daemon does
not read are ignored, whatever they hold, as are other drivers' opaque parameters (their
nesting is bounded when the body is decoded: :mod:`gpudra.api.bounded_json`). What the
models cannot say (identifier formats, quantities, this driver's configs) is checked by
:mod:`.claim_decoding` on the validated model.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from gpudra.api.api_limits import (
    ALLOCATION_RESULTS_MAX_SIZE,
    DEVICE_CONFIG_MAX_SIZE,
    DEVICE_REQUESTS_MAX_SIZE,
)

RESERVED_FOR_MAX_SIZE: Final = 256
"""types.go ``ResourceClaimReservedForMaxSize``."""
TEXT_MAX: Final = 1024
"""Characters of a free-form string the daemon reads (``source``, ``resource``); names
are bounded by their own rules."""

Text = Annotated[str, StringConstraints(max_length=TEXT_MAX)]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class Metadata(_Model):
    uid: Text | None = None
    name: Text | None = None
    namespace: Text | None = None


class DeviceResult(_Model):
    request: Text
    driver: Text
    pool: Text
    device: Text
    adminAccess: bool | None = None
    # Checked by the decoder, which words their errors as the apiserver's validation does.
    shareID: Any = None
    consumedCapacity: Any = None


class OpaqueConfig(_Model):
    driver: Text
    parameters: Any = None


class DeviceConfig(_Model):
    source: Text | None = None
    requests: Annotated[list[Text] | None, Field(max_length=DEVICE_REQUESTS_MAX_SIZE)] = None
    opaque: OpaqueConfig | None = None


class DeviceAllocation(_Model):
    results: Annotated[list[DeviceResult] | None,
                       Field(max_length=ALLOCATION_RESULTS_MAX_SIZE)] = None
    config: Annotated[list[DeviceConfig] | None, Field(max_length=DEVICE_CONFIG_MAX_SIZE)] = None


class Allocation(_Model):
    devices: DeviceAllocation | None = None


class Consumer(_Model):
    resource: Text | None = None
    name: Text | None = None


class Status(_Model):
    allocation: Allocation | None = None
    reservedFor: Annotated[list[Consumer] | None, Field(max_length=RESERVED_FOR_MAX_SIZE)] = None


class ResourceClaim(_Model):
    metadata: Metadata
    status: Status | None = None


_WORDS: Final = {
    "model_type": "must be an object", "model_attributes_type": "must be an object",
    "dict_type": "must be an object", "list_type": "must be a list",
    "string_type": "must be a string", "bool_type": "must be true or false",
    "missing": "is missing",
}


def where(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as the API names the field: ``status.allocation.results[0]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def problems(error: ValidationError, limit: int = 3) -> str:
    """The first ``limit`` problems of a validation, each naming its field and what it got."""
    said = []
    for item in error.errors(include_url=False)[:limit]:
        kind = item["type"]
        words = _WORDS.get(kind)
        if kind in ("too_long", "string_too_long"):
            words = (f"has more than {item['ctx'].get('max_length')} "
                     f"{'characters' if isinstance(item['input'], str) else 'entries'}")
        if words is None:
            words = str(item["msg"]).lower()
        got = "" if kind in ("missing", "too_long", "string_too_long") \
            else f", got {_kind(item['input'])}"
        said.append(f"{where(tuple(item['loc'])) or 'the claim'} {words}{got}")
    more = error.error_count() - len(said)
    return "; ".join(said) + (f" (and {more} more)" if more > 0 else "")


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value),
                                                                        type(value).__name__)
