"""LIST + WATCH of one node's own ResourceSlices into an in-memory cache of raw objects.

Like client-go's reflector, cut down to what the publisher needs: LIST once, then WATCH
from the list's resourceVersion; when a watch ends, watch again from the last
resourceVersion seen (bookmarks included); when the server says that version is gone
(410, as a status or as an ERROR event), LIST again. Objects stay raw JSON, so nothing the
client does not know about is lost. The publisher also records its own writes here (a
small mutation cache), so the next reconcile sees them before their watch events arrive.

The cache keeps each object as its JSON text, compressed, and decodes it when read
(:class:`SliceCache`): a pool is several times larger as Python objects than as text, and
its text compresses well and cheaply (zlib's fastest level; sizes in ``bench/RESULTS.md``,
fifth session), and only a reconcile round, which is rare, reads it.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Final

import structlog

from gpudra.kube.backoff import Backoff
from gpudra.kube.errors import ApiCallError, Gone, api_error
from gpudra.kube.log_once import FailureLog
from gpudra.kube.objects import Obj, object_name
from gpudra.kube.raw_api import RESOURCE_SLICES, RawApi, WatchStream

log = structlog.get_logger(__name__)

HEALTHY_WATCH_SECONDS: Final = 1.0
"""A watch that ends sooner without delivering anything counts as a failure (no spinning)."""
RELIST_AFTER_FAILURES: Final = 3
"""After this many watch failures in a row, LIST again before the next watch: after a long
outage a fresh LIST is cheaper and surer than replaying history (our pool is ~10 objects)."""


class _Expired(Exception):
    """The watch's resourceVersion is too old: LIST again."""


def version_of(obj: Obj | None) -> int | None:
    """The resourceVersion as a number, where it is one (etcd revisions are)."""
    text = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return _number(text)


def _number(text: object) -> int | None:
    try:
        return int(text) if isinstance(text, (str, int)) else None
    except (TypeError, ValueError):
        return None


def _older(obj: Obj, than: int | None) -> bool:
    """True if ``obj`` is known to be an older state than resourceVersion ``than``
    (ordering by revision, as client-go's mutation cache does; unknown ordering counts as
    not older)."""
    mine = version_of(obj)
    return mine is not None and than is not None and mine < than


class SliceCache(Mapping[str, Obj]):
    """name → stored slice. Each is kept as compact JSON text, compressed, with its
    resourceVersion beside it, and decoded on every read: a read returns a fresh object of
    its own."""

    def __init__(self, objects: Iterable[Obj] = ()) -> None:
        self._packed: dict[str, bytes] = {}
        self._versions: dict[str, int | None] = {}
        for obj in objects:
            self.put(obj)

    def __getitem__(self, name: str) -> Obj:
        decoded: Obj = json.loads(zlib.decompress(self._packed[name]))
        return decoded

    def __iter__(self) -> Iterator[str]:
        return iter(self._packed)

    def __len__(self) -> int:
        return len(self._packed)

    def __contains__(self, name: object) -> bool:
        return name in self._packed

    def put(self, obj: Obj) -> None:
        """Keep ``obj`` (it must have a name) in place of what its name held."""
        name = object_name(obj)
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        self._packed[name] = zlib.compress(text.encode(), 1)
        self._versions[name] = version_of(obj)

    def drop(self, name: str) -> bool:
        """Forget ``name``; False if it was not here."""
        self._versions.pop(name, None)
        return self._packed.pop(name, None) is not None

    def version(self, name: str) -> int | None:
        """The resourceVersion of what ``name`` holds, as a number (None: unknown)."""
        return self._versions.get(name)


class SliceReflector:
    """The node's slices as the API server has them: ``cache`` maps name → stored object."""

    def __init__(self, api: RawApi, *, field_selector: str, on_change: Callable[[], None],
                 backoff: Backoff, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 watch_timeout: int = 300) -> None:
        self._api = api
        self._selector = field_selector
        self._on_change = on_change
        self._backoff = backoff
        self._clock = clock
        self._sleep = sleep  # the back-off's waits
        self._watch_timeout = watch_timeout
        self._failures = FailureLog(log)
        self.cache = SliceCache()
        # The resourceVersion of what we deleted, as last seen: see ``forget``.
        self._gone: dict[str, int | None] = {}
        self.resource_version = ""
        self.listed = asyncio.Event()
        """Set once the first LIST has filled the cache."""
        self.lists = 0
        self.watches = 0
        self._instant_ends = 0

    def seen(self, version: int) -> bool:
        """True once the cache reflects the server at resourceVersion ``version`` or later
        (the watch, or a LIST, has brought everything up to it)."""
        mine = _number(self.resource_version)
        return mine is not None and mine >= version

    # ---- the publisher's own writes ------------------------------------------------------

    def remember(self, obj: Obj) -> None:
        """Record the server's answer to our create or update."""
        name = object_name(obj)
        if name and not self._stale(obj):
            self.cache.put(obj)
            self._gone.pop(name, None)

    def forget(self, name: str) -> None:
        """Record that a slice is gone (we deleted it, or the server says it is not found)."""
        version = self.cache.version(name)
        if self.cache.drop(name):
            # Its watch events may still be on the way; they must not bring it back.
            self._gone[name] = version

    def _stale(self, obj: Obj) -> bool:
        """True if ``obj`` is older than what we know: the cached state, or its deletion."""
        name = object_name(obj)
        if _older(obj, self.cache.version(name)):
            return True
        mine, deleted = version_of(obj), self._gone.get(name)
        return mine is not None and deleted is not None and mine <= deleted

    # ---- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """LIST and WATCH until cancelled; API failures are retried, never raised."""
        relist = True
        while True:
            try:
                if relist or self._failures.retries >= RELIST_AFTER_FAILURES:
                    await self._list()
                    relist = False
                await self._watch()
            except _Expired:
                log.info("slice watch expired; listing again",
                         resource_version=self.resource_version)
                relist = True
            except Gone:
                relist = True
            except ApiCallError as error:
                self._failures.failed((error.verb, error.status, error.reason),
                                      "slice list/watch failed; retrying", verb=error.verb,
                                      status=error.status, error=str(error))
                await self._sleep(self._backoff.honouring(error.retry_after))

    async def _list(self) -> None:
        listing = await self._api.list(RESOURCE_SLICES, field_selector=self._selector)
        items = [item for item in listing.get("items") or [] if isinstance(item, dict)]
        self.cache = SliceCache(item for item in items if object_name(item))
        self._gone.clear()
        self.resource_version = str((listing.get("metadata") or {}).get("resourceVersion")
                                    or "")
        self.lists += 1
        self.listed.set()
        self._on_change()

    async def _watch(self) -> None:
        timeout = random.randint(self._watch_timeout, 2 * self._watch_timeout)
        started = self._clock()
        stream = await self._api.watch(RESOURCE_SLICES, field_selector=self._selector,
                                       resource_version=self.resource_version,
                                       timeout_seconds=timeout)
        self.watches += 1
        events = 0
        async with stream:
            events = await self._consume(stream)
        if events or self._clock() - started >= HEALTHY_WATCH_SECONDS:
            self._instant_ends = 0
            self._backoff.reset()
            self._failures.recovered("slice watch working again")
            return
        # Ended at once and said nothing. Once happens (a server closing every watch as it
        # restarts); again in a row is a server in trouble, which must not be hammered.
        self._instant_ends += 1
        if self._instant_ends > 1:
            self._failures.failed("watch-ended-at-once", "slice watch ended at once; retrying",
                                  verb="watch")
            await self._sleep(self._backoff.next())

    async def _consume(self, stream: WatchStream) -> int:
        """Apply events until the stream ends; returns how many arrived."""
        count = 0
        while (event := await stream.next()) is not None:
            count += 1
            self._handle(event, first=count == 1)
            # Not kept while the watch idles, which is most of the time: the last event is
            # a whole slice, large as Python objects.
            del event
        return count

    def _handle(self, event: Obj, *, first: bool) -> None:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            return
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired
            raise api_error("watch", RESOURCE_SLICES.plural, None,
                            status=int(obj.get("code") or 500),
                            reason=str(obj.get("reason") or ""),
                            message=str(obj.get("message") or ""))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
        changed = self._remove(obj) if kind == "DELETED" else (
            kind in ("ADDED", "MODIFIED") and self._apply(obj))
        if changed:
            self._on_change()
        if first or self._failures.failing:
            self._backoff.reset()
            self._failures.recovered("slice watch working again")

    def _apply(self, obj: Obj) -> bool:
        name = object_name(obj)
        if not name or self._stale(obj):
            return False
        current = self.cache.version(name) if name in self.cache else None
        if current is not None and version_of(obj) == current:
            return False  # our own write, already recorded from its answer (or no change)
        if name in self.cache and obj == self.cache[name]:
            return False
        self.cache.put(obj)
        self._gone.pop(name, None)
        return True

    def _remove(self, obj: Obj) -> bool:
        name = object_name(obj)
        if name not in self.cache or _older(obj, self.cache.version(name)):
            return False  # already gone, or re-created since
        self.cache.drop(name)
        return True
