"""What survives a checkpoint the daemon cannot read, as plain values (pure parsing).

The CDI specs the daemon wrote, the hardware as NVML shows it, the API server's claims
allocated to this node and the slices the daemon published: read by
:mod:`gpudra.driver.recovery_step`, parsed and checked here (everything from the API server
or a file is untrusted), turned into checkpoint records by :mod:`gpudra.driver.recovery`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpudra.api.identifiers import (
    IdentifierError,
    check_device,
    check_request,
    check_share_id,
    check_uid,
    claim_problems,
    shown,
)
from gpudra.driver.cdi import spec_kind
from gpudra.driver.nvml import MigInstance

MAX_SPEC_BYTES: Final = 1 << 20
"""A claim's spec is a few KiB; anything larger is not one the daemon wrote."""
_DEVICE: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,250}[a-z0-9])?")
"""A spec's device name after the claim UID: a device, or ``<device>-<shareID>``."""


@dataclass(frozen=True)
class SpecDevice:
    name: str
    """As the spec names it, without the ``<claimUID>-`` prefix (a share's keeps its ID)."""
    env: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClaimSpec:
    """A CDI spec this driver wrote for one claim."""

    uid: str
    devices: tuple[SpecDevice, ...]


@dataclass(frozen=True)
class GpuHardware:
    """One GPU as NVML shows it now; ``compute_mode`` ``None`` when it cannot be read."""

    uuid: str
    minor: int
    compute_mode: int | None
    mig_enabled: bool
    mig_instances: tuple[MigInstance, ...] = ()


@dataclass(frozen=True)
class AllocatedResult:
    """One device of an API claim's allocation, for this driver and pool."""

    request: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ApiClaim:
    uid: str
    namespace: str
    name: str
    results: tuple[AllocatedResult, ...]
    reserved: bool


@dataclass(frozen=True)
class Survivors:
    specs: Sequence[ClaimSpec]
    gpus: Sequence[GpuHardware]
    claims: Mapping[str, ApiClaim] | None
    """``None``: the API server could not be asked (specs alone then name the claims)."""
    published_mig: Mapping[str, bool]
    """GPU UUID → whether the daemon's slices showed it as dynamic MIG; a GPU not there
    (slices not read, or not published yet) is unknown."""
    mps_daemons: frozenset[str] = frozenset()
    """MPS control daemons that have a directory: claim UIDs and ``shared-<GPU>`` keys."""


def parse_spec(uid: str, content: bytes, driver: str) -> ClaimSpec | str:
    """A claim's spec file → its devices; a string saying why it is not one of ours."""
    try:
        check_uid(uid, "claim UID in the file name")
    except IdentifierError as exc:
        return str(exc)
    if len(content) > MAX_SPEC_BYTES:
        return f"larger than {MAX_SPEC_BYTES} bytes"
    try:
        doc = json.loads(content)
    except (ValueError, RecursionError):
        return "not valid JSON"
    if not isinstance(doc, dict) or doc.get("kind") != spec_kind(driver):
        return f"kind is not {spec_kind(driver)}"
    raw_devices = doc.get("devices")
    if not isinstance(raw_devices, list) or not raw_devices:
        return "no devices"
    devices = []
    prefix = f"{uid}-"
    for raw in raw_devices:
        name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(name, str) or not name.startswith(prefix) or len(name) > 300:
            return f"device name {shown(name)} does not start with the claim UID"
        if not _DEVICE.fullmatch(name.removeprefix(prefix)):
            return f"device name {shown(name)} is not a device this driver names"
        edits = raw.get("containerEdits")
        env = edits.get("env") if isinstance(edits, dict) else None
        devices.append(SpecDevice(name.removeprefix(prefix), tuple(
            e for e in env if isinstance(e, str)) if isinstance(env, list) else ()))
    return ClaimSpec(uid, tuple(devices))


def api_claims(objects: Iterable[object], *, driver: str, pool: str,
               node: str) -> dict[str, ApiClaim]:
    """ResourceClaims allocated to ``node`` with devices of ``driver`` in ``pool``, by UID.

    The objects come from the API server, so every field is checked before use; a claim
    that does not parse is left out (its spec, if any, still names its devices)."""
    found: dict[str, ApiClaim] = {}
    for obj in objects:
        claim = _api_claim(obj, driver=driver, pool=pool, node=node)
        if claim is not None:
            found[claim.uid] = claim
    return found


def _api_claim(obj: object, *, driver: str, pool: str, node: str) -> ApiClaim | None:
    if not isinstance(obj, dict):
        return None
    meta, status = obj.get("metadata"), obj.get("status")
    if not isinstance(meta, dict) or not isinstance(status, dict):
        return None
    uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
    if claim_problems(namespace, name, uid):
        return None  # names that reach log lines and records: their Kubernetes form only
    allocation = status.get("allocation")
    if not isinstance(allocation, dict) or not _selects(allocation.get("nodeSelector"), node):
        return None
    devices = allocation.get("devices")
    raw_results = devices.get("results") if isinstance(devices, dict) else None
    if not isinstance(raw_results, list):
        return None
    results = []
    for raw in raw_results:
        if not isinstance(raw, dict) or raw.get("driver") != driver or raw.get("pool") != pool:
            continue
        share_id = raw.get("shareID")
        try:
            request, device = check_request(raw.get("request")), check_device(raw.get("device"))
            share_id = None if share_id is None else check_share_id(share_id)
        except IdentifierError:
            continue
        results.append(AllocatedResult(
            request=request, device=device, admin_access=raw.get("adminAccess") is True,
            share_id=share_id,
            consumed=_quantities(raw.get("consumedCapacity"))))
    if not results:
        return None
    reserved = status.get("reservedFor")
    return ApiClaim(str(uid), str(namespace), str(name), tuple(results),
                    reserved=isinstance(reserved, list) and bool(reserved))


def _selects(selector: object, node: str) -> bool:
    """Whether a node selector picks ``node`` by its name (how allocations pin a node)."""
    if not isinstance(selector, dict):
        return False
    terms = selector.get("nodeSelectorTerms")
    for term in terms if isinstance(terms, list) else []:
        fields = term.get("matchFields") if isinstance(term, dict) else None
        for match in fields if isinstance(fields, list) else []:
            if (isinstance(match, dict) and match.get("key") == "metadata.name"
                    and match.get("operator") == "In"
                    and isinstance(match.get("values"), list) and node in match["values"]):
                return True
    return False


def _quantities(raw: object) -> dict[str, int]:
    """Plain integer quantities (``"33"``, ``"20Gi"``); others are left out."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    out: dict[str, int] = {}
    for key, value in (raw.items() if isinstance(raw, dict) else ()):
        text = str(value)
        unit = units.get(text[-2:], 1)
        digits = text[:-2] if unit != 1 else text
        if isinstance(key, str) and digits.isdigit() and len(digits) <= 18:
            out[key] = int(digits) * unit
    return out


def published_mig(slices: Iterable[object], *, driver: str, node: str) -> dict[str, bool]:
    """GPU UUID → whether this node published it as dynamic MIG (its MIG devices consume
    counters; an admin's static MIG devices do not), for every GPU its slices show."""
    found: dict[str, bool] = {}
    for obj in slices:
        spec = obj.get("spec") if isinstance(obj, dict) else None
        if not isinstance(spec, dict) or spec.get("driver") != driver \
                or spec.get("nodeName") != node:
            continue
        devices = spec.get("devices")
        for device in devices if isinstance(devices, list) else []:
            attrs = device.get("attributes") if isinstance(device, dict) else None
            if not isinstance(attrs, dict):
                continue
            kind = _string(attrs.get("type"))
            gpu = _string(attrs.get("parentUUID" if kind == "mig" else "uuid"))
            if gpu is None:
                continue
            dynamic = kind == "mig" and bool(device.get("consumesCounters"))
            found[gpu] = found.get(gpu, False) or dynamic
    return found


def _string(attribute: object) -> str | None:
    value = attribute.get("string") if isinstance(attribute, dict) else None
    return value if isinstance(value, str) else None
