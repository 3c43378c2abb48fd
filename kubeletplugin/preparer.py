"""NodePrepareResources / NodeUnprepareResources: fetch, decode, and hand claims to the driver.

API calls happen before any lock and concurrently for all claims of a call; the device
work itself runs in a worker thread (NVML and file I/O block) under the driver's own
serialisation, one thread hop per call. A claim the checkpoint already holds as prepared is
answered from the checkpoint without asking the API server, so a kubelet restart during an
API outage works. Logging is the gRPC layer's (:mod:`.dra_service`): a line per call and a
warning per failed claim; here only metrics.

The hop goes to :class:`DeviceThreads`, not ``asyncio.to_thread``: measured in the daemon,
the default executor's futures, locks and context copy cost the loop ~0.1 ms per call.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from gpudra.api.claims import ClaimRef, PreparedDevice
from gpudra.driver import metrics
from gpudra.driver.claims import ClaimError, ClaimToPrepare
from gpudra.driver.device_state import DeviceState
from gpudra.kubeletplugin.claim_decoding import decode_claim
from gpudra.kubeletplugin.device_threads import DeviceThreads
from gpudra.kubeletplugin.interfaces import PrepareOutcome

if TYPE_CHECKING:  # the Kubernetes client is a heavy import; only the daemon needs it
    from gpudra.kubeletplugin.claim_fetcher import ClaimFetcher


class PrepareObserver(Protocol):
    """Told about each claim after its prepare or unprepare succeeded (claim status,
    events); must only queue work, never block or raise."""

    def prepared(self, ref: ClaimRef, devices: Sequence[PreparedDevice],
                 claim: ClaimToPrepare | None) -> None: ...

    def unprepared(self, ref: ClaimRef) -> None: ...


class Preparer:
    """Implements :class:`gpudra.kubeletplugin.interfaces.ClaimPreparer`."""

    def __init__(self, *, driver: str, fetcher: ClaimFetcher, state: DeviceState,
                 observer: PrepareObserver | None = None,
                 threads: DeviceThreads | None = None) -> None:
        self._threads = threads or DeviceThreads()
        self._driver = driver
        self._fetcher = fetcher
        self._state = state
        self._observer = observer

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        outcomes: dict[str, PrepareOutcome] = {}
        # Already prepared (a kubelet retry or restart): answer from the checkpoint, no GET.
        known = self._state.prepared_many(ref.uid for ref in claims)
        for uid, prepared in known.items():
            outcomes[uid] = PrepareOutcome(devices=prepared)
        if self._observer is not None:
            for ref in claims:
                if ref.uid in known:
                    self._observer.prepared(ref, known[ref.uid], None)
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
        results = await self._threads.run(self._state.prepare_many, [c for _, c in decoded])
        each = (time.perf_counter() - started) / len(decoded)
        for ref, claim in decoded:
            result = results[claim.uid]
            if isinstance(result, ClaimError):
                outcomes[ref.uid] = self._failed(ref, result)
                continue
            metrics.PREPARE_SECONDS.observe(each)
            outcomes[ref.uid] = PrepareOutcome(devices=result)
            if self._observer is not None:
                self._observer.prepared(ref, result, claim)
        return outcomes

    def close(self, timeout: float | None = None) -> bool:
        """At shutdown, once no call can arrive: wait up to ``timeout`` for device work in
        progress, then end its threads; True if it all ended. Blocks: run it off the loop."""
        return self._threads.close(timeout)

    @staticmethod
    def _failed(ref: ClaimRef, exc: ClaimError) -> PrepareOutcome:
        metrics.PREPARE_ERRORS.labels(metrics.error_reason(str(exc))).inc()
        return PrepareOutcome(error=str(exc))

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        if not claims:
            return {}
        started = time.perf_counter()
        results = await self._threads.run(self._state.unprepare_many, [r.uid for r in claims])
        each = (time.perf_counter() - started) / len(claims)
        errors: dict[str, str | None] = {}
        for ref in claims:
            error = results[ref.uid]
            if error is not None:
                metrics.UNPREPARE_ERRORS.labels(metrics.error_reason(str(error))).inc()
                errors[ref.uid] = str(error)
                continue
            metrics.UNPREPARE_SECONDS.observe(each)
            errors[ref.uid] = None
            if self._observer is not None:
                self._observer.unprepared(ref)
        return errors
