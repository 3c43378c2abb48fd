"""A claim's ``spec.devices.requests`` as the allocator reads them: requests, and the
``firstAvailable`` alternatives of each."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudra.scheduling.capacity import Amount, request_amounts


@dataclass(frozen=True)
class Request:
    """One request, or one ``firstAvailable`` subrequest of a request."""

    name: str
    """``req``, or ``req/sub`` for a subrequest: what results and configs call it."""
    base: str
    sub: str
    device_class: str
    selectors: tuple[str, ...]
    all_mode: bool
    count: int
    admin_access: bool
    tolerations: tuple[Mapping[str, Any], ...]
    capacity: Mapping[str, Amount] = field(default_factory=dict)
    """``capacity.requests``, parsed: what one device must have left (KEP-5075)."""

    @property
    def wanted(self) -> str:
        return "All" if self.all_mode else str(self.count)


@dataclass(frozen=True)
class RequestGroup:
    """``spec.devices.requests[i]``: one alternative, or its ``firstAvailable`` list."""

    name: str
    alternatives: tuple[Request, ...]
    first_available: bool


def _request(base: str, sub: str, spec: Mapping[str, Any], admin: bool) -> Request:
    mode = spec.get("allocationMode") or "ExactCount"
    selectors = tuple(str((s.get("cel") or {}).get("expression", ""))
                      for s in spec.get("selectors") or [])
    return Request(
        name=f"{base}/{sub}" if sub else base,
        base=base,
        sub=sub,
        device_class=str(spec.get("deviceClassName", "")),
        selectors=selectors,
        all_mode=mode == "All",
        count=int(spec.get("count") or 1) if mode != "All" else 0,
        admin_access=admin,
        tolerations=tuple(spec.get("tolerations") or ()),
        capacity=request_amounts(spec.get("capacity")),
    )


def request_groups(devices: Mapping[str, Any]) -> list[RequestGroup]:
    """The requests of ``spec.devices`` (a pre-v1 request without ``exactly`` is accepted)."""
    groups = []
    for raw in devices.get("requests") or []:
        name = str(raw.get("name", ""))
        if raw.get("firstAvailable"):
            alternatives = tuple(_request(name, str(s.get("name", "")), s, False)
                                 for s in raw["firstAvailable"])
            groups.append(RequestGroup(name, alternatives, True))
        else:
            exact = raw.get("exactly") or raw
            groups.append(RequestGroup(name, (
                _request(name, "", exact, bool(exact.get("adminAccess"))),), False))
    return groups


def claim_label(claim: Mapping[str, Any]) -> str:
    """``namespace/name`` as the scheduler prints it (``klog.KObj``)."""
    meta = claim.get("metadata") or {}
    name = str(meta.get("name") or meta.get("generateName") or "<unnamed>")
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name
