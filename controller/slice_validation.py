"""Check ResourceSlice objects (plain JSON-shaped dicts) locally, the way the apiserver would.

Everything a publisher sends goes through here first, so a bad slice fails in our process with
the apiserver's own words instead of as a 422 in a retry loop. ``validate_slice`` mirrors
``ValidateResourceSlice`` (``pkg/apis/resource/validation/validation.go`` of the 1.37 cycle):
the same field paths, error types, details and order. Map entries are checked in sorted key
order (Go iterates maps randomly). As in Go, key errors are reported on the map itself with
the offending key (or key part) as the value, and value errors on ``map[key]``. A few checks
the apiserver does while decoding JSON (wrong JSON types, unparsable quantities, int64 range)
are reported here as field errors too, since dicts have no decoder in front of them.

``validate_pool`` adds what the client library and the scheduler check across one pool, plus
our own rule that no device may consume more of a counter than the counter holds.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final, Literal

from gpudra.api.quantity import QuantityError, parse_quantity

# --- limits (names follow k8s.io/api/resource/v1 types.go and apimachinery) -----------------

DRIVER_NAME_MAX_LENGTH: Final = 63
POOL_NAME_MAX_LENGTH: Final = 253
RESOURCE_SLICE_MAX_DEVICES: Final = 128
RESOURCE_SLICE_MAX_DEVICES_WITH_ADVANCED_FEATURES: Final = 64
"""Applies when any device in the slice has taints, consumesCounters or list attributes."""
RESOURCE_SLICE_MAX_COUNTER_SETS: Final = 8
RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET: Final = 32
RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE: Final = 2
RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION: Final = 32
RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE: Final = 32
RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE: Final = 48
DEVICE_MAX_DOMAIN_LENGTH: Final = 63
DEVICE_MAX_ID_LENGTH: Final = 32
DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH: Final = 64
DEVICE_TAINTS_MAX_LENGTH: Final = 16
BINDING_CONDITIONS_MAX_SIZE: Final = 4
BINDING_FAILURE_CONDITIONS_MAX_SIZE: Final = 4
DNS1123_LABEL_MAX_LENGTH: Final = 63
DNS1123_SUBDOMAIN_MAX_LENGTH: Final = 253
LABEL_KEY_NAME_MAX_LENGTH: Final = 63
LABEL_VALUE_MAX_LENGTH: Final = 63
# Go truncates long map keys in field paths to this (domain + "/" + identifier).
ATTRIBUTE_AND_CAPACITY_MAX_KEY_LENGTH: Final = DEVICE_MAX_DOMAIN_LENGTH + 1 + DEVICE_MAX_ID_LENGTH

TAINT_EFFECTS: Final = ("NoExecute", "NoSchedule", "None")
"""Sorted, as ``sets.List`` renders them in the apiserver's "supported values"."""

RESOURCE_SLICE_KIND: Final = "ResourceSlice.resource.k8s.io"
"""The qualified kind the apiserver names in its "is invalid" messages."""

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1

ErrorType = Literal[
    "Invalid value",
    "Required value",
    "Too many",
    "Duplicate value",
    "Unsupported value",
    "Too long",
    "Forbidden",
]


@dataclass(frozen=True)
class FieldError:
    """One field-level problem, rendered exactly like apimachinery's ``field.Error``."""

    field: str
    type: ErrorType
    value: object = ""
    detail: str = ""

    def __str__(self) -> str:
        # Go omits the value for these types (a too-long value would swamp the message).
        body: str = self.type
        if self.type not in ("Required value", "Forbidden", "Too long"):
            body = f"{self.type}: {_render_value(self.value)}"
        if self.detail:
            body += f": {self.detail}"
        return f"{self.field}: {body}"


class SliceValidationError(Exception):
    """Slices that the apiserver or the scheduler would reject; ``errors`` holds every problem.

    Field paths in ``errors`` are prefixed with ``items[<i>].`` (the slice's index in the list
    given to ``ensure_valid``); the message quotes each slice the way the apiserver would.
    """

    def __init__(self, message: str, errors: Sequence[FieldError]) -> None:
        super().__init__(message)
        self.errors: tuple[FieldError, ...] = tuple(errors)


def format_invalid(
    name: str, errors: Sequence[FieldError], *, kind: str = RESOURCE_SLICE_KIND
) -> str:
    """The apiserver's 422 message: ``<kind> "<name>" is invalid: [e1, e2]``.

    Like ``errors.NewInvalid`` + ``ErrorList.ToAggregate``: identical messages collapse, and
    brackets appear only around two or more.
    """
    messages = list(dict.fromkeys(str(error) for error in errors))
    head = f"{kind} {_go_quote(name)} is invalid"
    if not messages:
        return head
    if len(messages) == 1:
        return f"{head}: {messages[0]}"
    return f"{head}: [{', '.join(messages)}]"


def ensure_valid(slices: Sequence[Mapping[str, Any]]) -> None:
    """Raise ``SliceValidationError`` unless every slice and the pool they form are valid."""
    all_errors: list[FieldError] = []
    lines: list[str] = []
    for i, obj in enumerate(slices):
        errors = validate_slice(obj)
        if errors:
            lines.append(format_invalid(_slice_name(obj), errors))
            all_errors += [dataclasses.replace(e, field=f"items[{i}].{e.field}") for e in errors]
    pool_errors = validate_pool(slices)
    if pool_errors:
        pool = _pool_name(slices[0]) if slices else ""
        lines.append(format_invalid(pool, pool_errors, kind="ResourceSlice pool"))
        all_errors += pool_errors
    if all_errors:
        raise SliceValidationError("\n".join(lines), all_errors)


# --- rendering --------------------------------------------------------------------------------


def _render_value(value: object) -> str:
    """Render a bad value like Go's ``%q``/``%v``; composite values as compact JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return _go_quote(value)
    # Go prints structs with %#v, which has no Python equivalent; JSON is the readable stand-in.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


_GO_ESCAPES: Final = {
    '"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f",
    "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
}


def _go_quote(text: str) -> str:
    """``strconv.Quote``: escape quotes, backslashes and non-printable runes."""
    out = []
    for char in text:
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


# --- error constructors (named after apimachinery's field package) ---------------------------


def _invalid(path: str, value: object, detail: str) -> FieldError:
    return FieldError(path, "Invalid value", value, detail)


def _required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, "Required value", "", detail)


def _too_long(path: str, max_length: int) -> FieldError:
    return FieldError(path, "Too long", "", f"must have at most {max_length} bytes")


def _too_many(path: str, actual: int, max_items: int) -> FieldError:
    return FieldError(path, "Too many", actual, f"must have at most {max_items} items")


def _duplicate(path: str, value: object, detail: str = "") -> FieldError:
    return FieldError(path, "Duplicate value", value, detail)


def _not_supported(path: str, value: object, supported: Iterable[str]) -> FieldError:
    detail = "supported values: " + ", ".join(_go_quote(v) for v in supported)
    return FieldError(path, "Unsupported value", value, detail)


def _forbidden(path: str, detail: str) -> FieldError:
    return FieldError(path, "Forbidden", "", detail)


def _key_path(path: str, key: str, max_length: int) -> str:
    """``fldPath.Key(truncateIfTooLong(key))``: long keys shortened in the middle."""
    max_length = max(max_length, 16)
    if len(key) > max_length:
        remaining = max_length - 3
        key = key[: (remaining + 1) // 2] + "..." + key[len(key) - remaining // 2 :]
    return f"{path}[{key}]"


# --- name formats (apimachinery util/validation and api/validate/content) --------------------

_DNS1123_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT: Final = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_C_IDENTIFIER_FMT: Final = "[A-Za-z_][A-Za-z0-9_]*"
_LABEL_KEY_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT: Final = "(" + _LABEL_KEY_FMT + ")?"

_DNS1123_LABEL_RE: Final = re.compile(_DNS1123_LABEL_FMT)
_DNS1123_SUBDOMAIN_RE: Final = re.compile(_DNS1123_SUBDOMAIN_FMT)
_C_IDENTIFIER_RE: Final = re.compile(_C_IDENTIFIER_FMT)
_LABEL_KEY_RE: Final = re.compile(_LABEL_KEY_FMT)
_LABEL_VALUE_RE: Final = re.compile(_LABEL_VALUE_FMT)

_NUMERIC_ID: Final = "(0|[1-9][0-9]*)"
_PRERELEASE_ID: Final = "(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD_ID: Final = "[0-9a-zA-Z-]+"
SEMVER_RE: Final = re.compile(
    rf"{_NUMERIC_ID}\.{_NUMERIC_ID}\.{_NUMERIC_ID}"
    rf"(-{_PRERELEASE_ID}(\.{_PRERELEASE_ID})*)?"
    rf"(\+{_BUILD_ID}(\.{_BUILD_ID})*)?"
)
"""The semver 2.0.0 grammar the apiserver uses for version attributes (no leading zeros)."""


def _regex_error(message: str, fmt: str, *examples: str) -> str:
    """apimachinery's ``RegexError`` (the double space before ``or`` is theirs)."""
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    listed = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {listed}regex used for validation is '{fmt}')"


_DNS1123_LABEL_MSG: Final = _regex_error(
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character",
    _DNS1123_LABEL_FMT, "my-name", "123-abc",
)
_DNS1123_SUBDOMAIN_MSG: Final = _regex_error(
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character",
    _DNS1123_SUBDOMAIN_FMT, "example.com",
)
_C_IDENTIFIER_MSG: Final = _regex_error(
    "a valid C identifier must start with alphabetic character or '_', followed by a string "
    "of alphanumeric characters or '_'",
    _C_IDENTIFIER_FMT, "my_name", "MY_NAME", "MyName",
)
_LABEL_KEY_MSG: Final = _regex_error(
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character",
    _LABEL_KEY_FMT, "MyName", "my.name", "123-abc",
)
_LABEL_VALUE_MSG: Final = _regex_error(
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character",
    _LABEL_VALUE_FMT, "MyValue", "my_value", "12345",
)
SEMVER_MSG: Final = "must be a string compatible with semver.org spec 2.0.0"


def _nbytes(text: str) -> int:
    """Go's ``len(string)``: the UTF-8 byte count."""
    return len(text.encode())


def _max_len_msg(length: int) -> str:
    # util/validation says "characters"; the newer api/validate/content says "bytes" (below).
    return f"must be no more than {length} characters"


def dns1123_label_errors(value: str) -> list[str]:
    """``IsDNS1123Label``: device, counter set and counter names."""
    errors = []
    if _nbytes(value) > DNS1123_LABEL_MAX_LENGTH:
        errors.append(_max_len_msg(DNS1123_LABEL_MAX_LENGTH))
    if not _DNS1123_LABEL_RE.fullmatch(value):
        if _DNS1123_SUBDOMAIN_RE.fullmatch(value):
            errors.append("must not contain dots")
        else:
            errors.append(_DNS1123_LABEL_MSG)
    return errors


def dns1123_subdomain_errors(value: str) -> list[str]:
    """``IsDNS1123Subdomain``: object names, node names, pool name parts, driver names."""
    errors = []
    if _nbytes(value) > DNS1123_SUBDOMAIN_MAX_LENGTH:
        errors.append(_max_len_msg(DNS1123_SUBDOMAIN_MAX_LENGTH))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errors.append(_DNS1123_SUBDOMAIN_MSG)
    return errors


def _content_subdomain_errors(value: str) -> list[str]:
    errors = []
    if _nbytes(value) > DNS1123_SUBDOMAIN_MAX_LENGTH:
        errors.append(f"must be no more than {DNS1123_SUBDOMAIN_MAX_LENGTH} bytes")
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errors.append(_DNS1123_SUBDOMAIN_MSG)
    return errors


def label_key_errors(value: str) -> list[str]:
    """``content.IsLabelKey`` (a.k.a. qualified name): taint keys."""
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) > 2:
        return [
            "a valid label key " + _LABEL_KEY_MSG
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errors.append("prefix part must be non-empty")
        else:
            errors += ["prefix part " + msg for msg in _content_subdomain_errors(parts[0])]
    if not name:
        errors.append("name part must be non-empty")
    elif _nbytes(name) > LABEL_KEY_NAME_MAX_LENGTH:
        errors.append(f"name part must be no more than {LABEL_KEY_NAME_MAX_LENGTH} bytes")
    if not _LABEL_KEY_RE.fullmatch(name):
        errors.append("name part " + _LABEL_KEY_MSG)
    return errors


def label_value_errors(value: str) -> list[str]:
    """``content.IsLabelValue``: taint values."""
    errors = []
    if _nbytes(value) > LABEL_VALUE_MAX_LENGTH:
        errors.append(f"must be no more than {LABEL_VALUE_MAX_LENGTH} bytes")
    if not _LABEL_VALUE_RE.fullmatch(value):
        errors.append(_LABEL_VALUE_MSG)
    return errors


def _dns_label(value: str, path: str) -> list[FieldError]:
    return [_invalid(path, value, msg) for msg in dns1123_label_errors(value)]


def _dns_subdomain(value: str, path: str) -> list[FieldError]:
    return [_invalid(path, value, msg) for msg in dns1123_subdomain_errors(value)]


def _driver_name(name: str, path: str) -> list[FieldError]:
    """``ValidateCSIDriverName``, which DRA reuses for driver names and attribute domains."""
    if not name:
        return [_required(path)]
    errors = []
    if _nbytes(name) > DRIVER_NAME_MAX_LENGTH:
        errors.append(_too_long(path, DRIVER_NAME_MAX_LENGTH))
    # Upper case is tolerated here for CSI compatibility; drivers should still use lower case.
    errors += [_invalid(path, name, msg) for msg in dns1123_subdomain_errors(name.lower())]
    return errors


def _c_identifier(ident: str, path: str) -> list[FieldError]:
    errors = []
    if _nbytes(ident) > DEVICE_MAX_ID_LENGTH:
        errors.append(_too_long(path, DEVICE_MAX_ID_LENGTH))
    if not _C_IDENTIFIER_RE.fullmatch(ident):
        errors.append(_invalid(path, ident, _C_IDENTIFIER_MSG))
    return errors


def _qualified_name(name: str, path: str) -> list[FieldError]:
    """Attribute and capacity keys: ``<C identifier>`` or ``<domain>/<C identifier>``."""
    parts = name.split("/")
    if len(parts) == 1:
        return _c_identifier(name, path)
    if len(parts) > 2:
        return [_invalid(path, name, "must not contain more than one slash")]
    domain, ident = parts
    errors = []
    if not domain:
        errors.append(_invalid(path, "", "the domain must not be empty"))
    else:
        errors += _driver_name(domain, path)
    if not ident:
        errors.append(_invalid(path, "", "the name must not be empty"))
    else:
        errors += _c_identifier(ident, path)
    return errors


def _label_name(value: str, path: str) -> list[FieldError]:
    return [_invalid(path, value, msg) for msg in label_key_errors(value)]


def _label_value(value: str, path: str) -> list[FieldError]:
    return [_invalid(path, value, msg) for msg in label_value_errors(value)]


# --- JSON-shape helpers ---------------------------------------------------------------------


def _is_set(mapping: Mapping[str, Any], key: str) -> bool:
    """A field counts as set when present and not null (Go: a non-nil pointer or slice)."""
    return mapping.get(key) is not None


def _as_mapping(value: Any, path: str, errors: list[FieldError]) -> Mapping[str, Any] | None:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    errors.append(_invalid(path, value, "must be an object"))
    return None


def _as_list(value: Any, path: str, errors: list[FieldError]) -> list[Any] | None:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    errors.append(_invalid(path, value, "must be a list"))
    return None


def _as_str(value: Any, path: str, errors: list[FieldError]) -> str | None:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    errors.append(_invalid(path, value, "must be a string"))
    return None


def _as_int(value: Any, path: str, errors: list[FieldError]) -> int | None:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
        errors.append(_invalid(path, value, "must fit in a 64-bit signed integer"))
        return None
    errors.append(_invalid(path, value, "must be an integer"))
    return None


def _quantity(value: Any, path: str, errors: list[FieldError]) -> Fraction | None:
    """A ``{"value": <quantity>}`` entry; unparsable quantities fail JSON decoding upstream."""
    entry = _as_mapping(value, path, errors)
    if entry is None:
        return None
    raw = entry.get("value")
    if raw is None:
        errors.append(_required(f"{path}.value"))
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        errors.append(_invalid(f"{path}.value", raw, "must be a quantity string"))
        return None
    try:
        amount: Fraction = parse_quantity(raw)
    except QuantityError:
        errors.append(_invalid(
            f"{path}.value", raw,
            "quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ))
        return None
    return amount


def _slice_name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else ""


def _pool_name(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec")
    pool = spec.get("pool") if isinstance(spec, Mapping) else None
    name = pool.get("name") if isinstance(pool, Mapping) else None
    return name if isinstance(name, str) else ""


# --- ResourceSlice ----------------------------------------------------------------------------


def validate_slice(obj: Mapping[str, Any]) -> list[FieldError]:
    """Every check ``ValidateResourceSlice`` makes on create, in the apiserver's order."""
    errors: list[FieldError] = []
    metadata = _as_mapping(obj.get("metadata"), "metadata", errors)
    if metadata is not None:
        errors += _validate_metadata(metadata)
    spec = _as_mapping(obj.get("spec"), "spec", errors)
    if spec is not None:
        errors += _validate_spec(spec, "spec")
    return errors


def _validate_metadata(metadata: Mapping[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    name = _as_str(metadata.get("name"), "metadata.name", errors)
    generate_name = _as_str(metadata.get("generateName"), "metadata.generateName", errors)
    if name:
        errors += _dns_subdomain(name, "metadata.name")
    elif name is not None and generate_name is not None:
        if not generate_name:
            errors.append(_required("metadata.name", "name or generateName is required"))
        else:
            # A prefix may end in "-": the apiserver masks it before checking the format.
            masked = generate_name[:-1] + "a" if generate_name.endswith("-") else generate_name
            errors += [
                _invalid("metadata.generateName", generate_name, msg)
                for msg in dns1123_subdomain_errors(masked)
            ]
    return errors


_NODE_FIELDS: Final = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")


def _validate_spec(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    driver = _as_str(spec.get("driver"), f"{path}.driver", errors)
    if driver is not None:
        errors += _driver_name(driver, f"{path}.driver")
    pool = _as_mapping(spec.get("pool"), f"{path}.pool", errors)
    if pool is not None:
        errors += _validate_pool_ref(pool, f"{path}.pool")
    errors += _validate_node_selection(spec, path)

    if _is_set(spec, "sharedCounters") and _is_set(spec, "devices"):
        errors.append(_invalid(path, "", "only one of `sharedCounters` or `devices` is allowed"))

    devices = _as_list(spec.get("devices"), f"{path}.devices", errors)
    if devices is not None:
        errors += _validate_devices(devices, spec.get("perDeviceNodeSelection") is True, path)
    counter_sets = _as_list(spec.get("sharedCounters"), f"{path}.sharedCounters", errors)
    if counter_sets is not None:
        errors += _validate_counter_sets(counter_sets, f"{path}.sharedCounters")
    return errors


def _validate_pool_ref(pool: Mapping[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    name = _as_str(pool.get("name"), f"{path}.name", errors)
    if name == "":
        errors.append(_required(f"{path}.name"))
    elif name is not None:
        if _nbytes(name) > POOL_NAME_MAX_LENGTH:
            errors.append(_too_long(f"{path}.name", POOL_NAME_MAX_LENGTH))
        for part in name.split("/"):
            errors += _dns_subdomain(part, f"{path}.name")
    count = _as_int(pool.get("resourceSliceCount"), f"{path}.resourceSliceCount", errors)
    if count is not None and count <= 0:
        errors.append(_invalid(f"{path}.resourceSliceCount", count, "must be greater than zero"))
    generation = _as_int(pool.get("generation"), f"{path}.generation", errors)
    if generation is not None and generation < 0:
        errors.append(
            _invalid(f"{path}.generation", generation, "must be greater than or equal to zero")
        )
    return errors


def _validate_node_selection(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    chosen: list[str] = []
    node_name = spec.get("nodeName")
    if node_name is not None:
        if node_name == "":
            errors.append(_invalid(
                f"{path}.nodeName", "", "must be either unset or set to a non-empty string"
            ))
        elif isinstance(node_name, str):
            chosen.append("`nodeName`")
            errors += _dns_subdomain(node_name, f"{path}.nodeName")
        else:
            errors.append(_invalid(f"{path}.nodeName", node_name, "must be a string"))
    selector = spec.get("nodeSelector")
    if selector is not None:
        chosen.append("`nodeSelector`")
        terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
        if not isinstance(terms, list) or len(terms) != 1:
            # One term keeps merging selectors of devices from different slices simple.
            errors.append(_invalid(
                f"{path}.nodeSelector.nodeSelectorTerms", terms,
                "must have exactly one node selector term",
            ))
    for field in ("allNodes", "perDeviceNodeSelection"):
        value = spec.get(field)
        if value is True:
            chosen.append(f"`{field}`")
        elif value is not None:
            errors.append(
                _invalid(f"{path}.{field}", value, "must be either unset or set to true")
            )
    expected = "exactly one of " + ", ".join(f"`{field}`" for field in _NODE_FIELDS)
    if not chosen:
        errors.append(_required(path, f"{expected} is required"))
    elif len(chosen) > 1:
        chosen_text = "{" + ", ".join(chosen) + "}"
        errors.append(
            _invalid(path, chosen_text, f"{expected} is required, but multiple fields are set")
        )
    return errors


# --- devices ---------------------------------------------------------------------------------

_SCALAR_FIELDS: Final = ("bool", "int", "string", "version")
_LIST_FIELDS: Final = ("bools", "ints", "strings", "versions")


def uses_advanced_features(device: Mapping[str, Any]) -> bool:
    """Whether a device lowers its slice's device limit to 64 (taints, counters, list values)."""
    if device.get("taints") or device.get("consumesCounters"):
        return True
    attributes = device.get("attributes")
    if not isinstance(attributes, Mapping):
        return False
    return any(
        isinstance(value, Mapping) and any(value.get(f) is not None for f in _LIST_FIELDS)
        for value in attributes.values()
    )


def _validate_devices(
    devices: list[Any], per_device_node_selection: bool, spec_path: str
) -> list[FieldError]:
    path = f"{spec_path}.devices"
    advanced = any(isinstance(d, Mapping) and uses_advanced_features(d) for d in devices)
    limit = RESOURCE_SLICE_MAX_DEVICES
    if advanced:
        limit = RESOURCE_SLICE_MAX_DEVICES_WITH_ADVANCED_FEATURES
    if len(devices) > limit:
        # Like the apiserver: report the count only, nothing per device (DoS protection).
        return [_too_many(path, len(devices), limit)]
    errors: list[FieldError] = []
    names: list[Any] = []
    for i, raw in enumerate(devices):
        device = _as_mapping(raw, f"{path}[{i}]", errors)
        names.append(device.get("name") if device is not None else None)
        if device is not None:
            errors += _validate_device(device, f"{path}[{i}]", per_device_node_selection)
    errors += _duplicates(names, path)
    return errors


def _duplicates(keys: Sequence[Any], path: str) -> list[FieldError]:
    seen: set[Any] = set()
    errors = []
    for i, key in enumerate(keys):
        if key is None or not isinstance(key, str):
            continue
        if key in seen:
            errors.append(_duplicate(f"{path}[{i}]", key))
        seen.add(key)
    return errors


def _validate_device(
    device: Mapping[str, Any], path: str, per_device_node_selection: bool
) -> list[FieldError]:
    errors: list[FieldError] = []
    name = _as_str(device.get("name"), f"{path}.name", errors)
    if name == "":
        errors.append(_required(f"{path}.name"))
    elif name is not None:
        errors += _dns_label(name, f"{path}.name")

    attributes = _as_mapping(device.get("attributes"), f"{path}.attributes", errors)
    capacity = _as_mapping(device.get("capacity"), f"{path}.capacity", errors)
    attributes = attributes or {}
    capacity = capacity or {}
    total = len(attributes) + len(capacity)
    if total > RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
        errors.append(_invalid(
            path, total, "the total number of attributes and capacities must not exceed "
            f"{RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE}",
        ))
    values = sum(_count_values(value) for value in attributes.values())
    if values > RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE:
        errors.append(_invalid(
            path, values, "the total number of attribute values must not exceed "
            f"{RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE}",
        ))

    for key in sorted(attributes):
        errors += _map_key(key, f"{path}.attributes", _qualified_name)
        key_path = _key_path(f"{path}.attributes", str(key), ATTRIBUTE_AND_CAPACITY_MAX_KEY_LENGTH)
        errors += _validate_attribute(attributes[key], key_path)
    multi = device.get("allowMultipleAllocations") is True
    for key in sorted(capacity):
        errors += _map_key(key, f"{path}.capacity", _qualified_name)
        key_path = _key_path(f"{path}.capacity", str(key), ATTRIBUTE_AND_CAPACITY_MAX_KEY_LENGTH)
        errors += _validate_capacity(capacity[key], key_path, multi)

    taints = _as_list(device.get("taints"), f"{path}.taints", errors)
    if taints is not None:
        errors += _validate_taints(taints, f"{path}.taints")
    consumptions = _as_list(device.get("consumesCounters"), f"{path}.consumesCounters", errors)
    if consumptions is not None:
        errors += _validate_consumptions(consumptions, f"{path}.consumesCounters")
    errors += _validate_device_nodes(device, path, per_device_node_selection)
    errors += _validate_binding_conditions(device, path)
    return errors


def _map_key(key: object, path: str, check: Any) -> list[FieldError]:
    if not isinstance(key, str):
        return [_invalid(path, key, "keys must be strings")]
    result: list[FieldError] = check(key, path)
    return result


def _count_values(value: Any) -> int:
    """A scalar counts once, a list value by its length (``numEntriesDeviceAttribute``)."""
    if not isinstance(value, Mapping):
        return 1
    listed = sum(len(value[f]) for f in _LIST_FIELDS if isinstance(value.get(f), list | tuple))
    return listed or 1


def _validate_attribute(raw: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    attribute = _as_mapping(raw, path, errors)
    if attribute is None:
        return errors
    set_fields = [f for f in (*_SCALAR_FIELDS, *_LIST_FIELDS) if attribute.get(f) is not None]
    for field in set_fields:
        value = attribute[field]
        field_path = f"{path}.{field}"
        if field in _SCALAR_FIELDS:
            errors += _validate_scalar(field, value, field_path)
            continue
        items = _as_list(value, field_path, errors)
        if items is None:
            continue
        if not items:
            errors.append(_invalid(field_path, items, "must not be empty if specified"))
        for j, item in enumerate(items):
            errors += _validate_scalar(field[:-1], item, f"{field_path}[{j}]")
    if not set_fields:
        errors.append(_invalid(path, "", "exactly one value must be specified"))
    elif len(set_fields) > 1:
        errors.append(_invalid(path, dict(attribute), "exactly one value must be specified"))
    return errors


def _validate_scalar(kind: str, value: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if kind == "bool":
        if not isinstance(value, bool):
            errors.append(_invalid(path, value, "must be a boolean"))
    elif kind == "int":
        _as_int(value, path, errors)
    else:
        text = _as_str(value, path, errors)
        if text is not None:
            if kind == "version" and not SEMVER_RE.fullmatch(text):
                errors.append(_invalid(path, text, SEMVER_MSG))
            if _nbytes(text) > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH:
                errors.append(_too_long(path, DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH))
    return errors


def _validate_capacity(raw: Any, path: str, allow_multiple_allocations: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    _quantity(raw, path, errors)
    policy = raw.get("requestPolicy") if isinstance(raw, Mapping) else None
    if policy is not None and not allow_multiple_allocations:
        errors.append(_forbidden(f"{path}.requestPolicy", "allowMultipleAllocations must be true"))
    return errors


def _validate_taints(taints: list[Any], path: str) -> list[FieldError]:
    if len(taints) > DEVICE_TAINTS_MAX_LENGTH:
        return [_too_many(path, len(taints), DEVICE_TAINTS_MAX_LENGTH)]
    errors: list[FieldError] = []
    for i, raw in enumerate(taints):
        taint = _as_mapping(raw, f"{path}[{i}]", errors)
        if taint is None:
            continue
        key = _as_str(taint.get("key"), f"{path}[{i}].key", errors)
        if key is not None:
            errors += _label_name(key, f"{path}[{i}].key")
        value = _as_str(taint.get("value"), f"{path}[{i}].value", errors)
        if value:
            errors += _label_value(value, f"{path}[{i}].value")
        effect = taint.get("effect")
        if effect is None or effect == "":
            errors.append(_required(f"{path}[{i}].effect"))
        elif effect not in TAINT_EFFECTS:
            errors.append(_not_supported(f"{path}[{i}].effect", effect, TAINT_EFFECTS))
    return errors


def _validate_device_nodes(
    device: Mapping[str, Any], path: str, per_device_node_selection: bool
) -> list[FieldError]:
    fields = [f for f in ("nodeName", "nodeSelector", "allNodes") if _is_set(device, f)]
    if not per_device_node_selection:
        if fields:
            return [_invalid(
                path, None, "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
                "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
            )]
        return []
    errors: list[FieldError] = []
    chosen = []
    for field in fields:
        value = device[field]
        if field == "nodeName":
            if value == "" or not isinstance(value, str):
                errors.append(_invalid(f"{path}.nodeName", value, "must not be empty"))
                continue
            errors += _dns_subdomain(value, f"{path}.nodeName")
        elif field == "allNodes" and value is not True:
            errors.append(
                _invalid(f"{path}.allNodes", value, "must be either unset or set to true")
            )
            continue
        chosen.append(f"`{field}`")
    detail = (
        "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
        "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
    )
    if not chosen:
        errors.append(_required(path, detail))
    elif len(chosen) > 1:
        errors.append(_invalid(path, "{" + ", ".join(chosen) + "}", detail))
    return errors


def _validate_binding_conditions(device: Mapping[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    lists = {}
    for field, limit in (
        ("bindingConditions", BINDING_CONDITIONS_MAX_SIZE),
        ("bindingFailureConditions", BINDING_FAILURE_CONDITIONS_MAX_SIZE),
    ):
        items = _as_list(device.get(field), f"{path}.{field}", errors) or []
        lists[field] = items
        if len(items) > limit:
            errors.append(_too_many(f"{path}.{field}", len(items), limit))
            continue
        for j, item in enumerate(items):
            text = _as_str(item, f"{path}.{field}[{j}]", errors)
            if text is not None:
                errors += _label_name(text, f"{path}.{field}[{j}]")
    conditions, failures = lists["bindingConditions"], lists["bindingFailureConditions"]
    if not conditions and failures:
        errors.append(_invalid(
            f"{path}.bindingConditions", conditions,
            "bindingConditions are required to use bindingFailureConditions",
        ))
    if conditions and not failures:
        errors.append(_invalid(
            f"{path}.bindingFailureConditions", failures,
            "bindingFailureConditions are required to use bindingConditions",
        ))
    return errors


# --- counters --------------------------------------------------------------------------------


def _validate_counter_sets(counter_sets: list[Any], path: str) -> list[FieldError]:
    if len(counter_sets) > RESOURCE_SLICE_MAX_COUNTER_SETS:
        return [_too_many(path, len(counter_sets), RESOURCE_SLICE_MAX_COUNTER_SETS)]
    errors: list[FieldError] = []
    names: list[Any] = []
    for i, raw in enumerate(counter_sets):
        counter_set = _as_mapping(raw, f"{path}[{i}]", errors)
        names.append(counter_set.get("name") if counter_set is not None else None)
        if counter_set is None:
            continue
        errors += _required_label(counter_set.get("name"), f"{path}[{i}].name")
        errors += _validate_counters(
            counter_set.get("counters"), f"{path}[{i}].counters",
            RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET,
        )
    errors += _duplicates(names, path)
    return errors


def _validate_consumptions(consumptions: list[Any], path: str) -> list[FieldError]:
    limit = RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE
    if len(consumptions) > limit:
        return [_too_many(path, len(consumptions), limit)]
    errors: list[FieldError] = []
    names: list[Any] = []
    for i, raw in enumerate(consumptions):
        consumption = _as_mapping(raw, f"{path}[{i}]", errors)
        names.append(consumption.get("counterSet") if consumption is not None else None)
        if consumption is None:
            continue
        errors += _required_label(consumption.get("counterSet"), f"{path}[{i}].counterSet")
        errors += _validate_counters(
            consumption.get("counters"), f"{path}[{i}].counters",
            RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION,
        )
    errors += _duplicates(names, path)
    return errors


def _required_label(value: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    name = _as_str(value, path, errors)
    if name == "":
        errors.append(_required(path))
    elif name is not None:
        errors += _dns_label(name, path)
    return errors


def _validate_counters(raw: Any, path: str, limit: int) -> list[FieldError]:
    errors: list[FieldError] = []
    counters = _as_mapping(raw, path, errors)
    if counters is None:
        return errors
    if not counters:
        return [_required(path)]
    if len(counters) > limit:
        return [_too_many(path, len(counters), limit)]
    for name in sorted(counters):
        errors += _map_key(name, path, _dns_label)
        _quantity(counters[name], _key_path(path, str(name), DNS1123_LABEL_MAX_LENGTH), errors)
    return errors


# --- pool ------------------------------------------------------------------------------------


def validate_pool(slices: Sequence[Mapping[str, Any]]) -> list[FieldError]:
    """Checks across the slices of one pool (client library, scheduler, and our own).

    Paths start with ``items[<i>]``, the slice's index in ``slices``. A pool that fails here is
    skipped by the scheduler as invalid or incomplete, even though each slice is accepted.
    """
    errors: list[FieldError] = []
    specs = [_spec_of(obj) for obj in slices]
    errors += _check_pool_identity(specs)
    devices = [
        (f"items[{i}].spec.devices[{j}]", device)
        for i, spec in enumerate(specs)
        for j, device in enumerate(_list_of(spec.get("devices")))
        if isinstance(device, Mapping)
    ]
    counter_sets = [
        (f"items[{i}].spec.sharedCounters[{j}]", counter_set)
        for i, spec in enumerate(specs)
        for j, counter_set in enumerate(_list_of(spec.get("sharedCounters")))
        if isinstance(counter_set, Mapping)
    ]
    errors += _first_wins(devices, "name")
    errors += _first_wins(counter_sets, "name")
    available = {
        counter_set["name"]: _counter_values(counter_set.get("counters"))
        for _, counter_set in reversed(counter_sets)  # the first definition wins
        if isinstance(counter_set.get("name"), str)
    }
    for path, device in devices:
        errors += _check_consumption(device, path, available)
    return errors


def _spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _mapping_of(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list_of(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _check_pool_identity(specs: Sequence[Mapping[str, Any]]) -> list[FieldError]:
    if not specs:
        return []
    errors: list[FieldError] = []
    pools = [_mapping_of(spec.get("pool")) for spec in specs]
    first_pool, first_spec = pools[0], specs[0]
    for i, (spec, pool) in enumerate(zip(specs, pools, strict=True)):
        if spec.get("driver") != first_spec.get("driver"):
            errors.append(_invalid(
                f"items[{i}].spec.driver", spec.get("driver"),
                f"must equal the driver of items[0] ({_render_value(first_spec.get('driver'))})",
            ))
        if pool.get("name") != first_pool.get("name"):
            errors.append(_invalid(
                f"items[{i}].spec.pool.name", pool.get("name"),
                f"must equal the pool of items[0] ({_render_value(first_pool.get('name'))})",
            ))
        if pool.get("generation") != first_pool.get("generation"):
            # The scheduler ignores every slice below the pool's highest generation.
            errors.append(_invalid(
                f"items[{i}].spec.pool.generation", pool.get("generation"),
                "must equal the generation of items[0] "
                f"({_render_value(first_pool.get('generation'))})",
            ))
        if pool.get("resourceSliceCount") != len(specs):
            # Otherwise the scheduler waits forever for a complete pool.
            errors.append(_invalid(
                f"items[{i}].spec.pool.resourceSliceCount", pool.get("resourceSliceCount"),
                f"must equal the number of slices in the pool ({len(specs)})",
            ))
    return errors


def _first_wins(entries: Sequence[tuple[str, Mapping[str, Any]]], key: str) -> list[FieldError]:
    """Duplicate names across the pool; each later entry names the first one."""
    first: dict[str, str] = {}
    errors = []
    for path, entry in entries:
        name = entry.get(key)
        if not isinstance(name, str):
            continue
        if name in first:
            errors.append(_duplicate(path, name, f"already defined at {first[name]}"))
        else:
            first[name] = path
    return errors


def _counter_values(raw: Any) -> dict[str, Fraction]:
    """Counter name → value, skipping entries ``validate_slice`` reports as malformed."""
    values = {}
    for name, counter in (raw.items() if isinstance(raw, Mapping) else ()):
        try:
            values[name] = parse_quantity(counter["value"])
        except (QuantityError, KeyError, TypeError):
            continue
    return values


def _check_consumption(
    device: Mapping[str, Any], path: str, available: Mapping[str, Mapping[str, Fraction]]
) -> list[FieldError]:
    errors: list[FieldError] = []
    for k, consumption in enumerate(_list_of(device.get("consumesCounters"))):
        if not isinstance(consumption, Mapping):
            continue
        entry_path = f"{path}.consumesCounters[{k}]"
        set_name = consumption.get("counterSet")
        if not isinstance(set_name, str) or set_name not in available:
            errors.append(_invalid(
                f"{entry_path}.counterSet", set_name,
                "must be the name of a counter set in the pool",
            ))
            continue
        counters = available[set_name]
        used = _mapping_of(consumption.get("counters"))
        for name in sorted(used):
            counter_path = _key_path(f"{entry_path}.counters", str(name), DNS1123_LABEL_MAX_LENGTH)
            if name not in counters:
                errors.append(_invalid(
                    counter_path, name, f"must be a counter of counter set {_go_quote(set_name)}"
                ))
                continue
            amount = _counter_values({name: used[name]}).get(name)
            if amount is not None and amount > counters[name]:
                errors.append(_invalid(
                    f"{counter_path}.value", used[name].get("value"),
                    f"must not exceed the counter's value in counter set {_go_quote(set_name)} "
                    f"({_fraction_text(counters[name])})",
                ))
    return errors


def _fraction_text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))
