"""The kubelet's DRA services (v1 and v1beta1) in front of a :class:`ClaimPreparer`.

Both API versions share :class:`ClaimCalls`, which turns the request's claims into
:class:`ClaimRef` s, calls the preparer once, guarantees an entry per requested claim and
logs; the two servicers only build their version's messages. The kubelet treats an RPC
error as "nothing happened" and retries the whole batch, so everything that concerns one
claim is reported in that claim's entry and only a broken preparer fails the call.

The servicers are synchronous: each call runs from request to answer in one of the DRA
server's pool threads (:mod:`.server`).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc
import structlog

from gpudra.api.claims import ClaimRef, PreparedDevice
from gpudra.api.identifiers import shown
from gpudra.api.proto import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from gpudra.kubeletplugin.serving.grpc_types import CallContext, RpcServer
from gpudra.kubeletplugin.serving.interfaces import ClaimPreparer, PrepareOutcome

log = structlog.get_logger(__name__)

_Result = TypeVar("_Result")


class WireClaim(Protocol):
    """The ``Claim`` message of either API version."""

    namespace: str
    name: str
    uid: str


def base_request_names(names: Iterable[str]) -> list[str]:
    """``"req/sub"`` -> ``"req"``, in first-seen order, each once.

    The kubelet matches a container's claim by base request (``resourceclaim.BaseRequestRef``
    in the Go helper); this is the only place subrequests are stripped.
    """
    return list(dict.fromkeys(name.split("/", 1)[0] for name in names))


@dataclass(frozen=True)
class _Batch:
    """One request's claims: every uid once in request order, what the driver sees, and
    the errors decided before the driver runs."""

    claims: tuple[ClaimRef, ...]
    for_driver: tuple[ClaimRef, ...]
    rejected: Mapping[str, str]  # uid -> error reported for that claim

    @classmethod
    def of(cls, wire_claims: Iterable[WireClaim]) -> _Batch:
        claims: dict[str, ClaimRef] = {}
        valid: dict[str, ClaimRef] = {}
        rejected: dict[str, str] = {}
        for wire in wire_claims:
            ref = ClaimRef(wire.namespace, wire.name, wire.uid)
            if ref.uid in claims:
                # The kubelet never sends a uid twice; when it happens the call is malformed,
                # so the claim is refused and nothing is prepared for it, whichever of its
                # entries came first (a valid one must not slip through beside a bad one).
                valid.pop(ref.uid, None)
                rejected[ref.uid] = f"claim {shown_ref(claims[ref.uid])} listed twice in one " \
                                    "request"
                continue
            claims[ref.uid] = ref
            if not (ref.namespace and ref.name and ref.uid):
                missing = [field for field in ("namespace", "name", "uid")
                           if not getattr(ref, field)]
                rejected[ref.uid] = f"claim {shown_ref(ref)}: {', '.join(missing)} must not " \
                                    "be empty"
            else:
                valid[ref.uid] = ref
        return cls(tuple(claims.values()), tuple(valid.values()), rejected)


class ClaimCalls:
    """Version-neutral prepare/unprepare: request claims in, one result per claim uid out."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer
        self._request_ids = itertools.count(1)

    def prepare(
        self, method: str, wire_claims: Sequence[WireClaim], context: CallContext
    ) -> dict[str, PrepareOutcome]:
        """Prepare the request's claims; a per-claim problem becomes that claim's error."""
        batch = _Batch.of(wire_claims)
        call = _Call(method, next(self._request_ids), len(wire_claims))
        answered = call.run(batch, context, self._preparer.prepare)
        outcomes: dict[str, PrepareOutcome] = {}
        for ref in batch.claims:
            if ref.uid in batch.rejected:
                outcome = PrepareOutcome(error=batch.rejected[ref.uid])
            else:
                outcome = answered.get(ref.uid) or PrepareOutcome(error=_no_result(ref))
            call.claim_done(ref, outcome.error, [d.device for d in outcome.devices])
            outcomes[ref.uid] = outcome
        call.done("prepared", context)
        return outcomes

    def unprepare(
        self, method: str, wire_claims: Sequence[WireClaim], context: CallContext
    ) -> dict[str, str | None]:
        """Unprepare the request's claims; the result maps uid to an error or None."""
        batch = _Batch.of(wire_claims)
        call = _Call(method, next(self._request_ids), len(wire_claims))
        answered = call.run(batch, context, self._preparer.unprepare)
        errors: dict[str, str | None] = {}
        for ref in batch.claims:
            if ref.uid in batch.rejected:
                error: str | None = batch.rejected[ref.uid]
            elif ref.uid in answered:
                error = answered[ref.uid] or None
            else:
                error = _no_result(ref)
            call.claim_done(ref, error)
            errors[ref.uid] = error
        call.done("unprepared", context)
        return errors


class _Call:
    """One gRPC call: runs the preparer, turns its exceptions into INTERNAL, logs.

    One info line per call, naming its claims and their devices (written once the call
    ended: see :meth:`done`), plus a warning per failed claim; each line starts with the
    call's ``method`` and ``request_id``. The fields are passed per line, not bound:
    binding copies a logger for what is usually one line.
    """

    def __init__(self, method: str, request_id: int, claim_count: int) -> None:
        self._request_id = request_id
        self._method = method
        self._claim_count = claim_count
        self._started = time.monotonic()
        self._failed = 0
        self._done: dict[str, list[str]] = {}

    def run(
        self,
        batch: _Batch,
        context: CallContext,
        handler: Callable[..., Mapping[str, _Result]],
    ) -> Mapping[str, _Result]:
        refs = list(batch.for_driver)
        try:
            answered = handler(refs, wanted=context.is_active) if refs else {}
        except Exception as exc:
            log.exception("driver failed", method=self._method, request_id=self._request_id,
                          claims=[shown_ref(ref) for ref in refs], duration_s=self._elapsed())
            context.abort(
                grpc.StatusCode.INTERNAL,
                f"{self._method}: internal error in the driver while handling "
                f"{len(refs)} claim(s): {type(exc).__name__}: {exc}",
            )
            raise AssertionError("unreachable: context.abort raises") from exc
        if not context.is_active():
            # The kubelet gave up (its 45 s deadline) or the server stopped: the work is
            # done and stays done; the kubelet's retry finds it in the checkpoint.
            log.warning("the kubelet stopped waiting before the answer", method=self._method,
                        request_id=self._request_id, claims=[str(ref) for ref in refs],
                        duration_s=self._elapsed())
        unknown = sorted(set(answered) - {ref.uid for ref in refs})
        if unknown:
            # The kubelet fails the whole call on a uid it did not ask for: drop them.
            log.warning("driver answered for claims not in the request", method=self._method,
                        request_id=self._request_id, uids=unknown)
        return answered

    def claim_done(self, ref: ClaimRef, error: str | None, devices: Sequence[str] = ()) -> None:
        if error:
            self._failed += 1
            log.warning("claim failed", method=self._method, request_id=self._request_id,
                        claim=shown_ref(ref), error=error)
        else:
            self._done[str(ref)] = list(devices)

    def done(self, what: str, context: CallContext) -> None:
        """The call's line; ``what`` names the successful claims' field (``prepared``: claim
        → its devices; ``unprepared``: the claims).

        Written when the call has ended, not before its answer: the kubelet need not wait
        for the line to be rendered and written (bench/RESULTS.md, eighth session). The
        fields, the duration too, are taken now.
        """
        done: dict[str, list[str]] | list[str] = \
            self._done if what == "prepared" else list(self._done)
        line = functools.partial(
            log.info, "call done", method=self._method, request_id=self._request_id,
            claims=self._claim_count, failed=self._failed, duration_s=self._elapsed(),
            **{what: done})
        if not context.add_callback(line):  # it ended already (cancelled): write it now
            line()

    def _elapsed(self) -> float:
        return round(time.monotonic() - self._started, 6)


def _no_result(ref: ClaimRef) -> str:
    return f"claim {shown_ref(ref)}: the driver returned no result for it"


SHOWN_REF_MAX = 400
"""Characters of ``namespace/name:uid`` a log line shows as they are: a valid one has at
most 63 + 253 + 36 + 2."""


def shown_ref(ref: ClaimRef) -> str:
    """How a log line or message names a claim the kubelet sent: ``namespace/name:uid``,
    or, when that is over-long or not printable (a request nobody validated yet), each
    part quoted, escaped and cut short."""
    text = str(ref)
    if len(text) <= SHOWN_REF_MAX and text.isprintable():
        return text
    return f"{shown(ref.namespace)}/{shown(ref.name)}:{shown(ref.uid)}"


class DraV1Servicer(dra_v1_pb2_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``."""

    def __init__(self, calls: ClaimCalls) -> None:
        self._calls = calls

    def add_to_server(self, server: RpcServer) -> None:
        """Register on a (synchronous) ``grpc.Server``."""
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(self, server)  # type: ignore[no-untyped-call]

    def NodePrepareResources(
        self, request: dra_v1_pb2.NodePrepareResourcesRequest, context: CallContext
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        outcomes = self._calls.prepare("v1.NodePrepareResources", request.claims, context)
        return dra_v1_pb2.NodePrepareResourcesResponse(claims={
            uid: dra_v1_pb2.NodePrepareResourceResponse(
                devices=[_v1_device(device) for device in outcome.devices] if not outcome.error
                else [],
                error=outcome.error or "",
            )
            for uid, outcome in outcomes.items()
        })

    def NodeUnprepareResources(
        self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: CallContext
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        errors = self._calls.unprepare("v1.NodeUnprepareResources", request.claims, context)
        return dra_v1_pb2.NodeUnprepareResourcesResponse(claims={
            uid: dra_v1_pb2.NodeUnprepareResourceResponse(error=error or "")
            for uid, error in errors.items()
        })


class DraV1beta1Servicer(dra_v1beta1_pb2_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (kubelets 1.32-1.33; no share_id)."""

    def __init__(self, calls: ClaimCalls) -> None:
        self._calls = calls

    def add_to_server(self, server: RpcServer) -> None:
        """Register on a (synchronous) ``grpc.Server``."""
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
            self, server)

    def NodePrepareResources(
        self, request: dra_v1beta1_pb2.NodePrepareResourcesRequest, context: CallContext
    ) -> dra_v1beta1_pb2.NodePrepareResourcesResponse:
        outcomes = self._calls.prepare(
            "v1beta1.NodePrepareResources", request.claims, context)
        return dra_v1beta1_pb2.NodePrepareResourcesResponse(claims={
            uid: dra_v1beta1_pb2.NodePrepareResourceResponse(
                devices=[_v1beta1_device(device) for device in outcome.devices]
                if not outcome.error else [],
                error=outcome.error or "",
            )
            for uid, outcome in outcomes.items()
        })

    def NodeUnprepareResources(
        self, request: dra_v1beta1_pb2.NodeUnprepareResourcesRequest, context: CallContext
    ) -> dra_v1beta1_pb2.NodeUnprepareResourcesResponse:
        errors = self._calls.unprepare(
            "v1beta1.NodeUnprepareResources", request.claims, context)
        return dra_v1beta1_pb2.NodeUnprepareResourcesResponse(claims={
            uid: dra_v1beta1_pb2.NodeUnprepareResourceResponse(error=error or "")
            for uid, error in errors.items()
        })


def _v1_device(device: PreparedDevice) -> dra_v1_pb2.Device:
    message = dra_v1_pb2.Device(
        request_names=base_request_names(device.request_names),
        pool_name=device.pool,
        device_name=device.device,
        cdi_device_ids=device.cdi_device_ids,
    )
    if device.share_id:  # optional field: leave it unset (not "") when there is no share
        message.share_id = device.share_id
    return message


def _v1beta1_device(device: PreparedDevice) -> dra_v1beta1_pb2.Device:
    return dra_v1beta1_pb2.Device(
        request_names=base_request_names(device.request_names),
        pool_name=device.pool,
        device_name=device.device,
        cdi_device_ids=device.cdi_device_ids,
    )
