"""Object storage with a global resourceVersion, an event log for watches, and garbage
collection by ownerReferences.

Like etcd behind the apiserver: every write takes the next resourceVersion (one counter for
all kinds), and every write is one event in the log. Stored objects are never mutated once
stored (writers store fresh dicts), so readers may serialise them outside the lock.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Any

from gpudra.testing.fakeapi.resources import NAMESPACES, REGISTRY, ResourceType

Obj = dict[str, Any]


@dataclass(frozen=True)
class Event:
    rv: int
    resource: ResourceType
    type: str  # ADDED, MODIFIED or DELETED
    obj: Obj
    old: Obj | None  # the previous state for MODIFIED, so watches can see selector changes


class Expired(Exception):
    """A resourceVersion older than the retained history."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")


def meta(obj: Obj) -> Obj:
    value: Obj = obj.setdefault("metadata", {})
    return value


def with_rv(obj: Obj, rv: int) -> Obj:
    """A copy of ``obj`` (sharing everything but metadata) carrying ``rv``."""
    return {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": str(rv)}}


class Store:
    def __init__(self, max_history: int = 100_000) -> None:
        self.lock = threading.RLock()
        # Watchers wait on this; every write and every watch-control change notifies it.
        self.changed = threading.Condition(self.lock)
        self.rv = 1
        self.compacted_rv = 0  # events with rv > compacted_rv are retained
        # expire_watches(): new watches from before this get 410, open ones carry on.
        self.expired_before = 0
        self.max_history = max_history
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {rt.key: {} for rt in REGISTRY}
        self._by_uid: dict[str, tuple[ResourceType, str, str]] = {}
        self._events: list[Event] = []
        self._event_rvs: list[int] = []

    # ---- reads -------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj | None:
        with self.lock:
            return self._objects[rt.key].get((namespace, name))

    def items(self, rt: ResourceType, namespace: str | None = None) -> list[Obj]:
        """Objects sorted by (namespace, name), as the apiserver lists them."""
        with self.lock:
            found = self._objects[rt.key]
            keys = sorted(k for k in found if namespace is None or k[0] == namespace)
            return [found[k] for k in keys]

    def exists_uid(self, uid: str) -> bool:
        with self.lock:
            return uid in self._by_uid

    def events_after(self, rv: int, *, new_watch: bool = False) -> list[Event]:
        """Every retained event newer than ``rv``; Expired if some were already dropped."""
        with self.lock:
            oldest = max(self.compacted_rv, self.expired_before if new_watch else 0)
            if rv < oldest:
                raise Expired(rv, oldest)
            start = bisect.bisect_right(self._event_rvs, rv)
            return self._events[start:]

    # ---- writes (each takes the next resourceVersion and logs one event) ---------------------

    def _record(self, rt: ResourceType, kind: str, obj: Obj, old: Obj | None) -> None:
        self._events.append(Event(self.rv, rt, kind, obj, old))
        self._event_rvs.append(self.rv)
        if len(self._events) > self.max_history:
            drop = len(self._events) - self.max_history // 2
            self.compacted_rv = self._event_rvs[drop - 1]
            del self._events[:drop]
            del self._event_rvs[:drop]
        self.changed.notify_all()

    def insert(self, rt: ResourceType, obj: Obj) -> Obj:
        with self.lock:
            self.rv += 1
            stored = with_rv(obj, self.rv)
            m = stored["metadata"]
            self._objects[rt.key][(m.get("namespace", ""), m["name"])] = stored
            if m.get("uid"):
                self._by_uid[m["uid"]] = (rt, m.get("namespace", ""), m["name"])
            self._record(rt, "ADDED", stored, None)
            return stored

    def replace(self, rt: ResourceType, obj: Obj, old: Obj) -> Obj:
        with self.lock:
            self.rv += 1
            stored = with_rv(obj, self.rv)
            m = stored["metadata"]
            self._objects[rt.key][(m.get("namespace", ""), m["name"])] = stored
            old_uid = old.get("metadata", {}).get("uid")
            if old_uid != m.get("uid"):  # only test helpers can change a uid
                self._by_uid.pop(old_uid, None)
                if m.get("uid"):
                    self._by_uid[m["uid"]] = (rt, m.get("namespace", ""), m["name"])
            self._record(rt, "MODIFIED", stored, old)
            return stored

    def remove(self, rt: ResourceType, namespace: str, name: str, *,
               orphan: bool = False) -> Obj | None:
        """Delete an object and garbage-collect what it owned; returns the deleted object."""
        with self.lock:
            current = self._objects[rt.key].pop((namespace, name), None)
            if current is None:
                return None
            uid = current.get("metadata", {}).get("uid")
            self._by_uid.pop(uid, None)
            self.rv += 1
            self._record(rt, "DELETED", with_rv(current, self.rv), None)
            if uid:
                self._collect_dependents(uid, orphan=orphan)
            if rt is NAMESPACES:
                # The namespace controller's job, done at once: its contents go with it.
                for other in REGISTRY:
                    if other.namespaced:
                        for ns, obj_name in [k for k in self._objects[other.key] if k[0] == name]:
                            self.remove(other, ns, obj_name)
            return current

    def _collect_dependents(self, owner_uid: str, *, orphan: bool) -> None:
        """The garbage collector, synchronously: delete (or orphan) what the owner owned.

        A dependent with other owners still alive only loses the dangling reference.
        """
        for rt in REGISTRY:
            for key, obj in list(self._objects[rt.key].items()):
                if self._objects[rt.key].get(key) is not obj:
                    continue  # already collected (or changed) by a nested collection
                refs = obj.get("metadata", {}).get("ownerReferences") or []
                if not any(r.get("uid") == owner_uid for r in refs):
                    continue
                m = obj["metadata"]
                alive = [r for r in refs if r.get("uid") != owner_uid
                         and r.get("uid") in self._by_uid]
                if orphan or alive:
                    kept = [r for r in refs if r.get("uid") != owner_uid]
                    new_meta = {**m, "ownerReferences": kept}
                    if not kept:
                        del new_meta["ownerReferences"]
                    self.replace(rt, {**obj, "metadata": new_meta}, obj)
                else:
                    self.remove(rt, m.get("namespace", ""), m["name"])

    def expire(self) -> None:
        """Compact history: a *new* watch from any resourceVersion handed out so far gets 410.

        The version counter moves on (without an event), so a list made afterwards returns a
        version that still works: clients recover by relisting, as with a real compaction.
        Open watches keep their position and carry on, so tests are not racy.
        """
        with self.lock:
            self.rv += 1
            self.expired_before = self.rv
