"""Watch streams: what one ``?watch=true`` request sends, as a generator of event dicts.

Semantics follow the apiserver's watch cache:

* no ``resourceVersion`` (or ``"0"``, or ``sendInitialEvents=true``): synthetic ADDED events
  for the current matching objects, then changes;
* ``resourceVersion=N``: every change after N, or one ERROR event carrying a 410 Expired
  Status when N is older than the retained history;
* selectors are applied to both the old and new state of a change, so an object that starts
  matching arrives as ADDED and one that stops matching as DELETED;
* BOOKMARK events (with ``allowWatchBookmarks=true``) every ``bookmark_interval`` seconds or on
  demand, and the ``k8s.io/initial-events-end`` bookmark after initial events;
* ``timeoutSeconds`` ends the stream cleanly; so do ``close_watches()`` and shutdown.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from gpudra.testing.fakeapi.errors import expired_error
from gpudra.testing.fakeapi.resources import ResourceType
from gpudra.testing.fakeapi.selectors import Selector
from gpudra.testing.fakeapi.store import Event, Expired, Store

Obj = dict[str, Any]


class WatchControl:
    """Server-wide switches that end or poke every open watch."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.epoch = 0  # close_watches() bumps it; streams from an older epoch end
        self.bookmark_epoch = 0  # send_bookmarks() bumps it
        self.closing = False
        self.open = 0
        self._lock = threading.Lock()

    def close_all(self) -> None:
        with self._store.changed:
            self.epoch += 1
            self._store.changed.notify_all()

    def bookmark_all(self) -> None:
        with self._store.changed:
            self.bookmark_epoch += 1
            self._store.changed.notify_all()

    def shutdown(self) -> None:
        with self._store.changed:
            self.closing = True
            self._store.changed.notify_all()

    def opened(self, delta: int) -> None:
        with self._lock:
            self.open += delta


@dataclass
class WatchRequest:
    resource: ResourceType
    namespace: str | None
    selector: Selector
    resource_version: str  # "" when not given
    allow_bookmarks: bool = False
    send_initial_events: bool = False
    timeout: float | None = None
    bookmark_interval: float = 60.0


def _bookmark(rt: ResourceType, rv: int, *, initial_end: bool = False) -> Obj:
    obj: Obj = {"kind": rt.kind, "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(rv)}}
    if initial_end:
        obj["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {"type": "BOOKMARK", "object": obj}


class WatchStream:
    # How often a quiet stream checks that its client is still there.
    LIVENESS_INTERVAL = 0.1

    def __init__(self, store: Store, control: WatchControl, request: WatchRequest) -> None:
        self.store = store
        self.control = control
        self.req = request
        # Set by the HTTP layer: False once the client has gone away, ending the stream.
        self.alive: Callable[[], bool] = lambda: True

    def _matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        if self.req.namespace is not None and \
                obj.get("metadata", {}).get("namespace") != self.req.namespace:
            return False
        return self.req.selector.matches(obj)

    def _translate(self, event: Event) -> Obj | None:
        if event.resource is not self.req.resource:
            return None
        now = self._matches(event.obj)
        if event.type == "MODIFIED":
            before = self._matches(event.old)
            if now and not before:
                return {"type": "ADDED", "object": event.obj}
            if before and not now:
                return {"type": "DELETED", "object": event.obj}
        return {"type": event.type, "object": event.obj} if now else None

    def frames(self) -> Generator[Obj, None, None]:
        """The stream's events, blocking between them; ends on timeout, close or shutdown."""
        req = self.req
        deadline = time.monotonic() + req.timeout if req.timeout is not None else None
        initial: list[Obj] = []
        with self.store.changed:
            epoch, bookmark_epoch = self.control.epoch, self.control.bookmark_epoch
            position = self.store.rv
            error = None
            if req.send_initial_events or req.resource_version in ("", "0"):
                initial = [{"type": "ADDED", "object": o}
                           for o in self.store.items(req.resource, req.namespace)
                           if self._matches(o)]
            else:
                try:
                    position = int(req.resource_version)
                    self.store.events_after(position, new_watch=True)
                except Expired as exc:
                    error = expired_error(str(exc)).status()
        # Never yield while holding the store lock: the consumer writes to a socket.
        if error is not None:
            yield {"type": "ERROR", "object": error}
            return
        yield from initial
        if req.send_initial_events and req.allow_bookmarks:
            yield _bookmark(req.resource, position, initial_end=True)
        next_bookmark = time.monotonic() + req.bookmark_interval
        while self.alive():
            bookmark = False
            events: list[Event] = []
            with self.store.changed:
                while not events and not bookmark:
                    if self.control.closing or self.control.epoch != epoch:
                        return
                    try:
                        events = self.store.events_after(position)
                    except Expired as exc:
                        error = expired_error(str(exc)).status()
                        break
                    if events:
                        break
                    now = time.monotonic()
                    if req.allow_bookmarks and (now >= next_bookmark or
                                                self.control.bookmark_epoch != bookmark_epoch):
                        bookmark_epoch = self.control.bookmark_epoch
                        bookmark = True
                        break
                    if deadline is not None and now >= deadline:
                        return
                    wake = now + self.LIVENESS_INTERVAL
                    if deadline is not None:
                        wake = min(wake, deadline)
                    if req.allow_bookmarks:
                        wake = min(wake, next_bookmark)
                    self.store.changed.wait(max(wake - now, 0))
                    if not self.alive():
                        return
            if error is not None:
                yield {"type": "ERROR", "object": error}
                return
            if events:
                position = events[-1].rv
                for event in events:
                    frame = self._translate(event)
                    if frame is not None:
                        yield frame
            if bookmark:
                next_bookmark = time.monotonic() + req.bookmark_interval
                yield _bookmark(req.resource, position)
