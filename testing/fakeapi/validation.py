"""Validation shared by the kinds this server checks: typed access, object metadata, names,
node selectors, taints, opaque configs and CEL selectors.

The rules of each kind build on these: ResourceSlice in ``slice_validation``, DeviceClass,
ResourceClaim(Template) and claim status in ``claim_validation``. Everything here returns a list of
``FieldError`` (→ 422 Invalid) and raises ``DecodeError`` (→ 400) where the apiserver's JSON
decoder would already have failed on a value of the wrong JSON type.
"""

from __future__ import annotations

import json
from typing import Any

from gpudra.testing.fakeapi import errors as fe
from gpudra.testing.fakeapi.errors import DecodeError, FieldError
from gpudra.testing.fakeapi.names import (
    is_dns1123_label,
    is_dns1123_subdomain,
    is_label_value,
    is_qualified_name,
)

DRIVER_NAME_MAX = 63
POOL_NAME_MAX = 253
OPAQUE_PARAMETERS_MAX = 10 * 1024
CEL_EXPRESSION_MAX = 10 * 1024
TAINT_EFFECTS = ["NoExecute", "NoSchedule", "None"]

Obj = dict[str, Any]


# ---- typed access: wrong JSON types are decode errors, as in Go ---------------------------

def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _fail(value: Any, go_type: str, path: str) -> DecodeError:
    return DecodeError(f"json: cannot unmarshal {_json_type(value)} into Go struct field "
                       f"{path} of type {go_type}")


def get_map(obj: Obj, key: str, path: str) -> Obj | None:
    value = obj.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise _fail(value, "map", path)


def get_list(obj: Obj, key: str, path: str) -> list[Any] | None:
    value = obj.get(key)
    if value is None or isinstance(value, list):
        return value
    raise _fail(value, "slice", path)


def get_str(obj: Obj, key: str, path: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _fail(value, "string", path)


_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def get_int(obj: Obj, key: str, path: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _fail(value, "int64", path)  # Go's decoder: the number overflows int64
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _fail(value, "int64", path)


def get_bool(obj: Obj, key: str, path: str) -> bool | None:
    value = obj.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise _fail(value, "bool", path)


def as_map(value: Any, path: str) -> Obj:
    if isinstance(value, dict):
        return value
    raise _fail(value, "struct", path)


# ---- names ---------------------------------------------------------------------------------

def check_dns_label(value: str, path: str) -> list[FieldError]:
    return [fe.invalid(path, value, msg) for msg in is_dns1123_label(value)]


def check_dns_subdomain(value: str, path: str) -> list[FieldError]:
    return [fe.invalid(path, value, msg) for msg in is_dns1123_subdomain(value)]


def check_driver_name(value: str, path: str) -> list[FieldError]:
    """Validated like a CSI driver name: required, ≤63, DNS subdomain after lower-casing."""
    errs = []
    if not value:
        errs.append(fe.required(path))
    if len(value) > DRIVER_NAME_MAX:
        errs.append(fe.too_long(path, DRIVER_NAME_MAX))
    errs.extend(fe.invalid(path, value, m) for m in is_dns1123_subdomain(value.lower()))
    return errs


def check_pool_name(value: str, path: str) -> list[FieldError]:
    if not value:
        return [fe.required(path)]
    errs = []
    if len(value) > POOL_NAME_MAX:
        errs.append(fe.too_long(path, POOL_NAME_MAX))
    for part in value.split("/"):
        errs.extend(check_dns_subdomain(part, path))
    return errs


def check_label_key(value: str, path: str) -> list[FieldError]:
    return [fe.invalid(path, value, msg) for msg in is_qualified_name(value)]


def check_label_value(value: str, path: str) -> list[FieldError]:
    return [fe.invalid(path, value, msg) for msg in is_label_value(value)]


# ---- metadata ------------------------------------------------------------------------------

def validate_meta(obj: Obj) -> list[FieldError]:
    """The parts of ValidateObjectMeta a driver can get wrong: name, labels, owners."""
    meta = as_map(obj.get("metadata") or {}, "metadata")
    errs: list[FieldError] = []
    name = get_str(meta, "name", "ObjectMeta.metadata.name") or ""
    if not name:
        errs.append(fe.required("metadata.name", "name or generateName is required"))
    else:
        errs.extend(check_dns_subdomain(name, "metadata.name"))
    labels = get_map(meta, "labels", "ObjectMeta.metadata.labels") or {}
    for key in sorted(labels):
        errs.extend(check_label_key(key, "metadata.labels"))
        value = labels[key]
        if not isinstance(value, str):
            raise _fail(value, "string", "ObjectMeta.metadata.labels")
        errs.extend(check_label_value(value, "metadata.labels"))
    annotations = get_map(meta, "annotations", "ObjectMeta.metadata.annotations") or {}
    for key in sorted(annotations):
        errs.extend(fe.invalid("metadata.annotations", key, m)
                    for m in is_qualified_name(key.lower()))
    owners = get_list(meta, "ownerReferences", "ObjectMeta.metadata.ownerReferences") or []
    controllers = 0
    for item in owners:
        ref = as_map(item, "metadata.ownerReferences")
        api_version = ref.get("apiVersion") or ""
        if not api_version.rsplit("/", 1)[-1]:
            errs.append(fe.invalid("metadata.ownerReferences.apiVersion", api_version,
                                   "version must not be empty"))
        for key in ("kind", "name", "uid"):
            if not ref.get(key):
                errs.append(fe.invalid(f"metadata.ownerReferences.{key}", ref.get(key) or "",
                                       "must not be empty"))
        controllers += bool(ref.get("controller"))
    if controllers > 1:
        errs.append(fe.invalid("metadata.ownerReferences", owners,
                               "Only one reference can have Controller set to true"))
    return errs


# ---- node selectors and taints -------------------------------------------------------------

_SELECTOR_OPERATORS = ["DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"]


def validate_node_selector(selector: Obj, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    terms = get_list(selector, "nodeSelectorTerms", path) or []
    for i, item in enumerate(terms):
        term_path = f"{path}.nodeSelectorTerms[{i}]"
        term = as_map(item, term_path)
        for j, expr in enumerate(get_list(term, "matchExpressions", term_path) or []):
            errs.extend(_node_requirement(as_map(expr, term_path), f"{term_path}."
                                          f"matchExpressions[{j}]", field_selector=False))
        for j, expr in enumerate(get_list(term, "matchFields", term_path) or []):
            errs.extend(_node_requirement(as_map(expr, term_path), f"{term_path}."
                                          f"matchFields[{j}]", field_selector=True))
    return errs


def _node_requirement(expr: Obj, path: str, *, field_selector: bool) -> list[FieldError]:
    errs: list[FieldError] = []
    key = get_str(expr, "key", path) or ""
    op = get_str(expr, "operator", path) or ""
    values = get_list(expr, "values", path) or []
    if field_selector:
        if key != "metadata.name":
            errs.append(fe.invalid(f"{path}.key", key, "not a valid field selector key"))
        if op not in ("In", "NotIn"):
            errs.append(fe.invalid(f"{path}.operator", op, "not a valid selector operator"))
        elif len(values) != 1:
            errs.append(fe.required(f"{path}.values",
                                    "must be only one value when `operator` is 'In' or 'NotIn' "
                                    "for node field selector"))
        return errs
    errs.extend(check_label_key(key, f"{path}.key"))
    if op in ("In", "NotIn") and not values:
        errs.append(fe.required(f"{path}.values",
                                "must be specified when `operator` is 'In' or 'NotIn'"))
    elif op in ("Exists", "DoesNotExist") and values:
        errs.append(fe.forbidden(f"{path}.values",
                                 "may not be specified when `operator` is 'Exists' or "
                                 "'DoesNotExist'"))
    elif op in ("Gt", "Lt") and len(values) != 1:
        errs.append(fe.required(f"{path}.values",
                                "must be specified single value when `operator` is 'Lt' or 'Gt'"))
    elif op not in _SELECTOR_OPERATORS:
        errs.append(fe.invalid(f"{path}.operator", op, "not a valid selector operator"))
    return errs


def validate_taint(taint: Obj, path: str) -> list[FieldError]:
    errs = check_label_key(get_str(taint, "key", f"{path}.key") or "", f"{path}.key")
    value = get_str(taint, "value", f"{path}.value") or ""
    if value:
        errs.extend(check_label_value(value, f"{path}.value"))
    effect = get_str(taint, "effect", f"{path}.effect") or ""
    if not effect:
        errs.append(fe.required(f"{path}.effect"))
    elif effect not in TAINT_EFFECTS:
        errs.append(fe.not_supported(f"{path}.effect", effect, TAINT_EFFECTS))
    return errs


# ---- opaque configuration and CEL selectors ------------------------------------------------

def validate_opaque(config: Obj, path: str) -> list[FieldError]:
    opaque = get_map(config, "opaque", path)
    if opaque is None:
        return [fe.required(f"{path}.opaque")]
    errs = check_driver_name(get_str(opaque, "driver", path) or "", f"{path}.opaque.driver")
    params = opaque.get("parameters")
    ppath = f"{path}.opaque.parameters"
    if params is None:
        errs.append(fe.required(ppath))
    elif len(json.dumps(params, separators=(",", ":"))) > OPAQUE_PARAMETERS_MAX:
        errs.append(fe.too_long(ppath, OPAQUE_PARAMETERS_MAX))
    elif not isinstance(params, dict):
        errs.append(fe.invalid(ppath, "<value omitted>", "must be a valid JSON object"))
    return errs


def validate_selectors(selectors: list[Any], path: str) -> list[FieldError]:
    if len(selectors) > 32:
        return [fe.too_many(path, len(selectors), 32)]
    errs: list[FieldError] = []
    for i, selector in enumerate(selectors):
        cel = get_map(as_map(selector, path), "cel", f"{path}[{i}]")
        if cel is None:
            errs.append(fe.required(f"{path}[{i}].cel"))
            continue
        expression = get_str(cel, "expression", f"{path}[{i}].cel.expression") or ""
        if not expression:
            errs.append(fe.required(f"{path}[{i}].cel.expression"))
        elif len(expression) > CEL_EXPRESSION_MAX:
            errs.append(fe.too_long(f"{path}[{i}].cel.expression", CEL_EXPRESSION_MAX))
    return errs
