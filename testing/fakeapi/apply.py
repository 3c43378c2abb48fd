"""Server-side apply and ``managedFields``, simplified.

Ownership is tracked per (manager, operation, subresource) at the granularity of leaf
fields, where every list counts as one atomic leaf (true for the resource.k8s.io lists the
driver writes: ``devices``, ``sharedCounters``, ``consumesCounters``; not for the few core
map-lists). That is enough for the behaviours a driver meets:

* an Apply creates the object if it is missing and merges into it otherwise;
* a field the manager applied before and omits now is removed (unless someone else owns it);
* applying a value that differs from one owned by another manager is a 409 Conflict naming
  the fields, unless ``force=true``, which takes the fields over;
* Update operations (PUT and the other patch types) take over the fields they change.

One list is a map, as in the apiserver: ``status.devices`` of a ResourceClaim
(``listType=map``, keys driver, pool, device, shareID), so each driver owns its own entries
and applying an empty list removes only the applier's entries.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

from gpudra.testing.fakeapi.errors import ApiError

Obj = dict[str, Any]
Path = tuple[str, ...]

# Identity and server-owned metadata are never "owned" by a manager.
_SYSTEM_META = {"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink",
                "generateName"}


_LIST_MAPS: dict[Path, tuple[str, ...]] = {
    ("status", "devices"): ("driver", "pool", "device", "shareID"),
}
"""Lists that are maps (``+listType=map``), by path, with their key fields."""


def _item_key(item: Obj, keys: tuple[str, ...]) -> str:
    """The fieldsV1 element key: ``k:{"device":"gpu-0","driver":...}``."""
    return "k:" + json.dumps({k: item[k] for k in sorted(keys) if item.get(k) not in (None, "")},
                             separators=(",", ":"))


def as_maps(obj: Obj) -> Obj:
    """``obj`` with each list-map turned into a dict by element key (for merging)."""
    out = copy.deepcopy(obj)
    for path, keys in _LIST_MAPS.items():
        found, value = _lookup(out, path)
        if found and isinstance(value, list) and all(isinstance(i, dict) for i in value):
            parent = _lookup(out, path[:-1])[1]
            parent[path[-1]] = {_item_key(i, keys): i for i in value}
    return out


def as_lists(obj: Obj) -> Obj:
    """The inverse of :func:`as_maps`."""
    for path in _LIST_MAPS:
        found, value = _lookup(obj, path)
        if found and isinstance(value, dict):
            _lookup(obj, path[:-1])[1][path[-1]] = list(value.values())
    return obj


def leaves(obj: Obj, *, status_subresource: bool, scope: str) -> dict[Path, Any]:
    """Leaf field paths → values, for the main resource (``scope="main"``) or its status."""
    found: dict[Path, Any] = {}
    obj = as_maps(obj)

    def walk(value: Any, path: Path) -> None:
        if isinstance(value, dict) and value:
            for key, child in value.items():
                walk(child, (*path, key))
        elif not (path in _LIST_MAPS and value in ({}, [])):  # an empty list-map owns nothing
            found[path] = value

    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if status_subresource and (key == "status") != (scope == "status"):
            continue
        if key == "metadata" and isinstance(value, dict):
            for mkey, mval in value.items():
                if mkey not in _SYSTEM_META:
                    walk(mval, ("metadata", mkey))
            continue
        walk(value, (key,))
    return found


def to_fields_v1(paths: Iterable[Path]) -> Obj:
    tree: Obj = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(key if key.startswith("k:") else f"f:{key}", {})
    return tree


def from_fields_v1(tree: Obj) -> set[Path]:
    paths: set[Path] = set()

    def walk(node: Obj, path: Path) -> None:
        children = {k: v for k, v in node.items() if k.startswith(("f:", "k:"))}
        if not children and path:
            paths.add(path)
        for key, child in children.items():
            name = key if key.startswith("k:") else key[2:]
            walk(child if isinstance(child, dict) else {}, (*path, name))

    walk(tree, ())
    return paths


def _lookup(obj: Any, path: Path) -> tuple[bool, Any]:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return False, None
        obj = obj[key]
    return True, obj


def _remove(obj: Obj, path: Path) -> None:
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    # Drop parents the removal left empty, as SSA does.
    for depth in range(len(path) - 1, 0, -1):
        found, parent = _lookup(obj, path[:depth])
        if found and isinstance(parent, dict) and not parent:
            _remove_exact(obj, path[:depth])


def _remove_exact(obj: Obj, path: Path) -> None:
    found, parent = _lookup(obj, path[:-1])
    if found and isinstance(parent, dict):
        parent.pop(path[-1], None)


def _merge(target: Any, config: Any) -> Any:
    if not isinstance(config, dict) or not isinstance(target, dict):
        return copy.deepcopy(config)
    result = dict(target)
    for key, value in config.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


class ManagedFields:
    """The managedFields of one object, as a mutable working copy."""

    def __init__(self, entries: list[Obj] | None, api_version: str) -> None:
        self.api_version = api_version
        self.owned: dict[tuple[str, str, str], set[Path]] = {}
        self.times: dict[tuple[str, str, str], str] = {}
        for entry in entries or []:
            key = (entry.get("manager", ""), entry.get("operation", ""),
                   entry.get("subresource", ""))
            self.owned[key] = from_fields_v1(entry.get("fieldsV1") or {})
            self.times[key] = entry.get("time", "")

    def entries(self) -> list[Obj]:
        out = []
        for key, paths in self.owned.items():
            if not paths:
                continue
            manager, operation, subresource = key
            entry: Obj = {"manager": manager, "operation": operation,
                          "apiVersion": self.api_version, "time": self.times.get(key, ""),
                          "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(paths)}
            if subresource:
                entry["subresource"] = subresource
            out.append(entry)
        return out

    def record_update(self, old: dict[Path, Any], new: dict[Path, Any], manager: str,
                      subresource: str, now: str) -> None:
        """An Update takes over every leaf it set or changed; removed leaves lose owners."""
        changed = {p for p, v in new.items() if p not in old or old[p] != v}
        removed = set(old) - set(new)
        if not changed and not removed:
            return
        for owned in self.owned.values():
            owned.difference_update(changed | removed)
        key = (manager, "Update", subresource)
        self.owned.setdefault(key, set()).update(changed)
        self.times[key] = now

    def apply(self, current: Obj, config: Obj, manager: str, *, force: bool, subresource: str,
              status_subresource: bool, now: str) -> Obj:
        """Merge ``config`` into ``current`` as ``manager``'s apply; return the new object."""
        scope = "status" if subresource == "status" else "main"
        applied = leaves(config, status_subresource=status_subresource, scope=scope)
        key = (manager, "Apply", subresource)
        conflicts: dict[str, list[Path]] = {}
        current = as_maps(current)
        for path, value in applied.items():
            present, existing = _lookup(current, path)
            for other, paths in self.owned.items():
                if other != key and path in paths and (not present or existing != value):
                    conflicts.setdefault(other[0], []).append(path)
        if conflicts and not force:
            raise _conflict_error(conflicts, self.api_version)
        result = copy.deepcopy(current)
        others: set[Path] = set().union(*[p for k, p in self.owned.items() if k != key])
        for path in self.owned.get(key, set()) - set(applied) - others:
            _remove(result, path)
        body = {k: v for k, v in config.items() if k not in ("apiVersion", "kind")}
        meta = dict(body.get("metadata") or {})
        for system in _SYSTEM_META:
            meta.pop(system, None)
        if meta:
            body["metadata"] = meta
        else:
            body.pop("metadata", None)
        if status_subresource:
            body = {k: v for k, v in body.items() if (k == "status") == (scope == "status")}
        result = as_lists(dict(_merge(result, as_maps(body))))
        if force:
            for other, paths in self.owned.items():
                if other != key:
                    paths.difference_update(applied)
        if self.owned.get(key) != set(applied):
            self.times[key] = now
        self.owned[key] = set(applied)
        return result


def _conflict_error(conflicts: dict[str, list[Path]], api_version: str) -> ApiError:
    causes = []
    lines = []
    for manager, paths in sorted(conflicts.items()):
        for path in sorted(paths):
            field = "." + ".".join(path)
            causes.append({"reason": "FieldManagerConflict",
                           "message": f'conflict with "{manager}" using {api_version}',
                           "field": field})
            lines.append((manager, field))
    if len(lines) == 1:
        manager, field = lines[0]
        message = (f'Apply failed with 1 conflict: conflict with "{manager}" using '
                   f"{api_version}: {field}")
    else:
        parts = []
        for manager in sorted(conflicts):
            fields = "\n".join(f"- {f}" for m, f in lines if m == manager)
            parts.append(f'conflicts with "{manager}" using {api_version}:\n{fields}')
        message = f"Apply failed with {len(lines)} conflicts: " + "\n".join(parts)
    return ApiError(409, "Conflict", message, {"causes": causes})
