"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

One controller acts; the others wait. A candidate takes the Lease when it is free (no
holder, or released) or when its holder has not renewed it for ``lease_duration`` — timed
by the candidate's own clock from when *it* last saw the Lease change, never by comparing
``renewTime`` with its clock, so skewed clocks cannot make two leaders. Every write carries
the resourceVersion it read, so of two candidates racing for a free Lease one gets 409 and
stays a candidate. The leader renews every ``retry_period``; if it cannot renew for
``renew_deadline`` (< ``lease_duration``) it stops acting before anyone else may start. On a
clean stop it releases the Lease so a standby takes over at its next try, not a
``lease_duration`` later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from gpudra.controller.compute_domains.resources import LEASES
from gpudra.kube.errors import ApiCallError, Conflict, NotFound
from gpudra.kube.objects import Obj
from gpudra.kube.raw_api import RawApi

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need 0 < retry period < renew deadline < lease duration, got "
                             f"{self.retry_period:g}, {self.renew_deadline:g}, "
                             f"{self.lease_duration:g}")


def micro_time(moment: datetime) -> str:
    """A ``metav1.MicroTime``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api: RawApi, settings: LeaseSettings, *,
                 monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._api = api
        self.settings = settings
        self._monotonic = monotonic
        self._wall = wall
        self._sleep = sleep
        self._observed: Any = None  # the Lease spec as last seen
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self.leading = False

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease."""
        while not await self._try():
            await self._sleep(self.settings.retry_period)
        self.leading = True
        self._renewed_at = self._monotonic()
        log.info("became the leader", lease=self.settings.name, identity=self.settings.identity)

    async def hold(self) -> None:
        """Renew until the Lease cannot be renewed within the deadline; then return (the
        caller stops acting)."""
        while True:
            await self._sleep(self.settings.retry_period)
            try:
                renewed = await self._try()
            except ApiCallError as error:
                log.warning("lease renewal failed", error=str(error))
                renewed = False
            if renewed:
                self._renewed_at = self._monotonic()
            elif self._monotonic() - self._renewed_at >= self.settings.renew_deadline:
                self.leading = False
                log.error("lost the lease", lease=self.settings.name,
                          identity=self.settings.identity)
                return

    async def release(self) -> None:
        """Give the Lease up (best effort), so a standby need not wait for it to expire."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self._api.get(LEASES, self.settings.name,
                                        namespace=self.settings.namespace)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.settings.identity:
                return
            spec.update(holderIdentity="", leaseDurationSeconds=1,
                        renewTime=micro_time(self._wall()))
            await self._api.replace(LEASES, self.settings.name, {**lease, "spec": spec},
                                    namespace=self.settings.namespace)
            log.info("released the lease", lease=self.settings.name)
        except ApiCallError as error:
            log.warning("could not release the lease", error=str(error))

    def _spec(self, old: Obj | None) -> Obj:
        now = micro_time(self._wall())
        mine = bool(old) and (old or {}).get("holderIdentity") == self.settings.identity
        transitions = int((old or {}).get("leaseTransitions") or 0)
        return {"holderIdentity": self.settings.identity,
                "leaseDurationSeconds": max(1, round(self.settings.lease_duration)),
                "acquireTime": (old or {}).get("acquireTime") if mine else now,
                "renewTime": now,
                "leaseTransitions": transitions if mine or not old else transitions + 1}

    async def _try(self) -> bool:
        """One attempt to take or renew the Lease; False if someone else holds it."""
        s = self.settings
        try:
            lease = await self._api.get(LEASES, s.name, namespace=s.namespace)
        except NotFound:
            body: Obj = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": s.name, "namespace": s.namespace},
                    "spec": self._spec(None)}
            try:
                await self._api.create(LEASES, body, namespace=s.namespace)
            except Conflict:
                return False
            self._seen(body["spec"])
            return True
        spec = lease.get("spec") or {}
        if spec != self._observed:
            self._seen(spec)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or s.lease_duration)
        if holder and holder != s.identity and \
                self._monotonic() < self._observed_at + duration:
            return False
        new: Obj = self._spec(spec)
        try:
            answer = await self._api.replace(LEASES, s.name, {**lease, "spec": new},
                                             namespace=s.namespace)
        except Conflict:
            return False
        self._seen(answer.get("spec") or new)
        return True

    def _seen(self, spec: Obj) -> None:
        self._observed = spec
        self._observed_at = self._monotonic()
