"""The controller's loop: caches of domains, claims, daemon pods and claim templates, a work
queue of domain uids, and the side effects of each domain's plan.

Every change is mapped to the domains it touches (a claim to the domains its channel
configs name, before and after the change; a pod or template to the uid in its label) and
those domains are queued; several workers reconcile different domains at once, never the
same one twice at a time. A reconcile reads only the caches, plans
(:func:`~gpudra.controller.compute_domains.plan.plan_domain`), and writes what differs. A
domain that is gone (or being deleted) is cleaned up: everything labelled with its uid is
deleted, in every namespace, also after a controller restart (the first reconcile after the
caches fill covers every uid found in a label).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import structlog

from gpudra.api import compute_domain as cd
from gpudra.controller.compute_domains import objects
from gpudra.controller.compute_domains.claims import ChannelUse, ClaimKey, read_claim
from gpudra.controller.compute_domains.events import domain_event
from gpudra.controller.compute_domains.informer import Informer, Key, key_of
from gpudra.controller.compute_domains.plan import (
    Condition,
    Observed,
    claim_uses,
    condition_json,
    no_domain_conditions,
    plan_domain,
    same_conditions,
)
from gpudra.controller.compute_domains.pods import DaemonPod, read_pod
from gpudra.controller.compute_domains.resources import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    PODS,
)
from gpudra.controller.compute_domains.status import (
    StatusConflicts,
    apply_claim_devices,
    set_domain_status,
    update_domain_status,
)
from gpudra.kube.backoff import Backoff
from gpudra.kube.errors import ApiCallError, Conflict, NotFound
from gpudra.kube.log_once import FailureLog
from gpudra.kube.objects import Obj
from gpudra.kube.raw_api import RawApi

log = structlog.get_logger(__name__)


def _label(obj: Obj | None) -> str | None:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(cd.LABEL_DOMAIN) if isinstance(labels, dict) else None
    return value if isinstance(value, str) else None


class Controller:
    def __init__(self, api: RawApi, settings: objects.Settings, *, instance: str,
                 workers: int = 4, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._api = api
        self.settings = settings
        self._instance = instance
        self._workers = workers
        self._monotonic = monotonic
        self._wall = wall
        self.domains = Informer(api, COMPUTE_DOMAINS, self._domain_changed)
        self.claims = Informer(api, CLAIMS, self._claim_changed)
        self.pods = Informer(api, PODS, self._pod_changed, namespace=settings.namespace)
        self.templates = Informer(api, CLAIM_TEMPLATES, self._template_changed)
        self._domain_key: dict[str, Key] = {}
        self._claim_domains: dict[Key, set[str]] = {}
        self._claims_of: dict[str, set[Key]] = {}
        self._pods_of: dict[str, set[Key]] = {}
        self._templates_of: dict[str, set[Key]] = {}
        self._queue: dict[str, None] = {}
        self._busy: set[str] = set()
        self._wake = asyncio.Event()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._retry: dict[str, Backoff] = {}
        self._not_ready_since: dict[tuple[str, str], float] = {}
        self._failed_since: dict[str, float] = {}
        self._said_status: dict[str, str] = {}
        self._said_failure: dict[tuple[str, str], str] = {}
        self._failures = FailureLog(log)
        self.reconciles = 0

    # --- indexes: every change queues the domains it touches --------------------------

    def _domain_changed(self, old: Obj | None, new: Obj | None) -> None:
        for obj in (old, new):
            uid = ((obj or {}).get("metadata") or {}).get("uid")
            if isinstance(uid, str):
                if obj is new and new is not None:
                    self._domain_key[uid] = key_of(new)
                elif new is None:
                    self._domain_key.pop(uid, None)
                self.enqueue(uid)

    def _claim_changed(self, old: Obj | None, new: Obj | None) -> None:
        key = key_of(new or old or {})
        before = self._claim_domains.pop(key, set())
        after = {u.domain_uid for u in read_claim(new).uses} if new else set()
        if after:
            self._claim_domains[key] = after
        for uid in before - after:
            self._claims_of.get(uid, set()).discard(key)
        for uid in after:
            self._claims_of.setdefault(uid, set()).add(key)
        if old != new:
            for uid in before | after:
                self.enqueue(uid)

    def _labelled(self, index: dict[str, set[Key]], old: Obj | None, new: Obj | None) -> None:
        key = key_of(new or old or {})
        before, after = _label(old), _label(new)
        if before and before != after:
            index.get(before, set()).discard(key)
        if after:
            index.setdefault(after, set()).add(key)
        for uid in {before, after} - {None}:
            assert uid is not None
            self.enqueue(uid)

    def _pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        self._labelled(self._pods_of, old, new)

    def _template_changed(self, old: Obj | None, new: Obj | None) -> None:
        self._labelled(self._templates_of, old, new)
        if new is None and old is not None:
            # A name freed (a deleted domain's template, or someone else's) may be the one
            # a domain of that namespace is waiting to create (one made again under the
            # same name).
            namespace = key_of(old)[0]
            for uid, key in list(self._domain_key.items()):
                if key[0] == namespace:
                    self.enqueue(uid)

    # --- the queue ---------------------------------------------------------------------

    def enqueue(self, uid: str) -> None:
        self._queue[uid] = None
        self._wake.set()

    def _enqueue_later(self, uid: str, delay: float) -> None:
        timer = self._timers.pop(uid, None)
        if timer is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._timers[uid] = loop.call_later(max(0.0, delay), self._fire, uid)

    def _fire(self, uid: str) -> None:
        self._timers.pop(uid, None)
        self.enqueue(uid)

    async def _next(self) -> str:
        while True:
            for uid in self._queue:
                if uid not in self._busy:
                    del self._queue[uid]
                    self._busy.add(uid)
                    return uid
            self._wake.clear()
            await self._wake.wait()

    async def _worker(self) -> None:
        while True:
            uid = await self._next()
            try:
                await self.reconcile(uid)
                self._retry.pop(uid, None)
            except (ApiCallError, StatusConflicts) as error:
                backoff = self._retry.setdefault(uid, Backoff(initial=0.2, cap=30.0))
                self._failures.failed((uid, type(error).__name__), "reconcile failed; retrying",
                                      domain_uid=uid, error=str(error))
                self._enqueue_later(uid, backoff.next())
            finally:
                self._busy.discard(uid)
                self._wake.set()

    async def run(self, synced: asyncio.Event | None = None) -> None:
        """Fill the caches, then reconcile until cancelled."""
        informers = (self.domains, self.claims, self.pods, self.templates)
        tasks = [asyncio.create_task(i.run(), name=f"watch {i.resource.plural}")
                 for i in informers]
        try:
            for informer in informers:
                await informer.synced.wait()
            # Only now: a uid whose domain the cache does not hold yet is not "deleted".
            for uid in {*self._domain_key, *self._claims_of, *self._pods_of,
                        *self._templates_of}:
                self.enqueue(uid)
            log.info("caches filled; reconciling", domains=len(self.domains.cache),
                     claims=len(self._claim_domains))
            if synced is not None:
                synced.set()
            tasks += [asyncio.create_task(self._worker(), name=f"worker {n}")
                      for n in range(self._workers)]
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for timer in self._timers.values():
                timer.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- one domain --------------------------------------------------------------------

    def _uses(self, uid: str) -> list[ChannelUse]:
        out: list[ChannelUse] = []
        for key in sorted(self._claims_of.get(uid, ())):
            claim = self.claims.cache.get(key)
            if claim is not None:
                out.extend(u for u in read_claim(claim).uses if u.domain_uid == uid)
        return out

    def _pods(self, uid: str) -> list[DaemonPod]:
        out = []
        for key in sorted(self._pods_of.get(uid, ())):
            pod = self.pods.cache.get(key)
            read = read_pod(pod, crash_restarts=self.settings.crash_restarts) if pod else None
            if read is not None and read.domain_uid == uid:
                out.append(read)
        return out

    async def reconcile(self, uid: str) -> None:
        self.reconciles += 1
        key = self._domain_key.get(uid)
        raw = self.domains.cache.get(key) if key else None
        if raw is None or (raw.get("metadata") or {}).get("deletionTimestamp"):
            await self._clean_up(uid)
            return
        try:
            domain = cd.parse_compute_domain(raw)
        except cd.ComputeDomainError as error:
            self._failures.failed((uid, "invalid"), "invalid ComputeDomain; not acting on it",
                                  error=str(error))
            return
        now = self._monotonic()
        uses = self._uses(uid)
        pods = self._pods(uid)
        seen = Observed(
            {node: t for (u, node), t in self._not_ready_since.items() if u == uid},
            {p.name: self._failed_since[p.name] for p in pods if p.name in self._failed_since})
        plan = plan_domain(domain, uses, pods, templates=self._templates_of.get(uid, set()),
                           now=now, seen=seen, settings=self.settings)
        self._observe(uid, plan.nodes, pods, now)
        for template in plan.templates:
            await self._create_template(domain, template)
        await self._bounded([self._create_pod(pod) for pod in plan.create_pods]
                            + [self._delete_pod(name) for name in plan.delete_pods])
        written = (raw.get("status") or {}).get("status")  # the model defaults it
        if plan.status != written or plan.prune_nodes:
            stored = await update_domain_status(
                self._api, domain.metadata.namespace, domain.metadata.name,
                set_domain_status(plan.status, plan.prune_nodes))
            if stored is not None:
                self.domains.remember(stored)
        await self._write_conditions(plan.conditions)
        await self._tell(domain, plan.status, {n: s.failure for n, s in plan.nodes.items()})
        if plan.recheck_at is not None:
            self._enqueue_later(uid, plan.recheck_at - now)

    def _observe(self, uid: str, nodes: dict[str, Any], pods: list[DaemonPod],
                 now: float) -> None:
        for (u, node) in [k for k in self._not_ready_since if k[0] == uid]:
            if node not in nodes:
                del self._not_ready_since[(u, node)]
        for node, state in nodes.items():
            if state.ready:
                self._not_ready_since.pop((uid, node), None)
            else:
                self._not_ready_since.setdefault((uid, node), now)
        for pod in pods:
            if pod.failure:
                self._failed_since.setdefault(pod.name, now)
            else:
                self._failed_since.pop(pod.name, None)

    async def _create_template(self, domain: cd.ComputeDomain, template: Obj) -> None:
        key = key_of(template)
        existing = self.templates.cache.get(key)
        if existing is not None and _label(existing) != domain.uid:
            self._failures.failed((domain.uid, "template", key), (
                "a ResourceClaimTemplate of that name exists and is not this domain's; "
                "not touching it"), domain=domain.key, template=f"{key[0]}/{key[1]}")
            return
        try:
            stored = await self._api.create(CLAIM_TEMPLATES, template, namespace=key[0])
        except Conflict:
            return  # made meanwhile (our earlier attempt, or someone else's: see above)
        self.templates.remember(stored)
        log.info("created claim template", domain=domain.key, template=f"{key[0]}/{key[1]}")

    async def _create_pod(self, pod: Obj) -> None:
        namespace = self.settings.namespace
        try:
            stored = await self._api.create(PODS, pod, namespace=namespace)
        except Conflict:
            return
        self.pods.remember(stored)
        log.info("created IMEX daemon pod", pod=pod["metadata"]["name"],
                 node=pod["metadata"]["annotations"][objects.NODE_ANNOTATION])

    async def _delete_pod(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self._api.delete(PODS, name, namespace=self.settings.namespace)
        log.info("deleted IMEX daemon pod", pod=name)

    async def _write_conditions(
            self, wanted: dict[ChannelUse, tuple[Condition, Condition]]) -> None:
        stamp = self._wall().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self._bounded([
            self._apply_claim(claim, {u: wanted[u] for u in uses}, stamp)
            for claim, uses in sorted(claim_uses(wanted).items())
            if not all(same_conditions(u.conditions, wanted[u]) for u in uses)])

    async def _bounded(self, calls: list[Coroutine[Any, Any, None]]) -> None:
        """Run independent writes ``settings.writes_at_once`` at a time. All are tried; the
        first failure is raised after (the reconcile is retried, and repeats only what is
        left)."""
        gate = asyncio.Semaphore(self.settings.writes_at_once)

        async def one(call: Coroutine[Any, Any, None]) -> None:
            async with gate:
                await call

        results = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _apply_claim(self, claim: ClaimKey,
                           mine: dict[ChannelUse, tuple[Condition, Condition]],
                           stamp: str) -> None:
        raw = self.claims.cache.get((claim.namespace, claim.name))
        if raw is None:
            return
        entries = []
        # Every channel entry of the claim goes out, also other domains' (as they are):
        # an apply without them would remove them.
        for use in read_claim(raw).uses:
            entry = use.device.entry()
            if use in mine:
                entry["conditions"] = [condition_json(c, use.conditions.get(c.type), stamp)
                                       for c in mine[use]]
            elif use.conditions:
                entry["conditions"] = list(use.conditions.values())
            entries.append(entry)
        try:
            stored = await apply_claim_devices(self._api, claim, entries)
        except ApiCallError as error:
            if error.status in (409, 422):  # changed meanwhile (uid, allocation): its event
                log.info("claim changed under the status write", claim=str(claim),
                         error=str(error))
                return
            raise
        if stored is not None:
            self.claims.remember(stored)

    async def _tell(self, domain: cd.ComputeDomain, status: str,
                    failures: dict[str, str]) -> None:
        """Events for what changed since the last one said."""
        uid = domain.uid
        now = self._wall()
        if self._said_status.get(uid, cd.STATUS_NOT_READY) != status:
            self._said_status[uid] = status
            await domain_event(self._api, domain, kind="Normal" if status == cd.STATUS_READY
                               else "Warning", reason=f"Domain{status}",
                               note=f"ComputeDomain {domain.key} is {status}",
                               action="Aggregate", instance=self._instance, now=now)
        for node, failure in sorted(failures.items()):
            said = self._said_failure.get((uid, node), "")
            if failure and failure != said:
                await domain_event(self._api, domain, kind="Warning", reason="DaemonFailed",
                                   note=f"node {node}: {failure}", action="Observe",
                                   instance=self._instance, now=now)
            if failure:
                self._said_failure[(uid, node)] = failure
            else:
                self._said_failure.pop((uid, node), None)

    async def _clean_up(self, uid: str) -> None:
        for key in sorted(self._pods_of.get(uid, set())):
            pod = self.pods.cache.get(key)
            if pod is not None and not (pod.get("metadata") or {}).get("deletionTimestamp"):
                await self._delete_pod(key[1])
        for key in sorted(self._templates_of.get(uid, set())):
            if key in self.templates.cache:
                with contextlib.suppress(NotFound):
                    await self._api.delete(CLAIM_TEMPLATES, key[1], namespace=key[0])
                self.templates.forget(key)
                log.info("deleted claim template", template=f"{key[0]}/{key[1]}")
        uses = self._uses(uid)
        await self._write_conditions({u: no_domain_conditions(u) for u in uses})
        for k in [k for k in self._not_ready_since if k[0] == uid]:
            del self._not_ready_since[k]
        self._said_status.pop(uid, None)
        for k in [k for k in self._said_failure if k[0] == uid]:
            del self._said_failure[k]
        if not uses and not self._pods_of.get(uid) and not self._templates_of.get(uid):
            for index in (self._pods_of, self._templates_of, self._claims_of):
                index.pop(uid, None)
