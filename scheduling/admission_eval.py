"""ValidatingAdmissionPolicies evaluated offline, the way the apiserver evaluates them.

Resource rules, match conditions, variables (in order, each seeing the ones before it),
validations with ``message`` or ``messageExpression``, and the failure policy for an
expression that fails to evaluate. CEL runs in this project's Kubernetes-flavoured
environment (``scheduling.cel``: optional syntax, the quantity, regex and extended string
libraries). ``params``, ``namespaceObject`` and ``authorizer`` are not modelled: the
chart's policies use none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from gpudra.scheduling.cel.evaluator import DeviceRunner
from gpudra.scheduling.cel.grammar import parse
from gpudra.scheduling.cel.library import FUNCTIONS

_ENVIRONMENT = celpy.Environment()


class PolicyError(RuntimeError):
    """A CEL expression of the policy failed to evaluate (the failure policy decides)."""


@dataclass(frozen=True)
class Request:
    """What the policy sees of one API request."""

    obj: Mapping[str, Any] | None
    operation: str = "CREATE"
    old: Mapping[str, Any] | None = None
    username: str = "kubernetes-admin"
    extra: Mapping[str, list[str]] = field(default_factory=dict)
    group: str = "resource.k8s.io"
    resource: str = ""
    """Plural resource name (``resourceclaims``); empty: take the rules as matching."""


@dataclass(frozen=True)
class Outcome:
    matched: bool
    failures: tuple[str, ...] = ()
    """The message of each validation that failed, in policy order."""
    errors: tuple[str, ...] = ()
    """Expressions that could not be evaluated (denied under ``failurePolicy: Fail``)."""
    variables: Mapping[str, Any] = field(default_factory=dict)
    """The policy's variables by name, as CEL values (for tests and explanations)."""

    @property
    def allowed(self) -> bool:
        return not self.failures


@cache
def _runner(expression: str) -> DeviceRunner:
    return DeviceRunner(_ENVIRONMENT, parse(expression), FUNCTIONS)


def _evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    try:
        value = _runner(expression).evaluate(dict(activation))
    except CELEvalError as exc:
        raise PolicyError(f"{_short(expression)}: {exc.args[0] if exc.args else exc}") from exc
    if isinstance(value, CELEvalError):
        raise PolicyError(f"{_short(expression)}: {value.args[0] if value.args else value}")
    return value


def _short(expression: str) -> str:
    text = " ".join(expression.split())
    return text if len(text) <= 80 else text[:77] + "..."


def _rules_match(spec: Mapping[str, Any], request: Request) -> bool:
    if not request.resource:
        return True
    for rule in (spec.get("matchConstraints") or {}).get("resourceRules") or []:
        if (request.group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", [])) and (
                request.resource in rule.get("resources", []) or "*" in rule.get("resources", [])
        ) and (request.operation in rule.get("operations", [])
               or "*" in rule.get("operations", [])):
            return True
    return False


def evaluate(policy: Mapping[str, Any], request: Request) -> Outcome:
    """What the policy decides for ``request``."""
    spec = policy["spec"]
    if not _rules_match(spec, request):
        return Outcome(matched=False)
    user: dict[str, Any] = {"username": request.username}
    if request.extra:
        user["extra"] = dict(request.extra)
    activation: dict[str, Any] = {
        "request": json_to_cel({"operation": request.operation, "userInfo": user}),
        "object": json_to_cel(dict(request.obj) if request.obj is not None else None),
        "oldObject": json_to_cel(dict(request.old) if request.old is not None else None),
    }
    errors: list[str] = []
    for condition in spec.get("matchConditions") or []:
        try:
            if not _evaluate(condition["expression"], activation):
                return Outcome(matched=False)
        except PolicyError as exc:
            errors.append(str(exc))
    variables: dict[celtypes.StringType, Any] = {}
    for variable in spec.get("variables") or []:
        activation["variables"] = celtypes.MapType(variables)
        try:
            variables[celtypes.StringType(variable["name"])] = _evaluate(
                variable["expression"], activation)
        except PolicyError as exc:
            # Variables are lazy in the apiserver: an error surfaces where one is used.
            variables[celtypes.StringType(variable["name"])] = CELEvalError(str(exc))
    activation["variables"] = celtypes.MapType(variables)
    failures: list[str] = []
    for validation in spec.get("validations") or []:
        try:
            if _evaluate(validation["expression"], activation):
                continue
        except PolicyError as exc:
            errors.append(str(exc))
            continue
        failures.append(_message(validation, activation))
    return Outcome(matched=True, failures=tuple(failures), errors=tuple(errors),
                   variables={str(k): v for k, v in variables.items()})


def _message(validation: Mapping[str, Any], activation: Mapping[str, Any]) -> str:
    """``messageExpression``, else ``message``, else the apiserver's default."""
    if "messageExpression" in validation:
        try:
            text = _evaluate(validation["messageExpression"], activation)
        except PolicyError:
            text = None
        if isinstance(text, str) and text.strip():
            return str(text)
    if validation.get("message"):
        return str(validation["message"])
    return f"failed expression: {validation['expression']}"
