"""The parts of a ResourceClaim the node daemon reads, as a strict pydantic schema with the
apiserver's bounds: one claim from the API server is checked against them before any of it
is used, so a malformed one (a string where a list goes, 33 results, a device named like a
path) is that claim's error, naming the field, never an exception that fails the kubelet's
whole call.

Strict: no coercion (``"true"`` is not a bool, ``7`` not a string). Fields the daemon does
not read are ignored, whatever they hold, as are other drivers' opaque parameters (their
nesting is bounded when the body is decoded: :mod:`gpudra.api.bounded_json`). What the
models cannot say (identifier formats, quantities, this driver's configs) is checked by
:mod:`.claim_decoding` on the validated claim.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, NotRequired

from pydantic import ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

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

# TypedDicts, not BaseModels: the same strict validation, and the claim stays plain dicts
# and lists (no model objects built per claim, on every kubelet call).
_STRICT: Final = ConfigDict(strict=True, extra="ignore")


@with_config(_STRICT)
class Metadata(TypedDict):
    uid: NotRequired[Text | None]
    name: NotRequired[Text | None]
    namespace: NotRequired[Text | None]


@with_config(_STRICT)
class DeviceResult(TypedDict):
    request: Text
    driver: Text
    pool: Text
    device: Text
    adminAccess: NotRequired[bool | None]
    # Checked by the decoder, which words their errors as the apiserver's validation does.
    shareID: NotRequired[Any]
    consumedCapacity: NotRequired[Any]


@with_config(_STRICT)
class OpaqueConfig(TypedDict):
    driver: Text
    parameters: NotRequired[Any]


@with_config(_STRICT)
class DeviceConfig(TypedDict):
    source: NotRequired[Text | None]
    requests: NotRequired[Annotated[list[Text] | None, Field(max_length=DEVICE_REQUESTS_MAX_SIZE)]]
    opaque: NotRequired[OpaqueConfig | None]


@with_config(_STRICT)
class DeviceAllocation(TypedDict):
    results: NotRequired[Annotated[list[DeviceResult] | None,
                                   Field(max_length=ALLOCATION_RESULTS_MAX_SIZE)]]
    config: NotRequired[Annotated[list[DeviceConfig] | None,
                                  Field(max_length=DEVICE_CONFIG_MAX_SIZE)]]


@with_config(_STRICT)
class Allocation(TypedDict):
    devices: NotRequired[DeviceAllocation | None]


@with_config(_STRICT)
class Consumer(TypedDict):
    resource: NotRequired[Text | None]
    name: NotRequired[Text | None]


@with_config(_STRICT)
class Status(TypedDict):
    allocation: NotRequired[Allocation | None]
    reservedFor: NotRequired[Annotated[list[Consumer] | None,
                                       Field(max_length=RESERVED_FOR_MAX_SIZE)]]


@with_config(_STRICT)
class ResourceClaim(TypedDict):
    metadata: Metadata
    status: NotRequired[Status | None]


_CLAIM: Final = TypeAdapter(ResourceClaim)


def validate(raw: object) -> ResourceClaim:
    """The parts of ``raw`` the daemon reads, checked; raises ``ValidationError``."""
    return _CLAIM.validate_python(raw)


_WORDS: Final = {
    "model_type": "must be an object", "model_attributes_type": "must be an object",
    "dict_type": "must be an object", "typed_dict_type": "must be an object",
    "list_type": "must be a list",
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
