"""What the CRD's OpenAPI schema makes the apiserver check for ComputeDomains.

The stand-in has no CRD machinery, so the structural checks come from the same model the
controller decodes with (``gpudra.api.compute_domain``): the spec's types and enums, and
the spec's immutability (the CRD says ``self == oldSelf``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from gpudra.api.compute_domain import ComputeDomainSpec, ComputeDomainStatus
from gpudra.testing.fakeapi.errors import FieldError
from gpudra.testing.fakeapi.validation import validate_meta

Obj = dict[str, Any]


def _errors(model: type[BaseModel], value: Any, prefix: str) -> list[FieldError]:
    try:
        model.model_validate(value)
    except ValidationError as error:
        return [FieldError("FieldValueInvalid", ".".join([prefix, *map(str, item["loc"])]),
                           detail=str(item["msg"])) for item in error.errors()]
    return []


def validate_compute_domain(obj: Obj, old: Obj | None) -> list[FieldError]:
    errors = validate_meta(obj)
    if "spec" not in obj:
        return [*errors, FieldError("FieldValueRequired", "spec")]
    errors += _errors(ComputeDomainSpec, obj["spec"], "spec")
    if old is not None and not errors and obj["spec"] != old.get("spec"):
        errors.append(FieldError("FieldValueInvalid", "spec",
                                 detail="A computeDomain.spec is immutable"))
    return errors


def validate_compute_domain_status(obj: Obj, old: Obj) -> list[FieldError]:
    return _errors(ComputeDomainStatus, obj.get("status") or {}, "status")
