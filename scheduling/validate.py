"""Check DeviceClasses and claims before they reach a cluster: API limits, CEL, attribute names.

Structural checks follow the apiserver's ``resource.k8s.io/v1`` validation (field paths as
it reports them, limits from ``controller.api_limits``). CEL selectors are compiled like the
apiserver does, and then checked against what this driver publishes (``selector_checks``).
Opaque configs for this driver are decoded as the driver will decode them.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from fractions import Fraction
from typing import Any, Final

from gpudra.api.api_limits import (
    DEVICE_CONFIG_MAX_SIZE,
    DEVICE_CONSTRAINTS_MAX_SIZE,
    DEVICE_MAX_DOMAIN_LENGTH,
    DEVICE_MAX_ID_LENGTH,
    DEVICE_REQUESTS_MAX_SIZE,
    DEVICE_TOLERATIONS_MAX_LENGTH,
    FIRST_AVAILABLE_DEVICE_REQUEST_MAX_SIZE,
    OPAQUE_PARAMETERS_MAX_LENGTH,
)
from gpudra.api.name_formats import (
    dns1123_label_errors,
    dns1123_subdomain_errors,
    label_key_errors,
)
from gpudra.driver.gpu_shares import (
    MEMORY,
    SHARE_CLASS,
    SHARED_CAPACITIES,
    SHARES,
    SHARES_PER_GPU,
)
from gpudra.scheduling.catalog import is_known_capacity, known_attributes, suggest
from gpudra.scheduling.cel.quantity import parse as parse_quantity
from gpudra.scheduling.findings import Checker, Problem
from gpudra.scheduling.selector_checks import check_selectors

_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --- documents ------------------------------------------------------------------------

def objects(documents: Iterable[Any]) -> Iterator[Mapping[str, Any]]:
    """Every Kubernetes object of a YAML stream, with ``kind: List`` items flattened."""
    for document in documents:
        if not isinstance(document, Mapping):
            continue
        if document.get("kind") == "List" or (
                str(document.get("kind", "")).endswith("List") and "items" in document):
            yield from objects(document.get("items") or [])
        else:
            yield document


def object_label(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    name = f"{meta['namespace']}/{name}" if meta.get("namespace") else name
    return f"{obj.get('kind', '<no kind>')} {name}"


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod spec of a Pod or a workload (Deployment, Job …) that has resourceClaims."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        return spec if isinstance(spec, Mapping) else None
    template = spec.get("template") if isinstance(spec, Mapping) else None
    inner = (template or {}).get("spec") if isinstance(template, Mapping) else None
    if isinstance(inner, Mapping) and inner.get("resourceClaims") is not None:
        return inner
    job = (spec.get("jobTemplate") or {}).get("spec") if isinstance(spec, Mapping) else None
    if isinstance(job, Mapping):
        return pod_spec({"kind": "Job", "spec": job})
    return None


# --- configs --------------------------------------------------------------------------

def _configs(check: Checker, path: str, configs: Any, request_names: set[str] | None) -> None:
    for i, config in enumerate(check.limit(path, configs, DEVICE_CONFIG_MAX_SIZE)):
        here = f"{path}[{i}]"
        if not isinstance(config, Mapping):
            check.error(here, "Invalid value: must be an object")
            continue
        if request_names is not None:
            for j, name in enumerate(config.get("requests") or []):
                if name not in request_names:
                    check.error(f"{here}.requests[{j}]", f"Invalid value: {name!r}: "
                                "must be the name of a request in the claim")
        elif config.get("requests"):
            check.error(f"{here}.requests", "Forbidden: not allowed in a DeviceClass")
        opaque = config.get("opaque")
        if not isinstance(opaque, Mapping):
            check.error(f"{here}.opaque", "Required value")
            continue
        _opaque(check, f"{here}.opaque", opaque)


def _opaque(check: Checker, path: str, opaque: Mapping[str, Any]) -> None:
    driver = opaque.get("driver")
    check.names(f"{path}.driver", driver, dns1123_subdomain_errors)
    parameters = opaque.get("parameters")
    if parameters is None:
        check.error(f"{path}.parameters", "Required value")
        return
    if not isinstance(parameters, Mapping):
        check.error(f"{path}.parameters", "Invalid value: must be a JSON object")
        return
    if len(json.dumps(parameters)) > OPAQUE_PARAMETERS_MAX_LENGTH:
        check.error(f"{path}.parameters", "Too long: may not be more than "
                    f"{OPAQUE_PARAMETERS_MAX_LENGTH} bytes")
    if driver != check.driver:
        return
    validate_opaque = _opaque_validator()
    if validate_opaque is None:
        return
    for problem in validate_opaque(dict(parameters)):
        where, _, message = problem.partition(": ")
        sub = "" if where in ("", "parameters") else f".{where}"
        check.later(f"{path}.parameters{sub}", message or problem)


def _opaque_validator() -> Callable[[dict[str, Any]], list[str]] | None:
    """``gpudra.api.configs.validate_opaque`` when that module is installed."""
    try:
        module = importlib.import_module("gpudra.api.configs")
    except ImportError:
        return None
    validator = getattr(module, "validate_opaque", None)
    return validator if callable(validator) else None


# --- claims ---------------------------------------------------------------------------

def _tolerations(check: Checker, path: str, tolerations: Any) -> None:
    for i, toleration in enumerate(check.limit(path, tolerations, DEVICE_TOLERATIONS_MAX_LENGTH)):
        here = f"{path}[{i}]"
        if not isinstance(toleration, Mapping):
            check.error(here, "Invalid value: must be an object")
            continue
        if toleration.get("key"):
            check.names(f"{here}.key", toleration["key"], label_key_errors)
        operator = toleration.get("operator") or "Equal"
        if operator not in ("Exists", "Equal"):
            check.error(f"{here}.operator", f"Unsupported value: {operator!r}: supported "
                        "values: \"Equal\", \"Exists\"")
        if operator == "Exists" and toleration.get("value"):
            check.error(f"{here}.value", "Invalid value: must be empty when operator is Exists")
        effect = toleration.get("effect")
        if effect and effect not in ("None", "NoSchedule", "NoExecute"):
            check.error(f"{here}.effect", f"Unsupported value: {effect!r}: supported values: "
                        "\"NoExecute\", \"NoSchedule\", \"None\"")


def _exact(check: Checker, path: str, spec: Any, subrequest: bool) -> None:
    if not isinstance(spec, Mapping):
        check.error(path, "Invalid value: must be an object")
        return
    check.names(f"{path}.deviceClassName", spec.get("deviceClassName"),
                dns1123_subdomain_errors)
    check_selectors(check, f"{path}.selectors", spec.get("selectors"))
    mode = spec.get("allocationMode") or "ExactCount"
    count = spec.get("count")
    if mode == "ExactCount":
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)
                                  or count <= 0):
            check.error(f"{path}.count", f"Invalid value: {count!r}: must be greater than zero")
    elif mode == "All":
        if count:
            check.error(f"{path}.count", f"Invalid value: {count!r}: must not be set when "
                        "allocationMode is All")
    else:
        check.error(f"{path}.allocationMode", f"Unsupported value: {mode!r}: supported values: "
                    "\"All\", \"ExactCount\"")
    if subrequest and "adminAccess" in spec:
        check.error(f"{path}.adminAccess", "Forbidden: adminAccess is not allowed in "
                    "firstAvailable subrequests")
    elif spec.get("adminAccess") not in (None, True, False):
        check.error(f"{path}.adminAccess", "Invalid value: must be a boolean")
    _tolerations(check, f"{path}.tolerations", spec.get("tolerations"))
    capacity = (spec.get("capacity") or {}).get("requests") if isinstance(
        spec.get("capacity"), Mapping) else None
    for name, value in (capacity or {}).items():
        here = f"{path}.capacity.requests[{name}]"
        try:
            amount = parse_quantity(str(value))
        except ValueError as exc:
            check.error(here, f"Invalid value: {exc}")
            continue
        _capacity_request(check, here, str(spec.get("deviceClassName", "")), str(name),
                          amount.value)


GPU_CLASS: Final = "gpu.nvidia.com"
MIG_CLASS: Final = "mig.nvidia.com"


def _capacity_request(check: Checker, path: str, device_class: str, name: str,
                      amount: Fraction) -> None:
    """A ``capacity.requests`` entry against what the class's devices publish and the
    shared devices' request policies (``gpudra.driver.gpu_shares``)."""
    bare = name.removeprefix(f"{check.driver}/")
    if device_class == SHARE_CLASS:
        if bare not in SHARED_CAPACITIES:
            check.later(path, f"Invalid value: {name!r}: shared GPUs publish no such capacity "
                        f"(they publish {', '.join(SHARED_CAPACITIES)}); a device without it "
                        "is never chosen")
        elif amount < 1 or (bare != MEMORY and amount.denominator != 1):
            check.later(path, f"Invalid value: {amount}: {bare} is requested in whole units of "
                        "at least 1 (the policy rounds up, never down to 0)")
        elif bare == SHARES and amount > SHARES_PER_GPU:
            check.later(path, f"Invalid value: {amount}: a shared GPU has {SHARES_PER_GPU} "
                        "shares")
        return
    if "/" not in name or name.startswith(f"{check.driver}/"):
        if not is_known_capacity(bare):
            check.warn(path, f"{name!r}: this driver publishes no such capacity; a device "
                       "without it is never chosen")
        elif device_class in (GPU_CLASS, MIG_CLASS):
            check.warn(path, f"class {device_class} hands out whole devices: a capacity request "
                       f"only picks one with at least that much {bare}; for a fraction of a GPU "
                       f"use class {SHARE_CLASS}")


def _requests(check: Checker, path: str, requests: Any) -> set[str]:
    """Checks ``requests``; returns every name a constraint or config may refer to."""
    names: set[str] = set()
    for i, request in enumerate(check.limit(path, requests, DEVICE_REQUESTS_MAX_SIZE)):
        here = f"{path}[{i}]"
        if not isinstance(request, Mapping):
            check.error(here, "Invalid value: must be an object")
            continue
        name = request.get("name")
        check.names(f"{here}.name", name, dns1123_label_errors)
        if isinstance(name, str):
            if name in names:
                check.error(f"{here}.name", f"Duplicate value: {name!r}")
            names.add(name)
        exact, first = request.get("exactly"), request.get("firstAvailable")
        if (exact is None) == (first is None):
            check.error(here, "Invalid value: exactly one of `exactly` or `firstAvailable` "
                        "is required")
            continue
        if exact is not None:
            _exact(check, f"{here}.exactly", exact, subrequest=False)
            continue
        subs = check.limit(f"{here}.firstAvailable", first, FIRST_AVAILABLE_DEVICE_REQUEST_MAX_SIZE)
        if not subs:
            check.error(f"{here}.firstAvailable", "Required value: at least one subrequest")
        seen: set[str] = set()
        for j, sub in enumerate(subs):
            sub_path = f"{here}.firstAvailable[{j}]"
            sub_name = sub.get("name") if isinstance(sub, Mapping) else None
            check.names(f"{sub_path}.name", sub_name, dns1123_label_errors)
            if isinstance(sub_name, str):
                if sub_name in seen:
                    check.error(f"{sub_path}.name", f"Duplicate value: {sub_name!r}")
                seen.add(sub_name)
                names.add(f"{name}/{sub_name}")
            _exact(check, sub_path, sub, subrequest=True)
    return names


def _constraints(check: Checker, path: str, constraints: Any, names: set[str]) -> None:
    for i, constraint in enumerate(check.limit(path, constraints, DEVICE_CONSTRAINTS_MAX_SIZE)):
        here = f"{path}[{i}]"
        if not isinstance(constraint, Mapping):
            check.error(here, "Invalid value: must be an object")
            continue
        for j, name in enumerate(constraint.get("requests") or []):
            if name not in names:
                check.error(f"{here}.requests[{j}]", f"Invalid value: {name!r}: must be the "
                            "name of a request in the claim (or <request>/<subrequest>)")
        kinds = [k for k in ("matchAttribute", "distinctAttribute") if k in constraint]
        if len(kinds) != 1:
            check.error(here, "Required value: exactly one of matchAttribute or "
                        "distinctAttribute is required")
            continue
        attribute = constraint[kinds[0]]
        _fully_qualified(check, f"{here}.{kinds[0]}", attribute)


def _fully_qualified(check: Checker, path: str, attribute: Any) -> None:
    if not isinstance(attribute, str) or "/" not in attribute:
        check.error(path, f"Invalid value: {attribute!r}: must include a domain "
                    "(fully qualified, e.g. gpu.nvidia.com/parentUUID)")
        return
    domain, _, name = attribute.partition("/")
    for message in dns1123_subdomain_errors(domain):
        check.error(path, f"Invalid value: {attribute!r}: domain: {message}")
    if len(domain) > DEVICE_MAX_DOMAIN_LENGTH:
        check.error(path, f"Invalid value: {attribute!r}: domain must be at most "
                    f"{DEVICE_MAX_DOMAIN_LENGTH} characters")
    if not _C_IDENTIFIER.match(name) or len(name) > DEVICE_MAX_ID_LENGTH:
        check.error(path, f"Invalid value: {attribute!r}: the name must be a C identifier of "
                    f"at most {DEVICE_MAX_ID_LENGTH} characters")
        return
    known = known_attributes(domain, check.driver)
    if known is not None and name not in known:
        hint = suggest(name, known)
        check.error(path, f"no such attribute: {attribute} is not published by this driver"
                    + (f"; did you mean '{domain}/{hint}'?" if hint else ""))


def _claim_devices(check: Checker, path: str, devices: Any) -> None:
    if devices is None:
        return
    if not isinstance(devices, Mapping):
        check.error(path, "Invalid value: must be an object")
        return
    names = _requests(check, f"{path}.requests", devices.get("requests"))
    _constraints(check, f"{path}.constraints", devices.get("constraints"), names)
    _configs(check, f"{path}.config", devices.get("config"), names)


def _pod(check: Checker, path: str, spec: Mapping[str, Any]) -> None:
    claims = spec.get("resourceClaims") or []
    seen: set[str] = set()
    for i, claim in enumerate(claims if isinstance(claims, list) else []):
        here = f"{path}.resourceClaims[{i}]"
        name = claim.get("name") if isinstance(claim, Mapping) else None
        check.names(f"{here}.name", name, dns1123_label_errors)
        if isinstance(name, str):
            if name in seen:
                check.error(f"{here}.name", f"Duplicate value: {name!r}")
            seen.add(name)
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName")
                   if isinstance(claim, Mapping) and claim.get(k)]
        if len(sources) != 1:
            check.error(here, "Invalid value: exactly one of resourceClaimName or "
                        "resourceClaimTemplateName is required")


def validate_object(obj: Mapping[str, Any], *, driver: str) -> list[Problem]:
    """Problems of one DeviceClass, ResourceClaim(Template) or Pod; others are ignored."""
    check = Checker(driver)
    kind = obj.get("kind")
    raw_spec = obj.get("spec")
    spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, Mapping) else {}
    name = (obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get(
        "generateName")
    if kind == "DeviceClass":
        check.names("metadata.name", name, dns1123_subdomain_errors)
        check_selectors(check, "spec.selectors", spec.get("selectors"))
        _configs(check, "spec.config", spec.get("config"), None)
    elif kind == "ResourceClaim":
        _claim_devices(check, "spec.devices", spec.get("devices"))
    elif kind == "ResourceClaimTemplate":
        raw_inner = spec.get("spec")
        inner: Mapping[str, Any] = raw_inner if isinstance(raw_inner, Mapping) else {}
        _claim_devices(check, "spec.spec.devices", inner.get("devices"))
    else:
        pod = pod_spec(obj)
        if pod is not None:
            prefix = "spec" if kind == "Pod" else _pod_spec_path(obj)
            _pod(check, prefix, pod)
    return check.problems


def _pod_spec_path(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec") or {}
    return "spec.jobTemplate.spec.template.spec" if "jobTemplate" in spec else \
        "spec.template.spec"


CHECKED_KINDS = ("DeviceClass", "ResourceClaim", "ResourceClaimTemplate")
