"""Kubernetes ``Status`` errors and ``field.Error`` values, shaped like the apiserver's.

Clients (and the driver's error handling) key off ``reason``, ``code`` and
``details.causes[].field``, so those follow apimachinery exactly; messages follow it as
closely as is practical from Python (Go's ``%#v`` of structs is rendered as JSON).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudra.testing.fakeapi.resources import ResourceType

# Sentinel for "no bad value to print" (apimachinery's omitValue).
OMIT: Any = object()

# field.ErrorType -> its human string, used in messages ("Invalid value", ...).
_TYPE_TEXT = {
    "FieldValueNotFound": "Not found",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "InternalError": "Internal error",
}
# Types whose message never shows the bad value.
_VALUELESS = {"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong", "InternalError"}


def go_value(value: Any) -> str:
    """Render a bad value the way ``field.Error.ErrorBody`` does (``%q`` for strings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class FieldError:
    """One ``field.Error``: a path, a type, the offending value and a detail."""

    type: str
    field: str
    bad_value: Any = OMIT
    detail: str = ""

    def body(self) -> str:
        text = _TYPE_TEXT[self.type]
        if self.type not in _VALUELESS and self.bad_value is not OMIT:
            text = f"{text}: {go_value(self.bad_value)}"
        if self.detail:
            text = f"{text}: {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", path, value, detail)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", path, OMIT, detail)


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError("FieldValueDuplicate", path, value)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", path, OMIT, detail)


def not_found(path: str, value: Any) -> FieldError:
    return FieldError("FieldValueNotFound", path, value)


def too_long(path: str, max_length: int) -> FieldError:
    unit = "byte" if max_length == 1 else "bytes"
    return FieldError("FieldValueTooLong", path, OMIT, f"may not be more than {max_length} {unit}")


def too_many(path: str, actual: int, maximum: int) -> FieldError:
    unit = "item" if maximum == 1 else "items"
    return FieldError("FieldValueTooMany", path, actual, f"must have at most {maximum} {unit}")


def not_supported(path: str, value: Any, supported: list[str]) -> FieldError:
    quoted = ", ".join(json.dumps(v) for v in supported)
    return FieldError("FieldValueNotSupported", path, value, f"supported values: {quoted}")


@dataclass
class ApiError(Exception):
    """An error response: becomes a ``Status`` body with this HTTP code."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


class DecodeError(Exception):
    """The body cannot be decoded into the Go type (wrong JSON type, bad quantity).

    The apiserver fails these before validation, with 400 BadRequest.
    """


def _details(rt: ResourceType, name: str, *, kind_is_resource: bool = True) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "group": rt.group,
                               "kind": rt.plural if kind_is_resource else rt.kind}
    if not rt.group:
        del details["group"]
    return details


def not_found_error(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified_resource} "{name}" not found',
                    _details(rt, name))


def already_exists_error(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{rt.qualified_resource} "{name}" already exists',
                    _details(rt, name))


def conflict_error(rt: ResourceType, name: str, detail: str) -> ApiError:
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {rt.qualified_resource} "{name}": {detail}',
                    _details(rt, name))


STALE_DETAIL = ("the object has been modified; please apply your changes to the latest version "
                "and try again")


def invalid_error(rt: ResourceType, name: str, errs: list[FieldError]) -> ApiError:
    """422 Invalid with the aggregate message (deduplicated, bracketed when more than one)."""
    messages: list[str] = []
    for err in errs:
        if str(err) not in messages:
            messages.append(str(err))
    joined = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
    details = _details(rt, name, kind_is_resource=False)
    details["causes"] = [{"reason": e.type, "message": e.body(), "field": e.field} for e in errs]
    return ApiError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {joined}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def decode_error(rt: ResourceType, message: str) -> ApiError:
    return bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                       f"{rt.kind}: {message}")


def expired_error(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def page_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource",
                    {"causes": [{"reason": "UnexpectedServerResponse",
                                 "message": "404 page not found"}]})


def method_not_allowed(method: str, what: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed",
                    f"the server does not allow this method on the requested resource "
                    f"({method} {what})")


# Default reasons for injected failures, by HTTP code (metav1.StatusReason*).
REASON_BY_CODE = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def injected_error(code: int, message: str | None, retry_after: int | None) -> ApiError:
    """A failure requested through fault injection, shaped like the real one for that code."""
    reason = REASON_BY_CODE.get(code, "InternalError" if code >= 500 else "Unknown")
    default_messages = {
        429: "Too many requests, please try again later.",
        500: "Internal error occurred: injected fault",
        503: "the server is currently unable to handle the request",
        504: "the server was unable to return a response in the time allotted, but may still "
             "be processing the request",
        409: "Operation cannot be fulfilled: injected conflict",
    }
    err = ApiError(code, reason, message or default_messages.get(code, f"injected fault ({code})"))
    if retry_after is not None and code in (429, 503, 504):
        err.headers["Retry-After"] = str(retry_after)
        err.details = {"retryAfterSeconds": retry_after}
    return err
