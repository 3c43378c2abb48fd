"""Property-based: whatever the kubelet asks and the API server answers, the real
``gpudra node`` gives each claim its own answer, fails no call for one bad claim, touches
nothing outside its roots and leaves the hardware as it was once the claims are gone
(issue 27, "How").

Hypothesis generates kubelet calls of one to four claims. Each claim's identifiers are
valid or hostile (path-shaped, huge, not a Kubernetes name); the API server (the stand-in
in hostile mode: every body served exactly as generated) answers with a valid claim for
full GPUs, MIG devices made on demand or shares, with configs for this driver or another,
admin access or not, and then maybe breaks one field of it (a wrong type, a path, a huge
string, nesting a thousand deep), or sends something that is no claim at all. After each
call every claim is unprepared; then the CDI root is empty, the simulated GPUs are back to
their baseline and a sentinel tree outside the daemon's roots is unchanged.

Derandomized (the same examples every run) and bounded, for CI.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudra.api.claims import ClaimRef
from gpudra.testing.fakeapi.hostile import PATH_SHAPED_UIDS, deep_json, with_raw
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator, raw_claim, raw_claims
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import DRIVER, Daemon, claim_object
from tests.trust.conftest import cdi_specs, hardware, tree

GV = "resource.nvidia.com/v1beta1"
EXAMPLES = 60
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

DEVICES = ["gpu-0", "gpu-1", "gpu-4", "gpu-0-mig-1g10gb-19-6", "gpu-0-mig-1g10gb-19-5",
           "gpu-1-mig-3g40gb-9-4", "gpu-1-mig-7g80gb-0-0", "gpu-42", "gpu-0-shared"]
LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
"""Any valid device or request name: the daemon must refuse unknown ones cleanly."""
MARKER = "\x00DEEP\x00"
"""Stands for a value nested a thousand deep, spliced into the body as text."""

HOSTILE_TEXT = st.one_of(st.sampled_from(PATH_SHAPED_UIDS), st.text(max_size=30),
                         st.just("x" * 100_000))
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), HOSTILE_TEXT,
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                         max_size=3),
    st.just(MARKER))

# Where a generated claim is broken: every field the daemon reads, and their parents.
_D = ("status", "allocation", "devices")
BREAK_AT = [
    ("metadata",), ("metadata", "uid"), ("metadata", "name"), ("metadata", "namespace"),
    ("status",), ("status", "allocation"), _D, (*_D, "results"), (*_D, "results", 0),
    (*_D, "results", 0, "device"), (*_D, "results", 0, "pool"), (*_D, "results", 0, "request"),
    (*_D, "results", 0, "driver"), (*_D, "results", 0, "adminAccess"),
    (*_D, "results", 0, "shareID"), (*_D, "results", 0, "consumedCapacity"), (*_D, "config"),
    (*_D, "config", 0), (*_D, "config", 0, "opaque"), (*_D, "config", 0, "opaque", "parameters"),
    (*_D, "config", 0, "requests"), ("status", "reservedFor"),
]


def _gpu_config(sharing: dict[str, Any] | None, mode: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"apiVersion": GV, "kind": "GpuConfig"}
    if sharing is not None:
        params["sharing"] = sharing
    if mode is not None:
        params["computeMode"] = mode
    return params


SHARING = st.one_of(
    st.none(),
    st.builds(lambda i: {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": i}},
              st.sampled_from(["Default", "Short", "Medium", "Long", "Sometimes"])),
    st.builds(lambda p: {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": p}},
              st.integers(-5, 120)))
PARAMETERS = st.one_of(
    st.builds(_gpu_config, SHARING, st.sampled_from([None, "Default", "ExclusiveProcess",
                                                    "Prohibited", "Sideways"])),
    st.builds(lambda s: {"apiVersion": GV, "kind": "MigDeviceConfig", **(
        {"sharing": s} if s else {})}, SHARING),
    st.dictionaries(st.text(max_size=8), HOSTILE, max_size=3))
CONFIG = st.builds(
    lambda driver, params, requests: {"source": "FromClaim", "requests": requests,
                                      "opaque": {"driver": driver, "parameters": params}},
    st.sampled_from([DRIVER, DRIVER, "other.example.com"]), PARAMETERS,
    st.sampled_from([[], ["gpu"], ["nope"]]))


@st.composite
def api_answer(draw: st.DrawFn, ref: ClaimRef) -> bytes | dict[str, Any] | None:
    """What the API server answers for ``ref``: None (not found), a claim (maybe broken in
    one field), or bytes that are no claim."""
    # Weighted towards claims the daemon prepares: those are what can touch hardware.
    kind = ["claim"] * 6 + ["broken"] * 2 + ["missing", "bytes"]
    kind = kind[draw(st.integers(0, len(kind) - 1))]
    if kind == "missing":
        return None
    if kind == "bytes":
        return draw(st.sampled_from([b"", b"null", b"[]", b"{", b"\"claim\"",
                                     deep_json(5000).encode(), b"{\"a\":" + b"1" * 200_000 +
                                     b"}"]))
    devices = draw(st.lists(st.sampled_from(DEVICES) | st.sampled_from(DEVICES[:4]) | LABEL,
                            min_size=1, max_size=2, unique=True))
    obj = claim_object(ref.name or "x", devices=devices, namespace=ref.namespace or "default",
                       request=draw(st.sampled_from(["gpu", "gpu/small"]) | LABEL),
                       node="node-b" if draw(st.integers(0, 5)) == 5 else "node-a",
                       configs=draw(st.lists(CONFIG, max_size=2)),
                       admin_access=draw(st.integers(0, 4)) == 4)
    obj["metadata"]["uid"] = ref.uid
    if kind == "claim":
        return obj
    path = draw(st.sampled_from(BREAK_AT))
    value = draw(HOSTILE)
    target: Any = obj
    for part in path[:-1]:
        if not _has(target, part):
            return obj  # that part is absent in this claim: served unbroken
        target = target[part]
    if isinstance(target, list) and isinstance(path[-1], int) and path[-1] >= len(target):
        return obj
    if value == MARKER:
        return with_raw(obj, path, deep_json(1000, kind="{"))
    target[path[-1]] = value
    return obj


def _has(container: Any, part: str | int) -> bool:
    if isinstance(container, dict):
        return part in container
    return isinstance(container, list) and isinstance(part, int) and part < len(container)


@st.composite
def kubelet_call(draw: st.DrawFn) -> list[tuple[ClaimRef, bytes | dict[str, Any] | None]]:
    """One to four claims; one in four has a hostile namespace, name or uid (or all)."""
    claims = []
    for i in range(draw(st.integers(1, 4))):
        fields = {"namespace": "default", "name": f"claim-{i}",
                  "uid": str(uuid.UUID(int=draw(st.integers(0, 2**128 - 1)), version=4))}
        if draw(st.integers(0, 3)) == 0:
            for key in draw(st.sampled_from([["namespace"], ["name"], ["uid"],
                                             ["namespace", "name", "uid"]])):
                fields[key] = draw(HOSTILE_TEXT)
        ref = ClaimRef(**fields)
        claims.append((ref, draw(api_answer(ref))))
    return claims


def _check_call(api: FakeApiServer, node: Daemon, sentinel: Path, baseline: list[Any],
                calls: list[tuple[ClaimRef, bytes | dict[str, Any] | None]],
                before: dict[str, Any]) -> None:
    for ref, answer in calls:
        if answer is not None and ref.name and "/" not in ref.name:
            api.serve_as_given("ResourceClaim", ref.name, answer, namespace=ref.namespace
                               if ref.namespace and "/" not in ref.namespace else "default")
    refs = list({ref.uid: ref for ref, _ in calls}.values())
    try:
        asyncio.run(_prepare_then_unprepare(node, refs))
    finally:
        api.forget_as_given()
    assert node.process is not None and node.process.poll() is None, "the daemon died"
    assert cdi_specs(node) == []
    assert hardware(node) == baseline
    assert tree(sentinel) == before
    assert sim_daemons(sentinel) == []


async def _prepare_then_unprepare(node: Daemon, refs: list[ClaimRef]) -> None:
    async with await KubeletEmulator.discover(node.registrar) as kubelet:
        # A per-claim answer for every claim, and no INTERNAL: the emulator raises on
        # either, as the kubelet fails the call.
        prepared = await kubelet.prepare(refs)
        for ref in refs:
            entry = prepared[ref.uid]
            if entry["error"]:
                assert entry["devices"] == []
                assert not any(s.endswith(f"_{ref.uid}.json") for s in cdi_specs(node)), entry
                for word in ("Traceback", "RecursionError", "AttributeError", "TypeError",
                             "KeyError"):
                    assert word not in entry["error"], entry
        unprepared = await kubelet.unprepare(refs)
        for ref in refs:
            if not prepared[ref.uid]["error"]:
                assert unprepared[ref.uid]["error"] == "", (ref, unprepared[ref.uid])


@SETTINGS
@given(calls=kubelet_call())
def test_any_claims_get_their_own_answers_and_leave_nothing_behind(
        api: FakeApiServer, node: Daemon, sentinel: Path, calls: Any) -> None:
    _check_call(api, node, sentinel, _baseline(node), calls, _sentinel_tree(sentinel))


RAW_FIELD = st.one_of(st.text(max_size=20), st.sampled_from(PATH_SHAPED_UIDS),
                      st.just(str(uuid.UUID(int=7, version=4))))


@SETTINGS
@given(fields=st.lists(st.tuples(RAW_FIELD, RAW_FIELD, RAW_FIELD), min_size=1, max_size=4),
       unknown=st.sampled_from([b"", b"\x22\x03abc", b"\x08\x01"]))
def test_any_request_fields_get_an_answer_per_claim(node: Daemon, sentinel: Path,
                                                    fields: Any, unknown: bytes) -> None:
    before, baseline = _sentinel_tree(sentinel), _baseline(node)
    request = raw_claims([raw_claim(ns, uid, name) for ns, uid, name in fields], extra=unknown)

    async def send() -> None:
        async with await KubeletEmulator.discover(node.registrar) as kubelet:
            for method in ("NodePrepareResources", "NodeUnprepareResources"):
                answer = await kubelet.send_raw(method, request)
                assert answer.code == grpc.StatusCode.OK, answer
                assert set(answer.claims) == {uid for _, uid, _ in fields}, answer

    asyncio.run(send())
    assert cdi_specs(node) == []
    assert hardware(node) == baseline
    assert tree(sentinel) == before


_BASELINES: dict[str, Any] = {}


def _baseline(node: Daemon) -> list[Any]:
    """The GPUs as the daemon found them: taken once, before the first example."""
    return _BASELINES.setdefault(f"hw:{node.base}", hardware(node))


def _sentinel_tree(sentinel: Path) -> dict[str, Any]:
    return _BASELINES.setdefault(f"tree:{sentinel}", tree(sentinel))

