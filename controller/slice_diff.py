"""Desired vs stored ResourceSlices: semantic comparison and the write plan for one pool.

Pure functions on plain JSON-shaped dicts; no I/O.

A stored slice *says the same* as a desired one (``slice_difference`` is ``None``) when:

* ``spec`` is equal field by field, except that
  - quantities compare by value (``1024Mi`` == ``1Gi``: the apiserver canonicalises them),
  - ``taints[].timeAdded`` is ignored when the desired taint has none (the server fills it
    in) and otherwise compared as a time, within ±1 s (as Go's ``DevicesDeepEqual``),
  - a missing field equals an empty one (``null``, ``[]``, ``{}``), as Go's semantic
    deep-equal treats nil and empty alike;
* scalar types match exactly: ``{"int": 1}`` ≠ ``{"string": "1"}`` and ``true`` ≠ ``1``;
* list order matters (device order is allocation priority); map key order does not;
* in ``metadata`` only ``name`` must match, and our ``labels`` and ``ownerReferences`` must be
  present; everything else there is the server's (uid, resourceVersion, managedFields, …).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from gpudra.api.quantity import QuantityError, parse_quantity
from gpudra.kube.objects import object_name

Obj = Mapping[str, Any]
Path = tuple[str | int, ...]

_ANY_KEY: Final = "*"
_ANY_INDEX: Final = "[]"
_DEVICE: Final = ("devices", _ANY_INDEX)
_POLICY: Final = (*_DEVICE, "capacity", _ANY_KEY, "requestPolicy")

QUANTITY_PATHS: Final[tuple[tuple[str, ...], ...]] = (
    (*_DEVICE, "capacity", _ANY_KEY, "value"),
    (*_POLICY, "default"),
    (*_POLICY, "validValues", _ANY_INDEX),
    (*_POLICY, "validRange", "min"),
    (*_POLICY, "validRange", "max"),
    (*_POLICY, "validRange", "step"),
    (*_DEVICE, "consumesCounters", _ANY_INDEX, "counters", _ANY_KEY, "value"),
    ("sharedCounters", _ANY_INDEX, "counters", _ANY_KEY, "value"),
)
"""Where quantities sit in a ``ResourceSliceSpec`` (``*``: any map key, ``[]``: any index)."""

TIME_ADDED_PATH: Final = (*_DEVICE, "taints", _ANY_INDEX, "timeAdded")
TIME_TOLERANCE_SECONDS: Final = 1.0
_OWNER_KEYS: Final = ("apiVersion", "kind", "name", "uid", "controller")


# --- one slice ----------------------------------------------------------------------------


def slice_difference(desired: Obj, actual: Obj) -> str | None:
    """``None`` if ``actual`` (as stored) says what ``desired`` says; else the first field
    that differs, e.g. ``spec.devices[3].capacity.memory.value``."""
    meta, stored_meta = desired.get("metadata") or {}, actual.get("metadata") or {}
    if meta.get("name") != stored_meta.get("name"):
        return "metadata.name"
    labels, stored_labels = meta.get("labels") or {}, stored_meta.get("labels") or {}
    for key in sorted(labels):
        if stored_labels.get(key) != labels[key]:
            return f"metadata.labels[{key}]"
    stored_owners = [_owner_key(ref) for ref in stored_meta.get("ownerReferences") or []]
    for ref in meta.get("ownerReferences") or []:
        if _owner_key(ref) not in stored_owners:
            return "metadata.ownerReferences"
    spec, stored_spec = desired.get("spec"), actual.get("spec")
    if _canonical_json(spec) == _canonical_json(stored_spec):
        return None  # the common case, and far cheaper than the walk below
    path = _difference(spec, stored_spec, ())
    return None if path is None else _render("spec", path)


def slices_equal(desired: Obj, actual: Obj) -> bool:
    return slice_difference(desired, actual) is None


def _canonical_json(value: Any) -> str:
    """Equal text implies semantic equality (JSON keeps true apart from 1)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _owner_key(ref: Any) -> tuple[Any, ...]:
    if not isinstance(ref, Mapping):
        return (ref,)
    return tuple(ref.get(key) for key in _OWNER_KEYS)


# Patterns still reachable from a node, as (what it is, the steps left to take).
_Live = tuple[tuple[str, tuple[str, ...]], ...]
_QUANTITY: Final = "quantity"
_TIME: Final = "time"
_ROOT: Final[_Live] = (*((_QUANTITY, p) for p in QUANTITY_PATHS), (_TIME, TIME_ADDED_PATH))


def _step(live: _Live, step: str | int) -> _Live:
    """The patterns that still match after descending into ``step``."""
    return tuple((what, rest[1:]) for what, rest in live if rest and (
        (rest[0] == _ANY_INDEX and isinstance(step, int))
        or (rest[0] == _ANY_KEY and isinstance(step, str))
        or rest[0] == step))


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, list | dict) and not value)


def _difference(desired: Any, actual: Any, path: Path, live: _Live = _ROOT) -> Path | None:
    if _is_empty(desired) and _is_empty(actual):
        return None
    done = {what for what, rest in live if not rest}
    if _QUANTITY in done:
        return None if _same_quantity(desired, actual) else path
    if _TIME in done:
        return None if _same_time(desired, actual) else path
    if isinstance(desired, Mapping) and isinstance(actual, Mapping):
        for key in sorted(set(desired) | set(actual), key=str):
            sub = _step(live, key)
            if key not in desired and any(w == _TIME and not r for w, r in sub):
                continue  # server-set: the desired taint leaves the time to the apiserver
            found = _difference(desired.get(key), actual.get(key), (*path, key), sub)
            if found is not None:
                return found
        return None
    if isinstance(desired, list) and isinstance(actual, list):
        if len(desired) != len(actual):
            return path
        for i, (mine, theirs) in enumerate(zip(desired, actual, strict=True)):
            found = _difference(mine, theirs, (*path, i), _step(live, i))
            if found is not None:
                return found
        return None
    # bool is an int in Python, and 1 == True: compare the JSON types first.
    if type(desired) is not type(actual) or desired != actual:
        return path
    return None


def _same_quantity(desired: Any, actual: Any) -> bool:
    if type(desired) is type(actual) and desired == actual:
        return True
    if isinstance(desired, bool) or isinstance(actual, bool):
        return type(desired) is type(actual) and desired == actual
    try:
        return parse_quantity(desired) == parse_quantity(actual)
    except (QuantityError, TypeError):
        return bool(desired == actual)


def _same_time(desired: Any, actual: Any) -> bool:
    if not isinstance(desired, str) or not isinstance(actual, str):
        return bool(desired == actual)
    try:
        delta = datetime.fromisoformat(desired) - datetime.fromisoformat(actual)
    except (ValueError, TypeError):  # unparsable, or naive vs aware
        return desired == actual
    return abs(delta.total_seconds()) <= TIME_TOLERANCE_SECONDS


def _render(root: str, path: Path) -> str:
    out = root
    for step in path:
        if isinstance(step, int) or "/" in step or "." in step:
            out += f"[{step}]"
        else:
            out += f".{step}"
    return out


# --- the pool -----------------------------------------------------------------------------


def slice_generation(obj: Obj) -> int:
    """``spec.pool.generation``, 0 when missing or malformed."""
    value = ((obj.get("spec") or {}).get("pool") or {}).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def slice_devices(obj: Obj) -> int:
    return len((obj.get("spec") or {}).get("devices") or [])


@dataclass(frozen=True)
class Update:
    desired: dict[str, Any]
    actual: Obj
    reason: str
    """The first differing field, for logs."""

    @property
    def name(self) -> str:
        return object_name(self.desired)


@dataclass(frozen=True)
class SyncPlan:
    """What to write, in order: delete, then update, then create."""

    generation: int
    bumped: bool
    """The pool moves to a new generation, so every slice is (re)written."""
    desired: tuple[dict[str, Any], ...]
    deletes: tuple[Obj, ...] = ()
    updates: tuple[Update, ...] = ()
    creates: tuple[dict[str, Any], ...] = ()
    current_generation: int = 0

    @property
    def writes(self) -> int:
        return len(self.deletes) + len(self.updates) + len(self.creates)

    @property
    def devices(self) -> int:
        return sum(slice_devices(s) for s in self.desired)


def plan_sync(
    build: Callable[[int], Sequence[dict[str, Any]]],
    actual: Mapping[str, Obj],
    *,
    same: Callable[[Obj, Obj], bool] = slices_equal,
    floor: int = 0,
    resume: int | None = None,
) -> SyncPlan:
    """Plan the writes that turn the stored slices ``actual`` (name → object) into
    ``build(generation)``.

    Generation rule (as the Go resourceslice controller): the pool keeps the highest stored
    generation when no slice is new and at most one changed, so the scheduler sees either the
    old or the new pool, never a mix. Otherwise it moves to ``max(stored, floor) + 1`` and
    every slice is rewritten with it; until the last write lands the new generation is
    incomplete and the scheduler skips the pool instead of allocating from half of it.
    ``resume`` continues such a move that was cut short (only pass the generation of a move
    made for the same desired state): the slices already at that generation are ours, so
    the remaining ones are written at it instead of starting over. Slices that are no longer
    desired are deleted; on their own they do not move the generation.
    """
    current = max((slice_generation(obj) for obj in actual.values()), default=0)
    desired = list(build(current))
    wanted = {object_name(obj) for obj in desired}
    deletes = tuple(actual[name] for name in sorted(actual) if name not in wanted)
    new = [obj for obj in desired if object_name(obj) not in actual]
    changed = [obj for obj in desired
               if object_name(obj) in actual and not same(obj, actual[object_name(obj)])]
    keep = (resume is not None and resume == current) or (not new and len(changed) <= 1)
    generation, bumped = current, False
    if not keep:
        generation, bumped = max(current, floor) + 1, True
        desired = list(build(generation))
        new = [obj for obj in desired if object_name(obj) not in actual]
        changed = [obj for obj in desired
                   if object_name(obj) in actual and not same(obj, actual[object_name(obj)])]
    updates = tuple(
        Update(obj, actual[object_name(obj)],
               slice_difference(obj, actual[object_name(obj)]) or "differs")
        for obj in changed)
    return SyncPlan(generation=generation, bumped=bumped, desired=tuple(desired),
                    deletes=deletes, updates=updates, creates=tuple(new),
                    current_generation=current)


def vanished(plan: SyncPlan, published: Iterable[str]) -> list[str]:
    """Slices this plan re-creates although we had published them: someone deleted them."""
    names = set(published)
    return [object_name(obj) for obj in plan.creates if object_name(obj) in names]


def replacement(actual: Obj, desired: Obj) -> dict[str, Any]:
    """The body for a PUT that turns ``actual`` into ``desired``.

    Starts from the stored object as raw JSON, so metadata others put there (annotations,
    finalizers, their labels) survives; takes ``spec`` whole from ``desired`` (we own it),
    adds our labels, and puts our owner reference in place of any other controller. Keeps
    ``resourceVersion`` (an optimistic-concurrency precondition) and drops ``managedFields``
    (the server maintains them).
    """
    meta = {k: v for k, v in (actual.get("metadata") or {}).items() if k != "managedFields"}
    want = desired.get("metadata") or {}
    if want.get("labels"):
        meta["labels"] = {**(meta.get("labels") or {}), **want["labels"]}
    owners = list(want.get("ownerReferences") or [])
    if owners:
        ours = {ref.get("uid") for ref in owners}
        others = [ref for ref in meta.get("ownerReferences") or []
                  if isinstance(ref, Mapping) and not ref.get("controller")
                  and ref.get("uid") not in ours]
        meta["ownerReferences"] = owners + others
    return {**actual, "apiVersion": desired.get("apiVersion"), "kind": desired.get("kind"),
            "metadata": meta, "spec": desired.get("spec")}
