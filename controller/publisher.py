"""The node daemon's ResourceSlice publisher: keeps its node's pool in the API server equal
to the devices it was last given.

Two tasks share one event loop:

* the reflector (``slice_reflector``) LISTs and WATCHes the node's own slices
  (``spec.driver=<driver>,spec.nodeName=<node>``) into a cache of raw objects;
* the reconciler turns the latest ``update()`` into slices (``slices.build_slices``),
  checks them locally (``slice_validation.ensure_valid``), compares them with the cache
  semantically and writes only the difference (``slice_diff.plan_sync``): deletes, then
  updates (PUT with the cached resourceVersion), then creates.

A reconcile runs once ``update()`` or watch events that changed the cache have been quiet
for ``resync_delay`` (so a burst of events costs one round), and after a failed round's
back-off. A round whose cache already matches writes nothing, so a steady state costs no API
calls beyond the long-lived watch. When the kubelet wipes the node's slices at start-up, the
DELETED events trigger a round that re-creates them, within a second (the Go controller
waits 30 s). Before re-creating slices that disappeared, the Node is looked up again: if it
was deleted, garbage collection took the slices and they must not come back with a dead
owner.

Failures never escape ``run()``: conflicts re-read the slice and retry, 429 waits at least
its Retry-After, 5xx and connection trouble retry with capped exponential back-off. A slice
the server rejects (400/422) or the local validator rejects is not retried hot: the former
waits for a changed ``update()`` or the back-off cap, the latter for a changed ``update()``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import structlog

from gpudra.controller.slice_diff import (
    Obj,
    SyncPlan,
    Update,
    plan_sync,
    replacement,
    slice_difference,
    slices_equal,
    vanished,
)
from gpudra.controller.slice_features import describe, supported
from gpudra.controller.slice_reflector import SliceReflector, version_of
from gpudra.controller.slice_validation import SliceValidationError, ensure_valid
from gpudra.controller.slices import OwnerRef, build_slices
from gpudra.driver.devices import NodeDevices
from gpudra.driver.faults import fail_point
from gpudra.driver.metrics import PUBLISHED_DEVICES, PUBLISHED_SLICES
from gpudra.kube.backoff import Backoff
from gpudra.kube.errors import ApiCallError, BadAnswer, Conflict, Invalid, NotFound
from gpudra.kube.log_once import FailureLog
from gpudra.kube.objects import object_name
from gpudra.kube.raw_api import NODES, RESOURCE_SLICES, RawApi
from gpudra.kube.session import ApiSession

log = structlog.get_logger(__name__)

MAX_DEBOUNCE_DELAYS: Final = 5
"""A stream of events delays a round by at most this many ``resync_delay``s."""


@dataclass(frozen=True)
class _Pause:
    """How long to wait before the next round after a failed one."""

    seconds: float | None
    """None: until a new desired state arrives."""
    until_update: bool = False
    """A new desired state ends the pause early; watch events do not."""


def _fingerprint(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class SlicePublisher:
    """Publishes one node's devices as the ResourceSlices of its pool (named after the node).

    ``update()`` gives the desired state (non-blocking, at any time, from the event loop's
    thread); ``run()`` publishes until cancelled. ``synced`` is set once the API server has
    held exactly the desired slices.
    """

    def __init__(self, session: ApiSession, *, driver: str, node_name: str,
                 resync_delay: float = 0.2, backoff: Backoff | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 request_timeout: float = 10.0) -> None:
        self._api = RawApi(session, timeout=request_timeout)
        self._driver = driver
        self._node = node_name
        self._resync_delay = resync_delay
        self._backoff = backoff or Backoff()
        self._clock = clock  # every wait (debounce, pauses) is measured and slept on these
        self._sleep = sleep
        self._reflector = SliceReflector(
            self._api, field_selector=f"spec.driver={driver},spec.nodeName={node_name}",
            on_change=self._changed, backoff=self._backoff.fresh(), clock=clock, sleep=sleep)
        self._failures = FailureLog(log.bind(node=node_name, driver=driver))
        self.synced = asyncio.Event()
        self._dirty = asyncio.Event()  # something may differ: run a round
        self._updated = asyncio.Event()  # a new desired state arrived
        self._devices: NodeDevices | None = None
        self._checked: tuple[NodeDevices, bool] | None = None  # last validation verdict
        self._owner: OwnerRef | None = None
        # Features the server's resource.k8s.io version lacks: left out of what is built,
        # with one warning per set of features it cost (slice_features).
        self._lacks: frozenset[str] = frozenset()
        self._left_out_said: frozenset[str] = frozenset()
        self._version_said = False
        self._published: frozenset[str] = frozenset()
        self._generation = 0  # the highest pool generation we have written
        self._resume: tuple[NodeDevices, int] | None = None  # a generation move under way
        # name → (desired, stored spec) fingerprints of slices the server keeps in its own
        # form (e.g. it drops fields of a disabled feature gate): rewriting them is futile.
        self._adopted: dict[str, tuple[str, str]] = {}
        self._writes: Counter[str] = Counter()
        self._written_version: int | None = None  # the newest resourceVersion we wrote
        self._waiting = False  # the loop waits for something to change
        self._rounds = 0
        self._errors = 0
        self._last_error: str | None = None
        self._last_sync: float | None = None
        self._slices = 0
        self._device_count = 0

    # ---- public --------------------------------------------------------------------------

    def update(self, devices: NodeDevices) -> None:
        """Set the desired state; the next round publishes it. Equal devices change nothing."""
        if devices == self._devices:
            return
        self._devices = devices
        self._resume = None
        self._updated.set()
        self._dirty.set()

    async def run(self) -> None:
        """Publish until cancelled; API errors are retried, never raised."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._reflector.run(), name=f"slice-reflector:{self._node}")
            tasks.create_task(self._reconcile_forever(), name=f"slice-publisher:{self._node}")

    def stats(self) -> dict[str, Any]:
        """Counters for status pages and tests."""
        return {
            "writes": {verb: self._writes[verb] for verb in ("create", "update", "delete")},
            "rounds": self._rounds,
            "errors": self._errors,
            "last_error": self._last_error,
            "last_sync_age": (None if self._last_sync is None
                              else self._clock() - self._last_sync),
            "generation": self._generation,
            "slices": self._slices,
            "devices": self._device_count,
            "synced": self.synced.is_set(),
            "settled": self.settled(),
            "resource_version": self._reflector.resource_version,  # how far the watch is
            "lists": self._reflector.lists,
            "watches": self._reflector.watches,
        }

    def settled(self) -> bool:
        """True when nothing is left to do: the watch has brought back our last write, no
        change waits for a round, and no round, debounce or pause is under way.

        A round that the echo of our own writes would cause (a write too many) has run by
        the time this is true, so tests and status pages can tell "done" from "not yet".
        """
        echoed = (self._written_version is None
                  or self._reflector.seen(self._written_version))
        return echoed and self._waiting and not self._dirty.is_set()

    # ---- the loop ------------------------------------------------------------------------

    def _changed(self) -> None:
        self._dirty.set()

    async def _reconcile_forever(self) -> None:
        await self._reflector.listed.wait()
        while True:
            self._waiting = True
            try:
                await self._dirty.wait()
            finally:
                self._waiting = False
            await self._quiet()
            self._updated.clear()
            pause = await self._round()
            fail_point("publisher:after-round")  # tests: a bug that kills the task
            if pause is None:
                continue
            if pause.until_update:
                await self._until_update(pause.seconds)
            elif pause.seconds:
                await self._sleep(pause.seconds)
            self._dirty.set()

    async def _until_update(self, seconds: float | None) -> None:
        """Wait for a new desired state, but no longer than ``seconds`` (None: no limit)."""
        updated = asyncio.ensure_future(self._updated.wait())
        waiters: set[asyncio.Future[Any]] = {updated}
        if seconds is not None:
            waiters.add(asyncio.ensure_future(self._sleep(seconds)))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    async def _quiet(self) -> None:
        """Debounce: wait until nothing changed for ``resync_delay`` (a wipe or an update
        arrives as a burst of events; answer it once), but no longer than a few delays."""
        deadline = self._clock() + MAX_DEBOUNCE_DELAYS * self._resync_delay
        while True:
            self._dirty.clear()
            await self._sleep(self._resync_delay)
            if not self._dirty.is_set() or self._clock() >= deadline:
                break
        self._dirty.clear()  # the round reads the latest state, whatever woke us

    async def _round(self) -> _Pause | None:
        """One reconcile; None when the server now holds the desired slices."""
        devices = self._devices
        if devices is None:
            return None
        self._rounds += 1
        try:
            return await self._sync(devices)
        except ApiCallError as error:
            return self._api_failed(error)
        except Exception as exc:  # a bug; keep the daemon alive, but say so loudly
            self._errors += 1
            self._last_error = f"internal error: {exc!r}"
            if self._failures.failed(("bug", type(exc).__name__, str(exc)),
                                     "slice publisher failed unexpectedly", error=repr(exc)):
                log.exception("slice publisher traceback")
            return _Pause(self._backoff.at_cap(), until_update=True)

    async def _sync(self, devices: NodeDevices) -> _Pause | None:
        version = await self._api.resource_version()
        if version.lacks != self._lacks or not self._version_said:
            self._lacks, self._checked = version.lacks, None  # what is built changes: check it
            self._version_said = True
            log.info("publishing ResourceSlices in resource.k8s.io", version=version.version,
                     served=list(version.served) or None, node=self._node,
                     left_out=sorted(version.lacks) or None)
        if self._owner is None:
            self._owner = await self._lookup_owner()
        if not self._valid(devices):
            return _Pause(None, until_update=True)
        plan = self._plan(devices)
        lost = vanished(plan, self._published)
        if lost:
            # Someone deleted our slices: the kubelet wipes them when it starts, and garbage
            # collection does when the Node goes. Only the first should bring them back.
            log.info("published slices disappeared; checking the node and re-creating them",
                     node=self._node, slices=len(lost))
            owner = await self._lookup_owner()
            if owner != self._owner:
                self._owner = owner
                plan = self._plan(devices)
        await self._execute(plan, devices)
        self._succeeded(plan)
        return None

    # ---- pieces of a round ---------------------------------------------------------------

    async def _lookup_owner(self) -> OwnerRef:
        try:
            node = await self._api.get(NODES, self._node)
        except NotFound:
            self._owner = None  # look again next round, and publish nothing till then
            raise
        uid = (node.get("metadata") or {}).get("uid")
        if not isinstance(uid, str) or not uid:
            raise BadAnswer("get", NODES.plural, self._node, status=200, reason="NoUID",
                            message="the Node object has no metadata.uid")
        return OwnerRef(name=self._node, uid=uid)

    def _build(self, devices: NodeDevices, generation: int) -> list[dict[str, Any]]:
        devices, left_out = supported(devices, self._lacks)
        if left_out and left_out.features != self._left_out_said:
            self._left_out_said = left_out.features
            log.warning("the API server's resource.k8s.io version lacks features some "
                        "devices need; publishing without them", node=self._node,
                        driver=self._driver, left_out=describe(left_out),
                        lacks=sorted(self._lacks))
        return build_slices(devices, driver=self._driver, node_name=self._node,
                            generation=generation, owner=self._owner)

    def _valid(self, devices: NodeDevices) -> bool:
        """Validate each new desired state once; an invalid one is our bug, said loudly."""
        if self._checked is not None and self._checked[0] is devices:
            return self._checked[1]
        try:
            ensure_valid(self._build(devices, max(self._generation, 1)))
            verdict = True
        except (SliceValidationError, ValueError) as exc:
            verdict = False
            self._errors += 1
            self._last_error = f"invalid slices (not published): {exc}"
            log.error("BUG: the slices built for this node fail validation; publishing "
                      "nothing until the devices change", node=self._node,
                      driver=self._driver, error=str(exc))
        self._checked = (devices, verdict)
        return verdict

    def _plan(self, devices: NodeDevices) -> SyncPlan:
        resume = None
        if self._resume is not None and self._resume[0] is devices:
            resume = self._resume[1]
        return plan_sync(lambda generation: self._build(devices, generation),
                         self._reflector.cache, same=self._same, floor=self._generation,
                         resume=resume)

    def _same(self, desired: Obj, actual: Obj) -> bool:
        if slices_equal(desired, actual):
            return True
        adopted = self._adopted.get(object_name(desired))
        return adopted == (_fingerprint(desired), _fingerprint(actual.get("spec")))

    async def _execute(self, plan: SyncPlan, devices: NodeDevices) -> None:
        if plan.bumped:
            self._resume = (devices, plan.generation)
        for obj in plan.deletes:
            await self._delete(obj)
        for change in plan.updates:
            await self._update(change)
        for obj in plan.creates:
            await self._create(obj)

    async def _delete(self, obj: Obj) -> None:
        name, meta = object_name(obj), obj.get("metadata") or {}
        preconditions = {key: meta[key] for key in ("uid", "resourceVersion") if meta.get(key)}
        try:
            await self._api.delete(RESOURCE_SLICES, name, preconditions=preconditions)
            self._writes["delete"] += 1
            log.info("deleted obsolete slice", slice=name)
        except NotFound:
            pass  # already gone is what we wanted
        except Conflict:  # changed since we looked: look again
            await self._refresh(name)
            raise
        self._reflector.forget(name)
        self._adopted.pop(name, None)

    async def _update(self, change: Update) -> None:
        try:
            stored = await self._api.replace(RESOURCE_SLICES, change.name,
                                             replacement(change.actual, change.desired))
        except (NotFound, Conflict):  # changed or deleted under us: look again
            await self._refresh(change.name)
            raise
        self._writes["update"] += 1
        log.debug("updated slice", slice=change.name, reason=change.reason)
        self._stored(change.desired, stored)

    async def _create(self, obj: dict[str, Any]) -> None:
        try:
            stored = await self._api.create(RESOURCE_SLICES, obj)
        except Conflict:  # exists already (an earlier attempt that timed out?)
            await self._refresh(object_name(obj))
            raise
        self._writes["create"] += 1
        self._stored(obj, stored)

    def _stored(self, desired: Obj, stored: dict[str, Any]) -> None:
        """Record a write's answer; adopt the server's form if it differs from ours."""
        self._reflector.remember(stored)
        version = version_of(stored)
        if version is not None:
            self._written_version = max(version, self._written_version or version)
        name = object_name(desired)
        difference = slice_difference(desired, stored)
        if difference is None:
            self._adopted.pop(name, None)
            return
        key = (_fingerprint(desired), _fingerprint(stored.get("spec")))
        if self._adopted.get(name) != key:
            log.warning("the API server stores this slice differently from what was sent "
                        "(a disabled feature gate dropping fields?); keeping its form",
                        slice=name, field=difference)
        self._adopted[name] = key

    async def _refresh(self, name: str) -> None:
        """Re-read one slice into the cache after a conflict."""
        try:
            self._reflector.remember(await self._api.get(RESOURCE_SLICES, name))
        except NotFound:
            self._reflector.forget(name)
        except ApiCallError:
            pass  # the watch will bring the current state; the round retries anyway

    def _succeeded(self, plan: SyncPlan) -> None:
        self._backoff.reset()
        self._resume = None
        self._published = frozenset(object_name(obj) for obj in plan.desired)
        self._generation = max(self._generation, plan.generation)
        self._slices, self._device_count = len(plan.desired), plan.devices
        self._last_sync = self._clock()
        PUBLISHED_SLICES.set(self._slices)
        PUBLISHED_DEVICES.set(self._device_count)
        self._failures.recovered("publishing slices works again", node=self._node)
        if plan.writes:
            log.info("published slices", node=self._node, generation=plan.generation,
                     slices=self._slices, devices=self._device_count,
                     created=len(plan.creates), updated=len(plan.updates),
                     deleted=len(plan.deletes))
        self.synced.set()

    def _api_failed(self, error: ApiCallError) -> _Pause:
        self._errors += 1
        self._last_error = str(error)
        fields = {"verb": error.verb, "resource": error.resource, "slice": error.name,
                  "status": error.status, "reason": error.reason, "message": error.message}
        if error.verb in ("create", "update") and isinstance(error, Invalid):
            # Retrying the same object cannot help; wait for new devices or the cap.
            self._failures.failed(("rejected", error.name, error.status, error.message),
                                  "the API server rejected a slice; retrying only after the "
                                  "devices change or the back-off cap", **fields)
            return _Pause(self._backoff.at_cap(), until_update=True)
        if error.resource == NODES.plural and isinstance(error, NotFound):
            self._failures.failed(("no-node", self._node), "the Node does not exist; "
                                  "publishing nothing until it does", **fields)
        else:
            self._failures.failed((error.verb, error.resource, error.status, error.reason),
                                  "publishing slices failed; retrying", **fields)
        return _Pause(self._backoff.honouring(error.retry_after))
