"""The generic registry: what each verb does to storage, independent of HTTP.

Mirrors the apiserver's generic registry + per-kind strategy: decode → prepare (server-set
fields) → validate → check preconditions → store. Everything that reads-then-writes holds the
store lock, so concurrent clients see atomic updates and resourceVersion conflicts.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import random
import uuid
from collections.abc import Callable
from typing import Any

from gpudra.testing.fakeapi import errors as fe
from gpudra.testing.fakeapi.apply import ManagedFields, leaves
from gpudra.testing.fakeapi.errors import ApiError, DecodeError
from gpudra.testing.fakeapi.patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from gpudra.testing.fakeapi.request import (
    APPLY_PATCH,
    APPLY_PATCH_CBOR,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Request,
    json_body,
    now,
    yaml_or_json_body,
)
from gpudra.testing.fakeapi.resources import ResourceType
from gpudra.testing.fakeapi.selectors import (
    Selector,
    check_field_labels,
    parse_field_selector,
    parse_label_selector,
)
from gpudra.testing.fakeapi.store import Expired, Store
from gpudra.testing.fakeapi.validation import validate_meta
from gpudra.testing.fakeapi.watch import WatchControl, WatchRequest, WatchStream

Obj = dict[str, Any]
WriteHook = Callable[[Obj], None]

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apiserver's generateName alphabet


def _strip_times(entries: list[Obj] | None) -> list[Obj]:
    return [{k: v for k, v in e.items() if k != "time"} for e in entries or []]


def _same(a: Obj, b: Obj) -> bool:
    """Equal apart from resourceVersion and managedFields timestamps: a no-op write."""

    def norm(o: Obj) -> Obj:
        m = dict(o.get("metadata") or {})
        m.pop("resourceVersion", None)
        m["managedFields"] = _strip_times(m.get("managedFields"))
        return {**o, "metadata": m}

    return norm(a) == norm(b)


def _non_meta(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class Api:
    def __init__(self, store: Store, control: WatchControl) -> None:
        self.store = store
        self.control = control
        self.bookmark_interval = 60.0
        self.write_hooks: dict[str, list[WriteHook]] = {}

    # ---- helpers -------------------------------------------------------------------------

    def _selector(self, req: Request) -> Selector:
        field_text = req.query.get("fieldSelector", "")
        label_text = req.query.get("labelSelector", "")
        getters = req.resource.field_getters()
        fields = parse_field_selector(field_text)
        check_field_labels(fields, getters, req.resource.gvr, field_text, label_text)
        return Selector(tuple(fields), tuple(parse_label_selector(label_text)), getters)

    def _existing(self, req: Request) -> Obj:
        obj = self.store.get(req.resource, req.namespace or "", req.name or "")
        if obj is None:
            raise fe.not_found_error(req.resource, req.name or "")
        return obj

    def _decode_object(self, req: Request, body: Any) -> Obj:
        rt = req.resource
        if not isinstance(body, dict):
            raise fe.decode_error(rt, "json: cannot unmarshal non-object into Go value of type "
                                      f"{rt.kind}")
        obj = copy.deepcopy(body)
        if obj.get("kind") not in (None, "", rt.kind) or \
                obj.get("apiVersion") not in (None, "", rt.api_version):
            raise fe.bad_request(f"the API version in the data ({obj.get('apiVersion')}) and kind "
                                 f"({obj.get('kind')}) do not match the expected "
                                 f"{rt.api_version}, Kind={rt.kind}")
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        elif not isinstance(meta, dict):
            raise fe.decode_error(rt, "json: cannot unmarshal into Go struct field "
                                      f"{rt.kind}.metadata of type v1.ObjectMeta")
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", req.namespace):
                raise fe.bad_request("the namespace of the provided object does not match the "
                                     "namespace sent on the request")
            meta["namespace"] = req.namespace
        else:
            meta.pop("namespace", None)
        return obj

    def _prepare(self, resource: ResourceType, obj: Obj, old: Obj | None, ts: str) -> None:
        """Decode-time canonicalisation and strategy hooks, then the test's write hooks."""
        try:
            resource.canonicalize(obj)
        except DecodeError as exc:
            raise fe.decode_error(resource, str(exc)) from exc
        if resource.prepare is not None:
            resource.prepare(obj, old, ts)
        for hook in self.write_hooks.get(resource.key, []):
            hook(obj)

    def _validate(self, rt: ResourceType, obj: Obj, old: Obj | None, status: bool) -> None:
        try:
            if status:
                errs = rt.validate_status(obj, old) if rt.validate_status and old else []
            else:
                errs = rt.validate(obj, old) if rt.validate else validate_meta(obj)
        except DecodeError as exc:
            raise fe.decode_error(rt, str(exc)) from exc
        if errs:
            raise fe.invalid_error(rt, obj["metadata"].get("name", ""), errs)

    # ---- reads ---------------------------------------------------------------------------

    def get(self, req: Request) -> Obj:
        return self._existing(req)

    def list(self, req: Request) -> Obj:
        rt = req.resource
        selector = self._selector(req)
        rv = req.query.get("resourceVersion", "")
        if rv not in ("", "0") and req.query.get("resourceVersionMatch") == "Exact":
            try:
                self.store.events_after(int(rv), new_watch=True)
            except (Expired, ValueError) as exc:
                raise fe.expired_error(str(exc)) from exc
        with self.store.lock:
            list_rv = self.store.rv
            items = [o for o in self.store.items(rt, req.namespace) if selector.matches(o)]
        meta: Obj = {"resourceVersion": str(list_rv)}
        token = req.query.get("continue")
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                start = tuple(state["start"])
                meta["resourceVersion"] = str(state["rv"])
            except (ValueError, KeyError, TypeError, binascii.Error) as exc:
                raise fe.bad_request(f"continue key is not valid: {exc}") from exc
            items = [o for o in items if (o["metadata"].get("namespace", ""),
                                          o["metadata"]["name"]) > start]
        try:
            limit = int(req.query.get("limit") or 0)
        except ValueError as exc:
            raise fe.bad_request(f"invalid limit: {exc}") from exc
        if 0 < limit < len(items):
            last = items[limit - 1]["metadata"]
            state = {"rv": int(meta["resourceVersion"]),
                     "start": [last.get("namespace", ""), last["name"]]}
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        # Like the apiserver, list items carry no kind/apiVersion of their own.
        stripped = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                    for o in items]
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta,
                "items": stripped}

    def watch(self, req: Request) -> WatchStream:
        timeout = req.query.get("timeoutSeconds")
        request = WatchRequest(
            resource=req.resource, namespace=req.namespace, selector=self._selector(req),
            resource_version=req.query.get("resourceVersion", ""),
            allow_bookmarks=req.flag("allowWatchBookmarks"),
            send_initial_events=req.flag("sendInitialEvents"),
            timeout=float(timeout) if timeout else None,
            bookmark_interval=self.bookmark_interval)
        return WatchStream(self.store, self.control, request)

    # ---- create --------------------------------------------------------------------------

    def create(self, req: Request, *, body: Any = None,
               apply_manager: str | None = None) -> tuple[int, Obj]:
        rt = req.resource
        obj = self._decode_object(req, req.to_hub(json_body(req.body)) if body is None else body)
        meta = obj["metadata"]
        ts = now()
        with self.store.lock:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(rt, req.namespace or "", meta["generateName"])
            for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds",
                        "managedFields", "selfLink"):
                meta.pop(key, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = ts
            meta["generation"] = 1
            if rt.reset_status_on_create:
                obj.pop("status", None)
            self._prepare(rt, obj, None, ts)
            self._validate(rt, obj, None, status=False)
            if self.store.get(rt, req.namespace or "", meta["name"]) is not None:
                raise fe.already_exists_error(rt, meta["name"])
            managed = ManagedFields(None, rt.api_version)
            if apply_manager is not None:
                obj = managed.apply(obj, obj, apply_manager, force=True, subresource="",
                                    status_subresource=rt.has_status, now=ts)
            else:
                managed.record_update({}, leaves(obj, status_subresource=rt.has_status,
                                                 scope="main"),
                                      req.manager(), "", ts)
            obj["metadata"]["managedFields"] = managed.entries()
            if req.dry_run:
                return 201, obj
            return 201, self.store.insert(rt, obj)

    def _generate_name(self, rt: ResourceType, namespace: str, prefix: str) -> str:
        prefix = prefix[: 63 - 5]  # leave room for the suffix within a label's length
        for _ in range(100):
            name = prefix + "".join(random.choices(_NAME_CHARS, k=5))
            if self.store.get(rt, namespace, name) is None:
                return name
        raise fe.ApiError(409, "AlreadyExists", "unable to generate a unique name")

    # ---- update and patch ----------------------------------------------------------------

    def update(self, req: Request) -> tuple[int, Obj]:
        new = self._decode_object(req, req.to_hub(json_body(req.body)))
        if new["metadata"].get("name") != req.name:
            raise fe.bad_request(f"the name of the object ({new['metadata'].get('name')}) does "
                                 f"not match the name on the URL ({req.name})")
        with self.store.lock:
            old = self._existing(req)
            return self._commit(req, old, new)

    def patch(self, req: Request) -> tuple[int, Obj]:
        content_type = req.content_type.split(";")[0].strip()
        if content_type == APPLY_PATCH:
            return self._apply(req)
        if "force" in req.query:
            raise fe.invalid_error(
                _PATCH_OPTIONS, "", [fe.forbidden("force", "may not be specified for non-apply "
                                                           "patch")])
        patch_body = json_body(req.body)
        with self.store.lock:
            old = self._existing(req)
            base = req.from_hub(old)  # a patch is made against the version asked for
            try:
                if content_type == JSON_PATCH:
                    patched = json_patch(base, patch_body)
                elif content_type == MERGE_PATCH:
                    patched = merge_patch(base, patch_body)
                elif content_type == STRATEGIC_PATCH:
                    patched = strategic_merge_patch(base, patch_body)
                else:
                    raise ApiError(415, "UnsupportedMediaType",
                                   f"the body of the request was in an unknown format - accepted "
                                   f"media types include: {JSON_PATCH}, {MERGE_PATCH}, "
                                   f"{APPLY_PATCH}, {APPLY_PATCH_CBOR}")
            except PatchError as exc:
                raise ApiError(422, "Invalid", "the server rejected our request due to an error "
                                               f"in our request: {exc}") from exc
            if not isinstance(patched, dict):
                raise fe.bad_request("the patch produced a non-object")
            new = self._decode_object(req, req.to_hub(patched))
            if new["metadata"].get("name") != req.name:
                raise fe.bad_request("metadata.name: the name of the object cannot be changed "
                                     "by a patch")
            return self._commit(req, old, new)

    def _apply(self, req: Request) -> tuple[int, Obj]:
        rt = req.resource
        manager = req.query.get("fieldManager")
        if not manager:
            raise fe.invalid_error(_PATCH_OPTIONS, "", [
                fe.required("fieldManager", "is required for apply patch")])
        config = req.to_hub(yaml_or_json_body(req.body))
        if not isinstance(config, dict) or not config.get("kind") or \
                not config.get("apiVersion"):
            raise fe.bad_request(f"Object 'Kind' or 'apiVersion' is missing in '{req.body!r}'")
        name = (config.get("metadata") or {}).get("name")
        if name not in (None, req.name):
            raise fe.bad_request(f"the name of the object ({name}) does not match the name on "
                                 f"the URL ({req.name})")
        config = {**config, "metadata": {**(config.get("metadata") or {}), "name": req.name}}
        with self.store.lock:
            old = self.store.get(rt, req.namespace or "", req.name or "")
            if old is None:
                if req.subresource:
                    raise fe.not_found_error(rt, req.name or "")
                return self.create(req, body=config, apply_manager=manager)
            checked = self._decode_object(req, config)  # kind, apiVersion, namespace checks
            managed = ManagedFields(old["metadata"].get("managedFields"), rt.api_version)
            merged = managed.apply(old, checked, manager, force=req.flag("force"),
                                   subresource=req.subresource or "",
                                   status_subresource=rt.has_status, now=now())
            # A resourceVersion in the applied config is a precondition, as for updates.
            merged["metadata"]["resourceVersion"] = (config["metadata"].get("resourceVersion")
                                                     or old["metadata"].get("resourceVersion"))
            return self._commit(req, old, merged, managed=managed)

    def _commit(self, req: Request, old: Obj, new: Obj,
                managed: ManagedFields | None = None) -> tuple[int, Obj]:
        """The shared tail of PUT, PATCH and apply: the update strategy, then storage."""
        rt = req.resource
        old_meta, meta = old["metadata"], new["metadata"]
        status = req.subresource == "status"
        rv = meta.get("resourceVersion")
        if rv and rv != old_meta.get("resourceVersion"):
            raise fe.conflict_error(rt, req.name or "", fe.STALE_DETAIL)
        if meta.get("uid") and meta["uid"] != old_meta.get("uid"):
            raise fe.invalid_error(rt, req.name or "", [
                fe.invalid("metadata.uid", meta["uid"], "field is immutable")])
        ts = now()
        if status:
            # Status updates change only status (metadata is reset, managedFields aside).
            new = {**old, "status": new.get("status")}
            if new["status"] is None:
                del new["status"]
            meta = dict(old_meta)
        else:
            if rt.has_status:
                new = {k: v for k, v in new.items() if k != "status"}
                if "status" in old:
                    new["status"] = old["status"]
            for key in ("uid", "creationTimestamp", "deletionTimestamp",
                        "deletionGracePeriodSeconds", "generation"):
                if key in old_meta:
                    meta[key] = old_meta[key]
                else:
                    meta.pop(key, None)
        new["metadata"] = meta
        self._prepare(rt, new, old, ts)
        self._validate(rt, new, old, status=status)
        if not status and _non_meta(new) != _non_meta(old):
            meta["generation"] = int(old_meta.get("generation") or 0) + 1
        scope = "status" if status else "main"
        if managed is None:
            managed = ManagedFields(old_meta.get("managedFields"), rt.api_version)
            managed.record_update(
                leaves(old, status_subresource=rt.has_status, scope=scope),
                leaves(new, status_subresource=rt.has_status, scope=scope),
                req.manager(), req.subresource or "", ts)
        meta["managedFields"] = managed.entries()
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if _same(new, old):
            return 200, old  # a no-op write: no new resourceVersion, no watch event
        if req.dry_run:
            return 200, new
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.store.remove(rt, req.namespace or "", req.name or "")
            return 200, new
        return 200, self.store.replace(rt, new, old)

    # ---- delete --------------------------------------------------------------------------

    def _delete_options(self, req: Request) -> Obj:
        options = json_body(req.body) if req.body.strip() else {}
        if not isinstance(options, dict):
            raise fe.bad_request("DeleteOptions must be an object")
        if "propagationPolicy" in req.query:
            options["propagationPolicy"] = req.query["propagationPolicy"]
        return options

    def _delete_one(self, req: Request, obj: Obj, options: Obj) -> Obj:
        rt = req.resource
        meta = obj["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        if meta.get("finalizers"):
            # Finalizers hold the object: mark it deleting, the finalizer owner removes it.
            if meta.get("deletionTimestamp") or req.dry_run:
                return obj
            marked = {**obj, "metadata": {**meta, "deletionTimestamp": now(),
                                          "deletionGracePeriodSeconds": 0}}
            return self.store.replace(rt, marked, obj)
        if not req.dry_run:
            self.store.remove(rt, ns, name, orphan=options.get("propagationPolicy") == "Orphan")
        return obj

    def delete(self, req: Request) -> tuple[int, Obj]:
        options = self._delete_options(req)
        pre = options.get("preconditions") or {}
        with self.store.lock:
            obj = self._existing(req)
            meta = obj["metadata"]
            if pre.get("uid") and pre["uid"] != meta.get("uid"):
                raise fe.conflict_error(req.resource, req.name or "",
                                        f"Precondition failed: UID in precondition: {pre['uid']}, "
                                        f"UID in object meta: {meta.get('uid')}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get(
                    "resourceVersion"):
                raise fe.conflict_error(
                    req.resource, req.name or "",
                    f"Precondition failed: ResourceVersion in precondition: "
                    f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                    f"{meta.get('resourceVersion')}")
            return 200, self._delete_one(req, obj, options)

    def delete_collection(self, req: Request) -> tuple[int, Obj]:
        rt = req.resource
        options = self._delete_options(req)
        selector = self._selector(req)
        with self.store.lock:
            matching = [o for o in self.store.items(rt, req.namespace) if selector.matches(o)]
            deleted = [self._delete_one(req, o, options) for o in matching]
            rv = self.store.rv
        return 200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                     "metadata": {"resourceVersion": str(rv)},
                     "items": [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                               for o in deleted]}


# Errors about PatchOptions are reported against this pseudo-kind, as the apiserver does.
_PATCH_OPTIONS = ResourceType("meta.k8s.io", "v1", "patchoptions", "patchoptions",
                              "PatchOptions", False)
