"""Which ``resource.k8s.io`` versions this server serves, and the older versions' shapes.

Objects are stored in one form, the ``v1`` one (the "hub", as the apiserver keeps an
internal version); a request to ``v1beta1`` or ``v1beta2`` is converted to it on the way in
and every answer back to the version asked for, so one object can be read in every served
version. The three modes stand for the Kubernetes releases a cluster still runs:

=========  ==========================  ============================================
mode       serves                      as
=========  ==========================  ============================================
``v1``     v1, v1beta2, v1beta1        1.34 and later (every field known)
``v1beta2`` v1beta2, v1beta1           1.33 with its default feature gates
``v1beta1`` v1beta1                    1.32 with its default feature gates
=========  ==========================  ============================================

The beta modes know only the fields those releases had on by default: a field they lack
(a 1.32 server never heard of device taints; a 1.33 server has partitionable devices and
taints as alpha features, off by default) is dropped from what is written, with a
``Warning`` header, as the apiserver's default ``fieldValidation=Warn`` and its disabled
feature gates do; never a rejection. Each drop is recorded (``pruned``) so tests can say
"nothing was lost".

The shapes differ in two places (``k8s.io/api/resource/v1beta1/types.go``): a v1beta1
``Device`` holds its fields under ``basic``, and a v1beta1 ``DeviceRequest`` holds the
fields v1beta2/v1 put under ``exactly`` at its own level. v1beta2 and v1 have one shape.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

Obj = dict[str, Any]

GROUP: Final = "resource.k8s.io"
HUB: Final = "v1"
BETA_KINDS: Final = ("resourceslices", "resourceclaims", "resourceclaimtemplates",
                     "deviceclasses")
"""What the beta versions serve (the ``v1`` extras, e.g. DeviceTaintRule, they do not)."""


# ---- shapes: v1beta1 <-> v1 ----------------------------------------------------------------

def _device_to_hub(device: Any) -> Any:
    if not isinstance(device, dict) or "basic" not in device:
        return device
    basic = device.get("basic")
    out = {k: v for k, v in device.items() if k != "basic"}
    if isinstance(basic, dict):
        out.update(basic)
    return out


def _device_from_hub(device: Any) -> Any:
    if not isinstance(device, dict):
        return device
    return {"name": device.get("name"), "basic": {k: v for k, v in device.items()
                                                  if k != "name"}}


def _request_to_hub(request: Any) -> Any:
    if not isinstance(request, dict) or "exactly" in request or "firstAvailable" in request:
        return request
    exactly = {k: v for k, v in request.items() if k != "name"}
    return {"name": request.get("name"), "exactly": exactly}


def _request_from_hub(request: Any) -> Any:
    if not isinstance(request, dict):
        return request
    out = {k: v for k, v in request.items() if k != "exactly"}
    exactly = request.get("exactly")
    if isinstance(exactly, dict):
        out.update(exactly)
    return out


def _map_list(obj: Any, path: tuple[str, ...], fn: Callable[[Any], Any]) -> None:
    """Apply ``fn`` to each item of the list at ``path`` (where it is one)."""
    node = obj
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict) and isinstance(node.get(path[-1]), list):
        node[path[-1]] = [fn(item) for item in node[path[-1]]]


_LISTS: Final[dict[str, tuple[str, ...]]] = {
    "resourceslices": ("spec", "devices"),
    "resourceclaims": ("spec", "devices", "requests"),
    "resourceclaimtemplates": ("spec", "spec", "devices", "requests"),
}


def to_hub(plural: str, version: str, obj: Any) -> Any:
    """A body of ``version`` as the hub stores it (a copy; anything not an object as it is)."""
    if not isinstance(obj, dict):
        return obj
    out = copy.deepcopy(obj)
    if out.get("apiVersion") == f"{GROUP}/{version}":
        out["apiVersion"] = f"{GROUP}/{HUB}"
    if version == "v1beta1" and plural in _LISTS:
        fn = _device_to_hub if plural == "resourceslices" else _request_to_hub
        _map_list(out, _LISTS[plural], fn)
    return out


def from_hub(plural: str, version: str, obj: Any) -> Any:
    """A stored object as ``version`` shows it (a copy)."""
    if not isinstance(obj, dict) or version == HUB:
        return obj
    out = copy.deepcopy(obj)
    if out.get("apiVersion") == f"{GROUP}/{HUB}":
        out["apiVersion"] = f"{GROUP}/{version}"
    if version == "v1beta1" and plural in _LISTS:
        fn = _device_from_hub if plural == "resourceslices" else _request_from_hub
        _map_list(out, _LISTS[plural], fn)
    return out


# ---- what the beta releases know (their default feature gates) ---------------------------
# A schema is a dict of known keys -> the schema of their value; ANY accepts anything below;
# {"*": s} is a map with free keys whose values follow s; [s] a list of s.

ANY: Final = "any"
_SELECTORS: Final = [{"cel": {"expression": ANY}}]
_OPAQUE: Final = {"driver": ANY, "parameters": ANY}
_ATTRIBUTE: Final = {"int": ANY, "bool": ANY, "string": ANY, "version": ANY}
_BASIC: Final = {"attributes": {"*": _ATTRIBUTE}, "capacity": {"*": {"value": ANY}}}
_META: Final = ANY


def _slice(device: Obj) -> Obj:
    return {"apiVersion": ANY, "kind": ANY, "metadata": _META, "spec": {
        "driver": ANY, "pool": {"name": ANY, "generation": ANY, "resourceSliceCount": ANY},
        "nodeName": ANY, "nodeSelector": ANY, "allNodes": ANY, "devices": [device]}}


def _claim_spec(request: Obj) -> Obj:
    return {"devices": {"requests": [request],
                        "constraints": [{"requests": ANY, "matchAttribute": ANY}],
                        "config": [{"requests": ANY, "opaque": _OPAQUE}]}}


def _claim_status(*, device_status: bool, admin_access: bool) -> Obj:
    result: Obj = {"request": ANY, "driver": ANY, "pool": ANY, "device": ANY}
    if admin_access:
        result["adminAccess"] = ANY
    status: Obj = {
        "allocation": {"devices": {"results": [result],
                                   "config": [{"source": ANY, "requests": ANY,
                                               "opaque": _OPAQUE}]},
                       "nodeSelector": ANY, "controller": ANY},
        "reservedFor": ANY, "deallocationRequested": ANY}
    if device_status:
        status["devices"] = [{"driver": ANY, "pool": ANY, "device": ANY, "conditions": ANY,
                              "data": ANY, "networkData": ANY}]
    return status


def _schemas(version: str, *, release: int) -> dict[str, Obj]:
    """The known fields of the beta kinds, in ``version``'s shape, on 1.``release``."""
    # 1.32: adminAccess (DRAAdminAccess) and status.devices (DRAResourceClaimDeviceStatus)
    # are alpha, off; 1.33 turns both on. Prioritized lists, taints and partitionable
    # devices are alpha in 1.33 (off); consumable capacity and binding conditions are later.
    admin = release >= 33
    exact: Obj = {"deviceClassName": ANY, "selectors": _SELECTORS, "allocationMode": ANY,
                  "count": ANY}
    if admin:
        exact["adminAccess"] = ANY
    if version == "v1beta1":
        device: Obj = {"name": ANY, "basic": _BASIC}
        request: Obj = {"name": ANY, **exact}
    else:
        device = {"name": ANY, **_BASIC}
        request = {"name": ANY, "exactly": exact}
    spec = _claim_spec(request)
    meta: Obj = {"apiVersion": ANY, "kind": ANY, "metadata": _META}
    return {
        "resourceslices": _slice(device),
        "resourceclaims": {**meta, "spec": spec,
                           "status": _claim_status(device_status=admin, admin_access=admin)},
        "resourceclaimtemplates": {**meta, "spec": {"metadata": ANY, "spec": spec}},
        "deviceclasses": {**meta, "spec": {"selectors": _SELECTORS,
                                           "config": [{"opaque": _OPAQUE}]}},
    }


def prune(obj: Any, schema: Any, path: str, dropped: list[str]) -> Any:
    """``obj`` without the fields ``schema`` does not know; their paths go to ``dropped``."""
    if schema == ANY:
        return obj
    if isinstance(schema, list):
        if not isinstance(obj, list):
            return obj  # a type error is the validator's to report
        return [prune(item, schema[0], f"{path}[{i}]", dropped) for i, item in enumerate(obj)]
    if not isinstance(obj, dict):
        return obj
    if set(schema) == {"*"}:
        return {k: prune(v, schema["*"], f"{path}[{k}]", dropped) for k, v in obj.items()}
    out = {}
    for key, value in obj.items():
        where = f"{path}.{key}" if path else key
        if key in schema:
            out[key] = prune(value, schema[key], where, dropped)
        else:
            dropped.append(where)
    return out


# ---- the modes -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Served:
    """One mode: the versions served, most preferred first, and what the server reports."""

    mode: str
    versions: tuple[str, ...]
    kubernetes: tuple[str, str]
    schemas: dict[str, dict[str, Obj]] = field(default_factory=dict)
    """version -> plural -> known fields; a version without one knows every field."""

    def serves(self, group: str, version: str, plural: str) -> bool:
        if group != GROUP:
            return True
        if version not in self.versions:
            return False
        return version == HUB or plural in BETA_KINDS

    def view(self, group: str, version: str) -> str | None:
        """The version a request to ``group/version`` is answered in, when not the hub's."""
        return version if group == GROUP and version != HUB else None

    def schema(self, version: str, plural: str) -> Obj | None:
        return self.schemas.get(version, {}).get(plural)


MODES: Final[dict[str, Served]] = {
    "v1": Served("v1", ("v1", "v1beta2", "v1beta1"), ("1", "37")),
    "v1beta2": Served("v1beta2", ("v1beta2", "v1beta1"), ("1", "33"),
                      {v: _schemas(v, release=33) for v in ("v1beta2", "v1beta1")}),
    "v1beta1": Served("v1beta1", ("v1beta1",), ("1", "32"),
                      {"v1beta1": _schemas("v1beta1", release=32)}),
}


def served(mode: str) -> Served:
    try:
        return MODES[mode]
    except KeyError:
        raise ValueError(f"resource API mode {mode!r}: expected one of "
                         f"{', '.join(MODES)}") from None
