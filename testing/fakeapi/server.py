"""``FakeApiServer``: the public face of the test API server.

Start it (``with FakeApiServer() as api:`` or ``start()``/``shutdown()``), point a real
``kubernetes`` client at ``api.url``, and use the methods below to inject faults, count
calls and read or write state directly. Every method is thread-safe.
"""

from __future__ import annotations

import builtins
import copy
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gpudra.testing.fakeapi import versions
from gpudra.testing.fakeapi.faults import WRITE_VERBS, Faults, RequestRecord
from gpudra.testing.fakeapi.hostile import AsGiven, encoded
from gpudra.testing.fakeapi.http_server import ApiHttpServer
from gpudra.testing.fakeapi.operations import Api
from gpudra.testing.fakeapi.patch import merge_patch
from gpudra.testing.fakeapi.pool_problems import pool_problems
from gpudra.testing.fakeapi.request import now
from gpudra.testing.fakeapi.resources import lookup
from gpudra.testing.fakeapi.store import Store
from gpudra.testing.fakeapi.versions import served
from gpudra.testing.fakeapi.watch import WatchControl

if TYPE_CHECKING:
    import kubernetes.aio.client
    import kubernetes.client

Obj = dict[str, Any]


class FakeApiServer:
    """A Kubernetes API server on 127.0.0.1 for tests, demos and benchmarks."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 bookmark_interval: float = 60.0, max_history: int = 100_000,
                 resource_api: str = "v1") -> None:
        """``resource_api`` picks the Kubernetes release it stands for (:mod:`.versions`):
        ``v1`` (1.34+: v1, v1beta2 and v1beta1 of resource.k8s.io), ``v1beta2`` (1.33:
        v1beta2 and v1beta1) or ``v1beta1`` (1.32: v1beta1 only)."""
        self.served = served(resource_api)
        self.store = Store(max_history=max_history)
        self._control = WatchControl(self.store)
        self._faults = Faults()
        self._as_given = AsGiven()
        self._api = Api(self.store, self._control)
        self._api.bookmark_interval = bookmark_interval
        self._address = (host, port)
        self._pruned: builtins.list[tuple[str, str, str]] = []
        self._httpd: ApiHttpServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        if self._httpd is not None:
            raise RuntimeError("already started")
        self._httpd = ApiHttpServer(self._address, self._api, self._faults, self._control,
                                    self._as_given, self.served)
        self._httpd.pruned = self._pruned
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.02},
                                        name="fakeapi-accept", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """End watches, close every connection, join every thread, close the socket."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._control.shutdown()
        httpd.shutdown()  # returns once serve_forever has stopped accepting
        httpd.close_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configuration(self) -> kubernetes.client.Configuration:
        """A sync client Configuration pointing here (plain HTTP, no auth)."""
        import kubernetes.client

        config = kubernetes.client.Configuration(host=self.url)
        config.retries = False  # let tests see every failure the server sends
        return config

    def aio_configuration(self) -> kubernetes.aio.client.Configuration:
        import kubernetes.aio.client

        return kubernetes.aio.client.Configuration(host=self.url)

    # ---- fault injection -----------------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 500, verb: str | None = None,
                  resource: str | None = None, *, retry_after: int | None = 1,
                  message: str | None = None) -> None:
        """Answer the next ``n`` matching requests with an error Status of this code.

        429/503/504 carry ``Retry-After: retry_after`` (None to omit it), as the apiserver's
        priority-and-fairness rejections do.
        """
        self._faults.fail_next(n, status, verb, resource, retry_after, message)

    def drop_next(self, n: int = 1, verb: str | None = None,
                  resource: str | None = None) -> None:
        """Close the connection of the next ``n`` matching requests without answering."""
        self._faults.drop_next(n, verb, resource)

    def delay(self, seconds: float, verb: str | None = None, resource: str | None = None,
              *, count: int | None = None) -> None:
        """Delay matching requests by ``seconds`` (for ``count`` requests, or until cleared
        with ``delay(0, ...)`` / ``clear_faults()``)."""
        self._faults.delay(seconds, verb, resource, count)

    def clear_faults(self) -> None:
        self._faults.clear()

    def serve_as_given(self, kind: str, name: str, body: object,
                       namespace: str | None = None) -> None:
        """Hostile mode: answer every GET of this object with ``body``, unchecked (bytes as
        they are, anything else JSON-encoded as it is; see :mod:`.hostile`). Lists, watches
        and writes still see the stored object, if any."""
        rt = lookup(kind)
        ns = (namespace or "default") if rt.namespaced else ""
        self._as_given.set((rt.plural, ns, name), encoded(body))

    def forget_as_given(self, kind: str | None = None, name: str | None = None,
                        namespace: str | None = None) -> None:
        """Serve the stored object again (every object, without arguments)."""
        if kind is None or name is None:
            self._as_given.forget()
            return
        rt = lookup(kind)
        ns = (namespace or "default") if rt.namespaced else ""
        self._as_given.forget((rt.plural, ns, name))

    def close_watches(self) -> None:
        """End every open watch stream cleanly (clients normally re-watch)."""
        self._control.close_all()

    def expire_watches(self) -> None:
        """Compact history: a new watch from any resourceVersion handed out so far gets an
        ERROR event with a 410 Expired Status (a list made afterwards gives a fresh one)."""
        self.store.expire()

    def send_bookmarks(self) -> None:
        """Send a BOOKMARK now on every watch that allowed bookmarks."""
        self._control.bookmark_all()

    @property
    def open_watches(self) -> int:
        return self._control.open

    def mutate_writes(self, kind: str, hook: Callable[[Obj], None] | None) -> None:
        """Run ``hook(obj)`` on every created/updated ``kind`` before validation and storage,
        e.g. to drop fields the way a disabled feature gate does. ``None`` removes hooks."""
        rt = lookup(kind)
        if hook is None:
            self._api.write_hooks.pop(rt.key, None)
        else:
            self._api.write_hooks.setdefault(rt.key, []).append(hook)

    # ---- accounting ----------------------------------------------------------------------

    @property
    def calls(self) -> Counter[tuple[str, str]]:
        """Requests so far by (verb, resource), e.g. ``calls["list", "resourceslices"]``."""
        return self._faults.calls()

    @property
    def requests(self) -> list[RequestRecord]:
        """The last 10 000 requests, oldest first, with their response codes."""
        return self._faults.requests()

    def reset_calls(self) -> None:
        self._faults.reset_calls()

    def writes(self, resource: str | None = None) -> int:
        """create + update + patch + delete + deletecollection calls (optionally for one
        resource, e.g. ``"resourceslices"``)."""
        return sum(n for (verb, res), n in self.calls.items()
                   if verb in WRITE_VERBS and (resource is None or res == resource))

    @property
    def pruned(self) -> builtins.list[tuple[str, str, str]]:
        """(resource, name, field) of each field a write lost because the served release
        does not know it (beta modes only; the client got a ``Warning`` for each)."""
        return builtins.list(self._pruned)

    def shown_as(self, version: str, obj: Obj) -> Obj:
        """A stored object (``get``/``list``) as a client of ``version`` reads it."""
        rt = lookup(obj.get("kind") or "")
        shown: Obj = versions.from_hub(rt.plural, version, obj)
        schema = self.served.schema(version, rt.plural)
        return versions.prune(shown, schema, "", []) if schema is not None else shown

    # ---- direct storage (no validation, no accounting; watch events are emitted) -------

    def put(self, obj: Obj) -> Obj:
        """Create or replace an object as-is (status included). Fills in uid,
        creationTimestamp and namespace ("default") if missing; returns the stored copy."""
        rt = lookup(obj.get("kind") or "")
        new = copy.deepcopy(obj)
        new["apiVersion"] = rt.api_version
        meta = new.setdefault("metadata", {})
        if rt.namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        rt.canonicalize(new)
        with self.store.lock:
            old = self.store.get(rt, meta.get("namespace", ""), meta["name"])
            if old is None:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", now())
                meta.setdefault("generation", 1)
                stored = self.store.insert(rt, new)
            else:
                for key in ("uid", "creationTimestamp", "generation"):
                    if key in old["metadata"]:
                        meta.setdefault(key, old["metadata"][key])
                stored = self.store.replace(rt, new, old)
        return copy.deepcopy(stored)

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        rt = lookup(kind)
        ns = (namespace or "default") if rt.namespaced else ""
        obj = self.store.get(rt, ns, name)
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, kind: str, namespace: str | None = None) -> list[Obj]:
        """Objects of a kind, sorted by namespace and name (all namespaces if None)."""
        rt = lookup(kind)
        return copy.deepcopy(self.store.items(rt, namespace if rt.namespaced else None))

    def modify(self, kind: str, name: str, changes: Obj, namespace: str | None = None) -> Obj:
        """Merge-patch an object directly (e.g. set a claim's status.allocation)."""
        with self.store.lock:
            current = self.get(kind, name, namespace)
            if current is None:
                raise KeyError(f"{kind} {namespace or ''}/{name} not found")
            return self.put(merge_patch(current, changes))

    def delete(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        """Delete immediately (ignoring finalizers) and garbage-collect dependents."""
        rt = lookup(kind)
        ns = (namespace or "default") if rt.namespaced else ""
        removed = self.store.remove(rt, ns, name)
        return copy.deepcopy(removed) if removed is not None else None

    @property
    def resource_version(self) -> str:
        """The current (global) resourceVersion."""
        return str(self.store.rv)

    def pool_problems(self, driver: str | None = None) -> builtins.list[str]:
        """Cross-slice problems that make the scheduler reject a pool (duplicate devices or
        counter sets, unknown counter references, wrong slice counts); [] when healthy."""
        slices = [s for s in self.list("ResourceSlice")
                  if driver is None or (s.get("spec") or {}).get("driver") == driver]
        return pool_problems(slices)
