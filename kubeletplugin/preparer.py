"""NodePrepareResources / NodeUnprepareResources: fetch, decode, and hand claims to the driver.

API calls happen before any lock and concurrently for all claims of a call; the device
work itself runs in a worker thread (NVML and file I/O block) under the driver's own
serialisation. A claim the checkpoint already holds as prepared is answered from the
checkpoint without asking the API server, so a kubelet restart during an API outage works.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import structlog

from gpudra.api.claims import ClaimRef
from gpudra.driver import metrics
from gpudra.driver.claims import ClaimError, ClaimToPrepare
from gpudra.driver.device_state import DeviceState
from gpudra.kubeletplugin.claim_decoding import decode_claim
from gpudra.kubeletplugin.interfaces import PrepareOutcome

if TYPE_CHECKING:  # the Kubernetes client is a heavy import; only the daemon needs it
    from gpudra.kubeletplugin.claim_fetcher import ClaimFetcher

log = structlog.get_logger(__name__)


class Preparer:
    """Implements :class:`gpudra.kubeletplugin.interfaces.ClaimPreparer`."""

    def __init__(self, *, driver: str, fetcher: ClaimFetcher, state: DeviceState) -> None:
        self._driver = driver
        self._fetcher = fetcher
        self._state = state

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        outcomes: dict[str, PrepareOutcome] = {}
        # Already prepared (a kubelet retry or restart): answer from the checkpoint, no GET.
        known = self._state.prepared_many(ref.uid for ref in claims)
        for uid, prepared in known.items():
            outcomes[uid] = PrepareOutcome(devices=prepared)
        to_fetch = [ref for ref in claims if ref.uid not in known]
        fetched = await self._fetcher.fetch_all([(r.namespace, r.name, r.uid) for r in to_fetch])
        decoded: list[tuple[ClaimRef, ClaimToPrepare]] = []
        for ref, raw in zip(to_fetch, fetched, strict=True):
            try:
                if isinstance(raw, ClaimError):
                    raise raw
                decoded.append((ref, decode_claim(raw, namespace=ref.namespace, name=ref.name,
                                                  uid=ref.uid, driver=self._driver)))
            except ClaimError as exc:
                outcomes[ref.uid] = self._failed(ref, exc)
        if not decoded:
            return outcomes
        started = time.perf_counter()
        results = await asyncio.to_thread(self._state.prepare_many, [c for _, c in decoded])
        each = (time.perf_counter() - started) / len(decoded)
        for ref, claim in decoded:
            result = results[claim.uid]
            if isinstance(result, ClaimError):
                outcomes[ref.uid] = self._failed(ref, result)
                continue
            metrics.PREPARE_SECONDS.observe(each)
            log.info("prepared", claim=str(ref), devices=[d.device for d in result])
            outcomes[ref.uid] = PrepareOutcome(devices=result)
        return outcomes

    @staticmethod
    def _failed(ref: ClaimRef, exc: ClaimError) -> PrepareOutcome:
        log.warning("prepare failed", claim=str(ref), error=str(exc))
        metrics.PREPARE_ERRORS.labels(metrics.error_reason(str(exc))).inc()
        return PrepareOutcome(error=str(exc))

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        errors: dict[str, str | None] = {}
        for ref in claims:
            claim_log = log.bind(claim=str(ref))
            started = time.perf_counter()
            try:
                await asyncio.to_thread(self._state.unprepare, ref.uid)
            except ClaimError as exc:
                claim_log.warning("unprepare failed", error=str(exc))
                metrics.UNPREPARE_ERRORS.labels(metrics.error_reason(str(exc))).inc()
                errors[ref.uid] = str(exc)
            else:
                metrics.UNPREPARE_SECONDS.observe(time.perf_counter() - started)
                claim_log.info("unprepared")
                errors[ref.uid] = None
        return errors
