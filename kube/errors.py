"""Typed Kubernetes API errors: callers catch ``NotFound``, never test ``status == 404``.

::

    ApiCallError        a call that did not succeed
    ├── Unreachable     no HTTP answer: refused, reset, timed out (``status`` 0)
    ├── BadAnswer       a success whose body is not a JSON object
    ├── NotFound        404: the object is not there
    ├── Conflict        409: changed since it was read, or exists already
    ├── Gone            410: the resourceVersion is too old; LIST again
    └── Invalid         400, 422: the server rejects the request itself; resending cannot help

``api_error()`` picks the class for an HTTP status; any other status is a plain
``ApiCallError`` (throttling and 5xx are retried alike, by ``status`` and ``retry_after``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

MAX_MESSAGE: Final = 512
"""A 422 can quote a whole slice; logs need the gist, not the whole object."""


class ApiCallError(Exception):
    """An API call that did not succeed. ``status`` 0: no HTTP answer (refused, reset,
    timed out); ``retry_after``: what the server asked us to wait, in seconds."""

    def __init__(self, verb: str, resource: str, name: str | None, *, status: int,
                 reason: str, message: str, retry_after: float | None = None) -> None:
        self.verb = verb
        self.resource = resource
        self.name = name
        """``name``, or ``namespace/name`` for a namespaced object; None for a collection."""
        self.status = status
        self.reason = reason
        self.message = message[:MAX_MESSAGE]
        self.retry_after = retry_after
        target = f"{resource}/{name}" if name else resource
        code = f"HTTP {status} {reason}" if status else reason
        super().__init__(f"{verb} {target}: {code}: {self.message}")

    @property
    def outcome(self) -> str:
        """A small, bounded metric label for what happened."""
        if self.status < 300:
            return "ok"
        return {404: "not_found", 409: "conflict", 410: "expired", 422: "invalid",
                429: "throttled"}.get(self.status,
                                      "server_error" if self.status >= 500 else "error")


class Unreachable(ApiCallError):
    """No HTTP answer: the connection was refused or reset, or the deadline passed."""

    @property
    def outcome(self) -> str:
        return "timeout" if self.reason == "Timeout" else "unreachable"


class BadAnswer(ApiCallError):
    """The server answered with success, but not with a JSON object."""

    @property
    def outcome(self) -> str:
        return "bad_answer"


class NotFound(ApiCallError):
    """404: the object (or its namespace) is not there."""


class Conflict(ApiCallError):
    """409: the object changed since it was read (a stale resourceVersion or a failed
    precondition), or a create found it there already."""


class Gone(ApiCallError):
    """410: the resourceVersion asked for is older than the server's history."""


class Invalid(ApiCallError):
    """422 Invalid or 400 BadRequest: the server rejects the request itself."""


_BY_STATUS: Final[Mapping[int, type[ApiCallError]]] = {
    0: Unreachable, 400: Invalid, 404: NotFound, 409: Conflict, 410: Gone, 422: Invalid}


def api_error(verb: str, resource: str, name: str | None, *, status: int, reason: str,
              message: str, retry_after: float | None = None) -> ApiCallError:
    """The error for an answer with HTTP ``status`` (0: none), of the most specific class."""
    kind = _BY_STATUS.get(status, ApiCallError)
    return kind(verb, resource, name, status=status, reason=reason, message=message,
                retry_after=retry_after)

