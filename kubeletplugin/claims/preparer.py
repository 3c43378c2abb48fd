"""NodePrepareResources / NodeUnprepareResources: fetch, decode, and hand claims to the driver.

A call runs in one of the DRA socket's call threads
(:mod:`gpudra.kubeletplugin.serving.server`) from start to answer: the checkpoint lookup,
decoding and the device work (NVML, files, the durable commit) happen right there, under the
driver's own serialisation; calls on different GPUs run in parallel. The claims' GETs are
sent from the event loop, all at once (one hop there and back per call), before any lock. A
claim the checkpoint already holds as prepared is answered from the checkpoint without
asking the API server, so a kubelet restart during an API outage works. Logging is the gRPC
layer's (:mod:`gpudra.kubeletplugin.serving.dra_service`): a line per call and a warning per
failed claim; here only metrics, and an observer's failure. What succeeded goes to the
observers (claim status, idle events) on the event loop, a burst of calls' news at a time;
what must be known before the answer (who a claim is for, the usage samples' labels) goes to
an ``at_once`` observer in the call's own thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from gpudra.api.claims import ClaimRef, PreparedDevice
from gpudra.api.identifiers import claim_problems, shown
from gpudra.driver import metrics
from gpudra.driver.claims import ClaimError, ClaimToPrepare
from gpudra.driver.device_state import DeviceState
from gpudra.kubeletplugin.claims.claim_decoding import decode_claim
from gpudra.kubeletplugin.serving.interfaces import PrepareOutcome, always

if TYPE_CHECKING:  # the Kubernetes client is a heavy import; only the daemon needs it
    from gpudra.kubeletplugin.claims.claim_fetcher import ClaimFetcher

log = structlog.get_logger(__name__)

NEWS_DELAY = 0.05
"""Seconds the observers' news of a call waits before the event loop takes it, so that
one wake-up of the loop carries a burst of calls' news, not one per call: a wake-up costs
the loop CPU, and it competes for the GIL with the call that caused it while that call
builds its answer. Its observers wait for longer anyway (claim status is
written half a second after a change)."""

FETCH_MARGIN = 5.0
"""Seconds a call waits for its GETs beyond the fetcher's own timeout before it gives up
on the event loop (a loop that stopped answering must not hold a call thread for ever)."""


class PrepareObserver(Protocol):
    """Told about each claim after its prepare or unprepare succeeded (claim status,
    events), on the event loop; must only queue work, never block or raise."""

    def prepared(self, ref: ClaimRef, devices: Sequence[PreparedDevice],
                 claim: ClaimToPrepare | None) -> None: ...

    def unprepared(self, ref: ClaimRef) -> None: ...


class Preparer:
    """Implements :class:`gpudra.kubeletplugin.serving.interfaces.ClaimPreparer`."""

    def __init__(self, *, driver: str, fetcher: ClaimFetcher, state: DeviceState,
                 loop: asyncio.AbstractEventLoop,
                 observer: PrepareObserver | None = None,
                 at_once: PrepareObserver | None = None) -> None:
        """``observer`` is told on the event loop, up to :data:`NEWS_DELAY` later;
        ``at_once`` in the call's thread before the answer, so it must be thread-safe and
        cheap (the usage sampler's pod labels: a claim sampled in that delay would be
        exported without its pod, then again with it)."""
        self._driver = driver
        self._fetcher = fetcher
        self._state = state
        self._loop = loop
        self._observer = observer
        self._at_once = at_once
        self._fetch_wait = fetcher.timeout + FETCH_MARGIN
        self._news: list[Callable[[], None]] = []  # for the observers, in call order
        self._news_lock = threading.Lock()

    def prepare(self, claims: Sequence[ClaimRef], *,
                wanted: Callable[[], bool] = always) -> Mapping[str, PrepareOutcome]:
        outcomes: dict[str, PrepareOutcome] = {}
        told: list[tuple[ClaimRef, Sequence[PreparedDevice], ClaimToPrepare | None]] = []
        claims, refused = _checked(claims)
        for uid, problem in refused.items():
            outcomes[uid] = self._failed(ClaimError(problem))
        # Already prepared (a kubelet retry or restart): answer from the checkpoint, no GET.
        known = self._state.prepared_many(ref.uid for ref in claims)
        for ref in claims:
            if ref.uid in known:
                outcomes[ref.uid] = PrepareOutcome(devices=known[ref.uid])
                told.append((ref, known[ref.uid], None))
        to_fetch = [ref for ref in claims if ref.uid not in known]
        fetched = self._fetch(to_fetch) if to_fetch else []
        decoded: list[tuple[ClaimRef, ClaimToPrepare]] = []
        for ref, raw in zip(to_fetch, fetched, strict=True):
            try:
                if isinstance(raw, ClaimError):
                    raise raw
                decoded.append((ref, decode_claim(raw, namespace=ref.namespace, name=ref.name,
                                                  uid=ref.uid, driver=self._driver)))
            except ClaimError as exc:
                outcomes[ref.uid] = self._failed(exc)
        if decoded and not wanted():
            # The kubelet gave up (deadline) while the GETs ran: it may have unprepared the
            # claim since, and would never undo what we prepared now.
            for ref, _ in decoded:
                outcomes[ref.uid] = self._failed(ClaimError(
                    f"claim {ref}: the kubelet stopped waiting before the device work "
                    "began; nothing was prepared"))
            decoded = []
        if decoded:
            started = time.perf_counter()
            results = self._state.prepare_many([c for _, c in decoded])
            each = (time.perf_counter() - started) / len(decoded)
            for ref, claim in decoded:
                result = results[claim.uid]
                if isinstance(result, ClaimError):
                    outcomes[ref.uid] = self._failed(result)
                    continue
                metrics.PREPARE_SECONDS.observe(each)
                outcomes[ref.uid] = PrepareOutcome(devices=result)
                told.append((ref, result, claim))
        if told and self._at_once is not None:
            self._tell_now(self._tell_prepared, self._at_once, told)
        if told and self._observer is not None:
            self._on_loop(functools.partial(self._tell_prepared, self._observer), told)
        return outcomes

    def _fetch(self, refs: Sequence[ClaimRef]) -> list[Mapping[str, Any] | ClaimError]:
        """The claims' GETs, on the event loop, all at once; each slot holds the claim or
        the error for it."""
        from gpudra.kubeletplugin.claims.claim_fetcher import ClaimFetchError

        keys = [(r.namespace, r.name, r.uid) for r in refs]
        fetching = self._fetcher.fetch_all(keys)
        try:
            future = asyncio.run_coroutine_threadsafe(fetching, self._loop)
        except RuntimeError:  # the loop is closed: the daemon is exiting
            fetching.close()
            return [ClaimFetchError(f"claim {ref}: the node daemon is stopping")
                    for ref in refs]
        try:
            return future.result(self._fetch_wait)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return [ClaimFetchError(f"claim {ref}: no answer from the API server within "
                                    f"{self._fetch_wait:g} s") for ref in refs]
        except concurrent.futures.CancelledError:  # the loop cancelled it: it is stopping
            return [ClaimFetchError(f"claim {ref}: the node daemon is stopping")
                    for ref in refs]

    def _on_loop(self, tell: Any, items: Any) -> None:
        """Hand the observers one call's claims on the event loop, with the news of the
        other calls of the next :data:`NEWS_DELAY` seconds."""
        with self._news_lock:
            self._news.append(functools.partial(tell, items))
            if len(self._news) > 1:
                return  # the loop is to take it with the first
        # A closed loop: the daemon is exiting, nothing is written any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.call_later, NEWS_DELAY,
                                            self._tell_news)

    def _tell_news(self) -> None:
        with self._news_lock:
            news, self._news = self._news, []
        for tell in news:
            try:
                tell()
            except Exception:  # a bug in an observer: the other news still goes out
                log.exception("a prepare observer failed")

    @staticmethod
    def _tell_now(tell: Any, observer: PrepareObserver, items: Any) -> None:
        try:
            tell(observer, items)
        except Exception:  # a bug in the observer: the call's answer stands
            log.exception("a prepare observer failed")

    @staticmethod
    def _tell_prepared(
        observer: PrepareObserver,
        told: Sequence[tuple[ClaimRef, Sequence[PreparedDevice], ClaimToPrepare | None]],
    ) -> None:
        for ref, devices, claim in told:
            observer.prepared(ref, devices, claim)

    @staticmethod
    def _tell_unprepared(observer: PrepareObserver, refs: Sequence[ClaimRef]) -> None:
        for ref in refs:
            observer.unprepared(ref)

    @staticmethod
    def _failed(exc: ClaimError) -> PrepareOutcome:
        metrics.PREPARE_ERRORS.labels(metrics.error_reason(str(exc))).inc()
        return PrepareOutcome(error=str(exc))

    def unprepare(self, claims: Sequence[ClaimRef], *,
                  wanted: Callable[[], bool] = always) -> Mapping[str, str | None]:
        # Done even when the kubelet gave up: unpreparing is what it asked for in the end.
        claims, refused = _checked(claims)
        errors: dict[str, str | None] = dict(refused)
        if not claims:
            return errors
        started = time.perf_counter()
        results = self._state.unprepare_many([r.uid for r in claims])
        each = (time.perf_counter() - started) / len(claims)
        done: list[ClaimRef] = []
        for ref in claims:
            error = results[ref.uid]
            if error is not None:
                metrics.UNPREPARE_ERRORS.labels(metrics.error_reason(str(error))).inc()
                errors[ref.uid] = str(error)
                continue
            metrics.UNPREPARE_SECONDS.observe(each)
            errors[ref.uid] = None
            done.append(ref)
        if done and self._at_once is not None:
            self._tell_now(self._tell_unprepared, self._at_once, done)
        if done and self._observer is not None:
            self._on_loop(functools.partial(self._tell_unprepared, self._observer), done)
        return errors


def _checked(claims: Sequence[ClaimRef]) -> tuple[Sequence[ClaimRef], dict[str, str]]:
    """The kubelet's claims whose namespace, name and uid have their Kubernetes form, and
    the error of each other one, by uid. The kubelet passes what the API server told it
    unchecked, and the uid names the claim's MPS directory and CDI spec: a claim whose
    identifiers are wrong is refused before the checkpoint, the API server or the disk
    hear of it."""
    refused: dict[str, str] = {}
    for ref in claims:
        problems = claim_problems(ref.namespace, ref.name, ref.uid)
        if problems:
            refused[ref.uid] = (f"claim {shown(ref.namespace)}/{shown(ref.name)}:"
                                f"{shown(ref.uid)}: {'; '.join(problems)}")
    if not refused:
        return claims, refused
    return [ref for ref in claims if ref.uid not in refused], refused
