"""Kubernetes Events on the pod when its claim's GPUs go idle ("GPU gpu-3 idle for 30m: ...").

Events are for people, so they are few: one per claim per idle episode (the claim must be
active again before it earns another), and at most ``cap`` per ``window`` seconds for the
whole node, so a node full of idle claims cannot flood the API server. Best effort: one
try each, failures counted in ``gpudra_events_total{outcome}`` and logged once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import structlog
from prometheus_client import Counter

from gpudra.api.claims import ClaimRef, PreparedDevice
from gpudra.driver.claims import ClaimToPrepare
from gpudra.driver.usage import IdleTransition
from gpudra.kube.errors import ApiCallError
from gpudra.kube.log_once import FailureLog
from gpudra.kube.raw_api import EVENTS, RESOURCE_CLAIMS, RawApi

log = structlog.get_logger(__name__)

EVENTS_SENT = Counter(
    "gpudra_events", "Kubernetes Events the daemon emitted, by reason and outcome",
    ["reason", "outcome"])
"""Outcomes: ``ok``, ``failed`` (the API call failed), ``capped`` (over the node's cap)."""

IDLE_REASON: Final = "GPUClaimIdle"
HELD_REASON: Final = "HardwareHeldUnknown"
MAX_NOTE: Final = 1024
"""events.k8s.io/v1 refuses a longer ``note``."""

Obj = dict[str, Any]


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{int(seconds)}s"
    if minutes < 120:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes % 60 else f"{minutes // 60}h"


def idle_message(transition: IdleTransition) -> str:
    """``GPU gpu-3 idle for 30m: 0-2 % SM, 1.2 GiB used`` (with an en dash)."""
    names = sorted({d.device for d in transition.devices})
    what = f"GPU {names[0]}" if len(names) == 1 else f"GPUs {', '.join(names)}"
    since = transition.since if transition.since is not None else transition.at
    return (f"{what} idle for {_duration(transition.at - since)}: "
            f"{transition.sm_low:.0f}\u2013{transition.sm_high:.0f} % SM, "
            f"{_gib(transition.memory_used_bytes)} used")


class IdleEvents:
    """Turns the idle tracker's transitions into Events; call :meth:`idle_changed` on the
    loop's thread, run :meth:`run` as a task."""

    def __init__(self, api: RawApi, *, driver: str, node: str, cap: int = 20,
                 window: float = 600.0, clock: Callable[[], float] = time.time) -> None:
        self._api = api
        self._driver = driver
        self._node = node
        self._cap = cap
        self._window = window
        self._clock = clock
        self._episodes: set[str] = set()  # claims whose current idle episode has its event
        self._sent: deque[float] = deque()
        self._queue: asyncio.Queue[IdleTransition] = asyncio.Queue()
        self._failures = FailureLog(log)

    def idle_changed(self, transition: IdleTransition) -> None:
        if not transition.idle:
            self._episodes.discard(transition.claim_uid)  # the next episode earns an event
            return
        if transition.claim_uid in self._episodes:
            return
        self._episodes.add(transition.claim_uid)
        self._queue.put_nowait(transition)

    def prepared(self, ref: ClaimRef, devices: Sequence[PreparedDevice],
                 claim: ClaimToPrepare | None) -> None:
        """Nothing to do: a claim earns an event by going idle."""

    def unprepared(self, ref: ClaimRef) -> None:
        self._episodes.discard(ref.uid)

    async def run(self) -> None:
        while True:
            transition = await self._queue.get()
            if not self._admit():
                EVENTS_SENT.labels(IDLE_REASON, "capped").inc()
                log.info("idle event over the node's cap", claim=transition.claim)
                continue
            try:
                await self._api.create(EVENTS, await self.event(transition),
                                       namespace=transition.namespace)
            except ApiCallError as exc:
                EVENTS_SENT.labels(IDLE_REASON, "failed").inc()
                self._failures.failed((exc.status, exc.reason), "event not recorded",
                                      claim=transition.claim, error=str(exc))
            else:
                EVENTS_SENT.labels(IDLE_REASON, "ok").inc()
                self._failures.recovered("events are recorded again")

    def _admit(self) -> bool:
        """The node-wide cap: at most ``cap`` events in any ``window`` seconds."""
        now = self._clock()
        while self._sent and now - self._sent[0] >= self._window:
            self._sent.popleft()
        if len(self._sent) >= self._cap:
            return False
        self._sent.append(now)
        return True

    async def event(self, transition: IdleTransition) -> Obj:
        """The events.k8s.io/v1 Event: regarding the claim's pod, related to the claim."""
        claim: Obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                      "namespace": transition.namespace, "name": transition.claim,
                      "uid": transition.claim_uid}
        pod = await self._pod(transition)
        stamp = datetime.fromtimestamp(self._clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"generateName": f"{transition.claim}.",
                         "namespace": transition.namespace},
            "eventTime": stamp,
            "reportingController": self._driver,
            "reportingInstance": self._node,
            "action": "Sampling",
            "reason": IDLE_REASON,
            "type": "Normal",
            "note": idle_message(transition),
            "regarding": pod or claim,
            **({"related": claim} if pod else {}),
        }

    async def _pod(self, transition: IdleTransition) -> Obj | None:
        """The claim's first reserving pod (from ``status.reservedFor``), else a pod name the
        sampler knew; None when neither is known (the Event is then about the claim)."""
        try:
            raw = await self._api.get(RESOURCE_CLAIMS, transition.claim,
                                      namespace=transition.namespace)
        except ApiCallError:
            raw = {}
        status = raw.get("status") or {}
        for ref in status.get("reservedFor") or []:
            if isinstance(ref, dict) and ref.get("resource") == "pods" and ref.get("name"):
                return {"apiVersion": "v1", "kind": "Pod", "namespace": transition.namespace,
                        "name": ref["name"], **({"uid": ref["uid"]} if ref.get("uid") else {})}
        if transition.pods:
            return {"apiVersion": "v1", "kind": "Pod", "namespace": transition.namespace,
                    "name": transition.pods[0]}
        return None


def held_event(*, driver: str, node: str, held: Sequence[str], taint: str, now: float) -> Obj:
    """The Warning Event about the Node when hardware is held for claims it cannot name
    (its checkpoint could not be read): what, why, and that nothing is destroyed."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    note = (f"{len(held)} held for claims this node cannot name (its checkpoint could not "
            f"be read): tainted {taint} NoSchedule, never destroyed automatically; see the "
            "README, Operations. " + "; ".join(held))
    if len(note) > MAX_NOTE:
        note = note[:MAX_NOTE - 3] + "..."
    return {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": "default"},
        "eventTime": stamp,
        "reportingController": driver,
        "reportingInstance": node,
        "action": "Recovering",
        "reason": HELD_REASON,
        "type": "Warning",
        "note": note,
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def send_held_event(api: RawApi, event: Obj) -> None:
    """One try: the log line and the metric say it too, so a failure is logged, not fatal."""
    try:
        await api.create(EVENTS, event, namespace="default")
    except ApiCallError as exc:
        EVENTS_SENT.labels(HELD_REASON, "failed").inc()
        log.warning("held-hardware event not recorded", error=str(exc))
    else:
        EVENTS_SENT.labels(HELD_REASON, "ok").inc()
