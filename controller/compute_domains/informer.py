"""LIST + WATCH of one resource into a cache of raw objects, telling a callback what changed.

Like client-go's reflector and informer, cut down to what the controller needs: LIST (page
by page), then WATCH from the list's resourceVersion; a watch that ends is resumed from the
last resourceVersion seen (bookmarks included); a 410 Gone (as a status or an ERROR event)
means LIST again, and the difference between the old cache and the new list is reported as
changes, so nothing is missed across a gap. The controller's own writes are recorded at
once (:meth:`Informer.remember` / :meth:`Informer.forget`), so its next reconcile does not
create the same pod twice while the watch event is on its way.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Final

import structlog

from gpudra.kube.backoff import Backoff
from gpudra.kube.errors import ApiCallError, Gone
from gpudra.kube.log_once import FailureLog
from gpudra.kube.objects import Obj
from gpudra.kube.raw_api import RawApi, Resource

log = structlog.get_logger(__name__)

Key = tuple[str, str]
"""(namespace, name)."""
OnChange = Callable[[Obj | None, Obj | None], None]
"""Called with (old, new): new None for a deletion, old None for an addition."""

PAGE: Final = 500
QUIET_END: Final = 1.0
"""A watch that ends sooner than this without an event counts as a failure."""


class _Expired(Exception):
    pass


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _version(obj: Obj | None) -> int | None:
    text = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    try:
        return int(text) if isinstance(text, str | int) else None
    except ValueError:
        return None


class Informer:
    """The objects of ``resource`` (in ``namespace``, or every namespace) as the server has
    them; ``cache`` maps (namespace, name) to the stored object."""

    def __init__(self, api: RawApi, resource: Resource, on_change: OnChange, *,
                 namespace: str | None = None, backoff: Backoff | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 watch_timeout: int = 300) -> None:
        self._api = api
        self.resource = resource
        self._namespace = namespace
        self._on_change = on_change
        self._backoff = backoff or Backoff(initial=0.2, cap=30.0)
        self._sleep = sleep
        self._watch_timeout = watch_timeout
        self._failures = FailureLog(log)
        self.cache: dict[Key, Obj] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()

    def remember(self, obj: Obj) -> None:
        """Our own write's answer: newer than what the cache holds, or the same."""
        key = key_of(obj)
        old = self.cache.get(key)
        mine, theirs = _version(obj), _version(old)
        if mine is not None and theirs is not None and mine < theirs:
            return
        self.cache[key] = obj
        self._on_change(old, obj)

    def forget(self, key: Key) -> None:
        old = self.cache.pop(key, None)
        if old is not None:
            self._on_change(old, None)

    async def run(self) -> None:
        """LIST and WATCH until cancelled; failures are retried with back-off, never raised."""
        relist = True
        while True:
            try:
                if relist:
                    await self._list()
                    relist = False
                started = time.monotonic()
                if await self._watch() or time.monotonic() - started >= QUIET_END:
                    self._backoff.reset()
                else:
                    # Ended at once with nothing in it (a proxy cutting watches?): no spinning.
                    await self._sleep(self._backoff.next())
            except (_Expired, Gone):
                relist = True
            except ApiCallError as error:
                self._failures.failed((error.verb, error.status, error.reason),
                                      f"{self.resource.plural} list/watch failed; retrying",
                                      verb=error.verb, status=error.status, error=str(error))
                relist = relist or error.status == 0
                await self._sleep(self._backoff.honouring(error.retry_after))

    async def _list(self) -> None:
        items: list[Obj] = []
        token = ""
        while True:
            page = await self._api.list(self.resource, namespace=self._namespace, limit=PAGE,
                                        continue_from=token)
            items.extend(i for i in page.get("items") or [] if isinstance(i, dict))
            meta = page.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                self.resource_version = str(meta.get("resourceVersion") or "")
                break
        fresh = {key_of(i): i for i in items}
        old, self.cache = self.cache, fresh
        for key, obj in fresh.items():
            if old.get(key) != obj:
                self._on_change(old.get(key), obj)
        for key, obj in old.items():
            if key not in fresh:
                self._on_change(obj, None)
        self._failures.recovered(f"{self.resource.plural} listed again")
        self.synced.set()

    async def _watch(self) -> int:
        """Follow one watch until it ends; the number of events it brought."""
        timeout = random.randint(self._watch_timeout, 2 * self._watch_timeout)
        stream = await self._api.watch(self.resource, namespace=self._namespace,
                                       field_selector="",
                                       resource_version=self.resource_version,
                                       timeout_seconds=timeout)
        seen = 0
        async with stream:
            while (event := await stream.next()) is not None:
                seen += 1
                self._event(event)
        return seen

    def _event(self, event: Obj) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            return
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired()
            raise ApiCallError("watch", self.resource.plural, None,
                               status=int(obj.get("code") or 0),
                               reason=str(obj.get("reason") or ""),
                               message=str(obj.get("message") or ""))
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind == "BOOKMARK":
            return
        key = key_of(obj)
        old = self.cache.get(key)
        if kind == "DELETED":
            self.cache.pop(key, None)
            self._on_change(old or obj, None)
        elif kind in ("ADDED", "MODIFIED"):
            theirs = _version(old)
            mine = _version(obj)
            if mine is not None and theirs is not None and mine < theirs:
                return  # older than our own write already recorded
            self.cache[key] = obj
            self._on_change(old, obj)
