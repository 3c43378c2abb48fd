"""Kubernetes Events on the Node when a GPU needs recovery (a reset, a reboot, a drain) and
when the driver reports it healthy again: the taint stops new work, the metric counts it,
and the Event tells the person who has to do the reset.

One Event per change of a GPU's needed recovery (never a repeat while it waits), sent in
order from one task; best effort: a failed call is counted in ``gpudra_events`` and logged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import structlog

from gpudra.kube.errors import ApiCallError
from gpudra.kube.raw_api import EVENTS, RawApi
from gpudra.kubeletplugin.cluster.events import EVENTS_SENT, MAX_NOTE

log = structlog.get_logger(__name__)

REQUIRED_REASON: Final = "GPURecoveryRequired"
RECOVERED_REASON: Final = "GPURecovered"

Obj = dict[str, Any]


def recovery_event(*, driver: str, node: str, gpu: str, action: str | None, was: str | None,
                   effect: str, now: float) -> Obj:
    """``action`` set: a Warning that ``gpu`` needs it; None: a Normal Event that the driver
    reports the GPU healthy again (it needed ``was``)."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if action is not None:
        note = (f"GPU {gpu} needs {action} (its driver's recovery action or NVIDIA's XID "
                f"catalog): tainted gpu.nvidia.com/recovery={action}:{effect} until the "
                "driver reports it healthy again")
    else:
        note = f"GPU {gpu} is healthy again (it needed {was}): its recovery taint is removed"
    return {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": "default"},
        "eventTime": stamp,
        "reportingController": driver,
        "reportingInstance": node,
        "action": "Recovering" if action is not None else "Recovered",
        "reason": REQUIRED_REASON if action is not None else RECOVERED_REASON,
        "type": "Warning" if action is not None else "Normal",
        "note": note[:MAX_NOTE],
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


class RecoveryEvents:
    """Call :meth:`update` (on the loop) with the GPUs waiting for recovery each time the
    health state changes; run :meth:`run` as a task."""

    def __init__(self, api: RawApi, *, driver: str, node: str, effect: str,
                 clock: Callable[[], float] = time.time) -> None:
        self._api = api
        self._driver = driver
        self._node = node
        self._effect = effect
        self._clock = clock
        self._known: dict[str, str] = {}
        self._queue: asyncio.Queue[Obj] = asyncio.Queue()

    def update(self, recovering: Mapping[str, str]) -> None:
        now = self._clock()
        for gpu, was in self._known.items():
            if gpu not in recovering:
                self._queue.put_nowait(self._event(gpu, None, was, now))
        for gpu, action in recovering.items():
            if self._known.get(gpu) != action:
                self._queue.put_nowait(self._event(gpu, action, self._known.get(gpu), now))
        self._known = dict(recovering)

    def _event(self, gpu: str, action: str | None, was: str | None, now: float) -> Obj:
        return recovery_event(driver=self._driver, node=self._node, gpu=gpu, action=action,
                              was=was, effect=self._effect, now=now)

    async def run(self) -> None:
        while True:
            event = await self._queue.get()
            reason = event["reason"]
            try:
                await self._api.create(EVENTS, event, namespace="default")
            except ApiCallError as exc:
                EVENTS_SENT.labels(reason, "failed").inc()
                log.warning("GPU recovery event not recorded", error=str(exc))
            else:
                EVENTS_SENT.labels(reason, "ok").inc()
