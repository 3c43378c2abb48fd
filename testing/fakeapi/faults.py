"""Fault injection and call accounting, consulted once per request before it is served.

Rules match on the Kubernetes verb (get, list, watch, create, update, patch, delete,
deletecollection) and the resource as the apiserver's audit log names it (``resourceslices``,
``resourceclaims/status``); ``None`` matches anything.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field

from gpudra.testing.fakeapi.errors import ApiError, injected_error

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass
class _Rule:
    verb: str | None
    resource: str | None
    remaining: int | None  # None: until cleared
    error: ApiError | None = None
    delay: float = 0.0
    drop: bool = False

    def matches(self, verb: str, resource: str) -> bool:
        return (self.verb is None or self.verb == verb) and \
            (self.resource is None or self.resource == resource)


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it (for asserting patch types, field managers, ...)."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    resource: str
    namespace: str | None
    name: str | None
    content_type: str | None
    status: int = 0


@dataclass
class Action:
    """What to do with a request before serving it."""

    delay: float = 0.0
    error: ApiError | None = None
    drop: bool = False


@dataclass
class Faults:
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _failures: list[_Rule] = field(default_factory=list)
    _delays: list[_Rule] = field(default_factory=list)
    _calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    _log: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=10_000))

    def fail_next(self, n: int, status: int, verb: str | None, resource: str | None,
                  retry_after: int | None, message: str | None) -> None:
        error = injected_error(status, message, retry_after)
        with self._lock:
            self._failures.append(_Rule(verb, resource, n, error=error))

    def drop_next(self, n: int, verb: str | None, resource: str | None) -> None:
        with self._lock:
            self._failures.append(_Rule(verb, resource, n, drop=True))

    def delay(self, seconds: float, verb: str | None, resource: str | None,
              count: int | None) -> None:
        with self._lock:
            # A new delay for the same selector replaces the old one; 0 removes it.
            self._delays = [r for r in self._delays if (r.verb, r.resource) != (verb, resource)]
            if seconds > 0:
                self._delays.append(_Rule(verb, resource, count, delay=seconds))

    def clear(self) -> None:
        with self._lock:
            self._failures.clear()
            self._delays.clear()

    def on_request(self, record: RequestRecord) -> Action:
        """Count the call, log it, and decide its fate (consuming one-shot rules)."""
        action = Action()
        with self._lock:
            self._calls[(record.verb, record.resource)] += 1
            self._log.append(record)
            for rule in self._delays:
                if rule.matches(record.verb, record.resource):
                    action.delay = rule.delay
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    break
            for rule in self._failures:
                if rule.matches(record.verb, record.resource):
                    action.error, action.drop = rule.error, rule.drop
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    break
            self._delays = [r for r in self._delays if r.remaining is None or r.remaining > 0]
            self._failures = [r for r in self._failures
                              if r.remaining is None or r.remaining > 0]
        return action

    def set_status(self, record: RequestRecord, status: int) -> None:
        """Fill in the response code of a logged request (records are replaced, not mutated)."""
        with self._lock:
            for i in range(len(self._log) - 1, -1, -1):
                if self._log[i] is record:
                    self._log[i] = RequestRecord(**{**record.__dict__, "status": status})
                    break

    def calls(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self._calls)

    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._log)

    def reset_calls(self) -> None:
        with self._lock:
            self._calls.clear()
            self._log.clear()
