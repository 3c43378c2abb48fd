"""Check DeviceClasses and claims before they reach a cluster: API limits, CEL, attribute names.

Structural checks follow the apiserver's ``resource.k8s.io/v1`` validation (field paths as
it reports them). CEL selectors are compiled like the apiserver does, and then checked
against what this driver publishes: a misspelt attribute (``productNmae``) compiles fine
but makes every allocation fail at scheduling time, so it is reported here with the
closest real name; so are comparisons the scheduler rejects at runtime (a ``version``
attribute compared with a string) and ``quantity()``/``semver()`` literals that cannot parse.
"""

from __future__ import annotations

import difflib
import importlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpudra.controller.slice_validation import (
    dns1123_label_errors,
    dns1123_subdomain_errors,
    label_key_errors,
)
from gpudra.scheduling.cel import CelCompileError, compile_selector
from gpudra.scheduling.cel.checks import Comparison, LiteralCall, Reference
from gpudra.scheduling.cel.quantity import parse as parse_quantity
from gpudra.scheduling.cel.semver import normalize as normalize_semver
from gpudra.scheduling.cel.semver import parse as parse_semver

STANDARD_DOMAIN = "resource.kubernetes.io"

# --- what this driver publishes (README "Devices and attributes") ----------------------

ATTRIBUTES: dict[str, str] = {
    "type": "string", "uuid": "string", "productName": "string", "brand": "string",
    "architecture": "string", "cudaComputeCapability": "version", "driverVersion": "version",
    "cudaDriverVersion": "version", "addressingMode": "string", "numaNode": "int",
    "nvlinkDomain": "string", "parentUUID": "string", "profile": "string",
}
"""Attributes in the driver's own domain, with their DRA types (GPU and MIG devices)."""
STANDARD_ATTRIBUTES: dict[str, str] = {"pciBusID": "string", "pcieRoot": "string"}
"""Attributes in ``resource.kubernetes.io``."""
CAPACITIES = ("memory", "multiprocessors", "copyEngines", "decoders", "encoders",
              "jpegEngines", "ofaEngines")
_MEMORY_SLICE = re.compile(r"^memorySlice\d+$")
"""Static MIG devices also publish ``memorySlice<i>`` capacities."""
REMOVED: dict[str, str] = {
    "index": "NVIDIA's driver removed 'index' (Sept 2025); select on uuid, "
             "resource.kubernetes.io/pciBusID or numaNode instead",
    "minor": "NVIDIA's driver removed 'minor' (Sept 2025); select on uuid or "
             "resource.kubernetes.io/pciBusID instead",
    "pcieBusID": "replaced by the standard attribute resource.kubernetes.io/pciBusID",
}

MAX_REQUESTS = 32
MAX_SELECTORS = 32
MAX_CONSTRAINTS = 32
MAX_CONFIGS = 32
MAX_SUBREQUESTS = 8
MAX_TOLERATIONS = 16
MAX_OPAQUE_BYTES = 10 * 1024
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def suggest(name: str, candidates: Iterable[str]) -> str | None:
    """The closest known name, for "did you mean" hints."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def known_attributes(domain: str, driver: str) -> dict[str, str] | None:
    """Attribute name → type for a domain this driver publishes in; None for other domains."""
    if domain == driver:
        return ATTRIBUTES
    if domain == STANDARD_DOMAIN:
        return STANDARD_ATTRIBUTES
    return None


def is_known_capacity(name: str) -> bool:
    return name in CAPACITIES or bool(_MEMORY_SLICE.match(name))


@dataclass(frozen=True)
class Problem:
    """One finding: ``path`` is the field path inside the object."""

    path: str
    message: str
    warning: bool = False
    structural: bool = True
    """The apiserver would refuse the object; False for what only goes wrong later (CEL
    that cannot match or fails at scheduling time, opaque configs the driver rejects)."""


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


# --- the checks -----------------------------------------------------------------------

class _Checker:
    """Collects problems for one object."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.problems: list[Problem] = []

    def error(self, path: str, message: str, *, structural: bool = True) -> None:
        self.problems.append(Problem(path, message, structural=structural))

    def later(self, path: str, message: str) -> None:
        """A problem the apiserver lets through: it shows at scheduling or prepare time."""
        self.error(path, message, structural=False)

    def warn(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, warning=True, structural=False))

    def names(self, path: str, value: Any, check: Callable[[str], list[str]],
              required: bool = True) -> None:
        if value is None or value == "":
            if required:
                self.error(path, "Required value")
            return
        if not isinstance(value, str):
            self.error(path, f"Invalid value: {value!r}: must be a string")
            return
        for message in check(value):
            self.error(path, f"Invalid value: {value!r}: {message}")

    def limit(self, path: str, items: Any, maximum: int) -> list[Any]:
        if items is None:
            return []
        if not isinstance(items, list):
            self.error(path, f"Invalid value: must be a list, got {type(items).__name__}")
            return []
        if len(items) > maximum:
            self.error(path, f"Too many: {len(items)}: must have at most {maximum} items")
        return items

    # --- CEL ----------------------------------------------------------------------------

    def selectors(self, path: str, selectors: Any) -> None:
        for i, selector in enumerate(self.limit(path, selectors, MAX_SELECTORS)):
            here = f"{path}[{i}]"
            cel = selector.get("cel") if isinstance(selector, Mapping) else None
            if not isinstance(cel, Mapping):
                self.error(f"{here}.cel", "Required value")
                continue
            expression = cel.get("expression")
            if not isinstance(expression, str) or not expression.strip():
                self.error(f"{here}.cel.expression", "Required value")
                continue
            self.expression(f"{here}.cel.expression", expression)

    def expression(self, path: str, expression: str) -> None:
        try:
            selector = compile_selector(expression)
        except CelCompileError as exc:
            if exc.unsupported:
                self.warn(path, f"not checked: {exc}")
            else:
                self.error(path, f"Invalid value: CEL compile error: {exc}")
            return
        for reference in selector.analysis.references:
            self.reference(path, reference)
        for comparison in selector.analysis.comparisons:
            self.comparison(path, comparison)
        for call in selector.analysis.literal_calls:
            self.literal_call(path, call)

    def reference(self, path: str, ref: Reference) -> None:
        field = "attributes" if ref.kind == "attribute" else "capacity"
        where = f"line {ref.line}, column {ref.column}: device.{field}['{ref.domain}'].{ref.name}"
        if ref.kind == "capacity":
            if ref.domain == self.driver and not is_known_capacity(ref.name):
                hint = suggest(ref.name, CAPACITIES)
                self.later(path, f"{where}: no such capacity on this driver's devices"
                           + (f"; did you mean '{hint}'?" if hint else
                              f" (known: {', '.join(CAPACITIES)})"))
            return
        known = known_attributes(ref.domain, self.driver)
        if known is None or ref.name in known:
            return
        if ref.domain == self.driver and ref.name in REMOVED:
            self.later(path, f"{where}: no such attribute: {REMOVED[ref.name]}")
            return
        hint = suggest(ref.name, known)
        missing = "is never published" if ref.guarded else (
            "is not published, so the scheduler fails with 'no such key'")
        self.later(path, f"{where}: no such attribute: {ref.name} {missing}"
                   + (f"; did you mean '{hint}'?" if hint else ""))

    def comparison(self, path: str, comparison: Comparison) -> None:
        """Operand types the scheduler rejects at runtime, or that make a test constant.

        Quantity and Semver have no ordering operators, and on the left of ``==`` they
        refuse other types ("no such overload"); plain values of different types are just
        unequal (heterogeneous equality).
        """
        ref = comparison.reference
        if ref.kind == "capacity":
            kind: str | None = "quantity"
        else:
            kind = (known_attributes(ref.domain, self.driver) or {}).get(ref.name)
        if kind is None:
            return
        literal = comparison.literal_type
        other = _KINDS.get(literal, literal)
        op = comparison.op
        at = f"line {ref.line}, column {ref.column}: {ref.name} is {_article(kind)} {kind}"
        if op in ("==", "!=", "in"):
            if other == kind:
                return
            left_opaque = kind if comparison.reference_first else other
            if left_opaque in _OPAQUE:
                self.later(path, f"{at}: '{op}' with {_article(literal)} {literal} fails at "
                           f"scheduling time ('no such overload'); "
                           f"{self._advice(ref, kind, comparison)}")
            else:
                self.later(path, f"{at}: comparing it with {_article(literal)} {literal} is "
                           f"always {'true' if op == '!=' else 'false'}")
            return
        if kind in _OPAQUE or other in _OPAQUE:
            self.later(path, f"{at}: '{op}' fails at scheduling time ('no such overload': "
                       f"{_PLURAL.get(kind, kind)} have no ordering operators); "
                       f"{self._advice(ref, kind, comparison)}")
        elif other != kind:
            self.later(path, f"{at}: '{op}' with {_article(literal)} {literal} fails at "
                       "scheduling time ('no such overload')")

    @staticmethod
    def _advice(ref: Reference, kind: str, comparison: Comparison) -> str:
        field = "attributes" if ref.kind == "attribute" else "capacity"
        op = "==" if comparison.op == "in" else comparison.op
        if kind == "version":
            value = f"semver('{_semver_example(comparison.literal)}')"
        elif kind == "quantity":
            value = f"quantity('{comparison.literal}')"
        else:
            return "compare values of the same type"
        return f"use device.{field}['{ref.domain}'].{ref.name}.compareTo({value}) {op} 0"

    def literal_call(self, path: str, call: LiteralCall) -> None:
        try:
            if call.function == "quantity":
                parse_quantity(call.argument)
            else:
                parse_semver(call.argument)
        except ValueError as exc:
            hint = ""
            if call.function == "semver":
                normalized = _semver_example(call.argument)
                if normalized != call.argument:
                    hint = f"; did you mean semver('{normalized}')?"
            self.later(path, f"line {call.line}, column {call.column}: {call.function}"
                       f"('{call.argument}') fails at scheduling time: {exc}{hint}")

    # --- configs --------------------------------------------------------------------------

    def configs(self, path: str, configs: Any, request_names: set[str] | None) -> None:
        for i, config in enumerate(self.limit(path, configs, MAX_CONFIGS)):
            here = f"{path}[{i}]"
            if not isinstance(config, Mapping):
                self.error(here, "Invalid value: must be an object")
                continue
            if request_names is not None:
                for j, name in enumerate(config.get("requests") or []):
                    if name not in request_names:
                        self.error(f"{here}.requests[{j}]", f"Invalid value: {name!r}: "
                                   "must be the name of a request in the claim")
            elif config.get("requests"):
                self.error(f"{here}.requests", "Forbidden: not allowed in a DeviceClass")
            opaque = config.get("opaque")
            if not isinstance(opaque, Mapping):
                self.error(f"{here}.opaque", "Required value")
                continue
            self.opaque(f"{here}.opaque", opaque)

    def opaque(self, path: str, opaque: Mapping[str, Any]) -> None:
        driver = opaque.get("driver")
        self.names(f"{path}.driver", driver, dns1123_subdomain_errors)
        parameters = opaque.get("parameters")
        if parameters is None:
            self.error(f"{path}.parameters", "Required value")
            return
        if not isinstance(parameters, Mapping):
            self.error(f"{path}.parameters", "Invalid value: must be a JSON object")
            return
        if len(json.dumps(parameters)) > MAX_OPAQUE_BYTES:
            self.error(f"{path}.parameters", f"Too long: must have at most {MAX_OPAQUE_BYTES} "
                       "bytes")
        if driver != self.driver:
            return
        validate_opaque = _opaque_validator()
        if validate_opaque is None:
            return
        for problem in validate_opaque(dict(parameters)):
            where, _, message = problem.partition(": ")
            sub = "" if where in ("", "parameters") else f".{where}"
            self.later(f"{path}.parameters{sub}", message or problem)


def _opaque_validator() -> Callable[[dict[str, Any]], list[str]] | None:
    """``gpudra.api.configs.validate_opaque`` when that module is installed."""
    try:
        module = importlib.import_module("gpudra.api.configs")
    except ImportError:
        return None
    validator = getattr(module, "validate_opaque", None)
    return validator if callable(validator) else None


_OPAQUE = ("version", "quantity")
_PLURAL = {"version": "versions", "quantity": "quantities"}
_KINDS = {"Semver": "version", "Quantity": "quantity", "uint": "int", "double": "int"}
"""Literal types as the attribute kind they compare equal with (numbers across types)."""


def _article(kind: str) -> str:
    return "an" if kind[:1] in "aeiou" else "a"


def _semver_example(literal: str) -> str:
    try:
        return str(parse_semver(normalize_semver(literal)))
    except ValueError:
        return literal


# --- claims ---------------------------------------------------------------------------

def _tolerations(check: _Checker, path: str, tolerations: Any) -> None:
    for i, toleration in enumerate(check.limit(path, tolerations, MAX_TOLERATIONS)):
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


def _exact(check: _Checker, path: str, spec: Any, subrequest: bool) -> None:
    if not isinstance(spec, Mapping):
        check.error(path, "Invalid value: must be an object")
        return
    check.names(f"{path}.deviceClassName", spec.get("deviceClassName"),
                dns1123_subdomain_errors)
    check.selectors(f"{path}.selectors", spec.get("selectors"))
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
        try:
            parse_quantity(str(value))
        except ValueError as exc:
            check.error(f"{path}.capacity.requests[{name}]", f"Invalid value: {exc}")


def _requests(check: _Checker, path: str, requests: Any) -> set[str]:
    """Checks ``requests``; returns every name a constraint or config may refer to."""
    names: set[str] = set()
    for i, request in enumerate(check.limit(path, requests, MAX_REQUESTS)):
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
        subs = check.limit(f"{here}.firstAvailable", first, MAX_SUBREQUESTS)
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


def _constraints(check: _Checker, path: str, constraints: Any, names: set[str]) -> None:
    for i, constraint in enumerate(check.limit(path, constraints, MAX_CONSTRAINTS)):
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


def _fully_qualified(check: _Checker, path: str, attribute: Any) -> None:
    if not isinstance(attribute, str) or "/" not in attribute:
        check.error(path, f"Invalid value: {attribute!r}: must include a domain "
                    "(fully qualified, e.g. gpu.nvidia.com/parentUUID)")
        return
    domain, _, name = attribute.partition("/")
    for message in dns1123_subdomain_errors(domain):
        check.error(path, f"Invalid value: {attribute!r}: domain: {message}")
    if len(domain) > 63:
        check.error(path, f"Invalid value: {attribute!r}: domain must be at most 63 characters")
    if not _C_IDENTIFIER.match(name) or len(name) > 32:
        check.error(path, f"Invalid value: {attribute!r}: the name must be a C identifier of "
                    "at most 32 characters")
        return
    known = known_attributes(domain, check.driver)
    if known is not None and name not in known:
        hint = suggest(name, known)
        check.error(path, f"no such attribute: {attribute} is not published by this driver"
                    + (f"; did you mean '{domain}/{hint}'?" if hint else ""))


def _claim_devices(check: _Checker, path: str, devices: Any) -> None:
    if devices is None:
        return
    if not isinstance(devices, Mapping):
        check.error(path, "Invalid value: must be an object")
        return
    names = _requests(check, f"{path}.requests", devices.get("requests"))
    _constraints(check, f"{path}.constraints", devices.get("constraints"), names)
    check.configs(f"{path}.config", devices.get("config"), names)


def _pod(check: _Checker, path: str, spec: Mapping[str, Any]) -> None:
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
    check = _Checker(driver)
    kind = obj.get("kind")
    raw_spec = obj.get("spec")
    spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, Mapping) else {}
    name = (obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get(
        "generateName")
    if kind == "DeviceClass":
        check.names("metadata.name", name, dns1123_subdomain_errors)
        check.selectors("spec.selectors", spec.get("selectors"))
        check.configs("spec.config", spec.get("config"), None)
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
