"""The reflector's cache keeps stored slices as compressed text: reads give fresh, equal
objects."""

from __future__ import annotations

import json
import tracemalloc

from gpudra.controller.slice_reflector import SliceCache
from gpudra.testing.fakeapi import samples


def stored(name: str, rv: str | None) -> dict:
    obj = samples.resource_slice(name, devices=[samples.device("gpu-0")])
    if rv is not None:
        obj["metadata"]["resourceVersion"] = rv
    return obj


def test_a_read_gives_back_what_was_put_as_a_fresh_object():
    obj = stored("node-1-gpu", "12")
    cache = SliceCache([obj])
    first = cache["node-1-gpu"]
    assert first == obj and first is not obj
    first["spec"]["devices"].clear()  # a reader's change stays with the reader
    assert cache["node-1-gpu"] == obj
    assert list(cache) == ["node-1-gpu"] and len(cache) == 1 and "node-1-gpu" in cache
    assert dict(cache.items()) == {"node-1-gpu": obj}


def test_versions_are_kept_beside_the_text():
    cache = SliceCache([stored("a", "7"), stored("b", None), stored("c", "not-a-number")])
    assert (cache.version("a"), cache.version("b"), cache.version("c")) == (7, None, None)
    assert cache.version("missing") is None
    cache.put(stored("a", "9"))
    assert cache.version("a") == 9 and cache["a"]["metadata"]["resourceVersion"] == "9"


def test_drop_forgets_a_name_once():
    cache = SliceCache([stored("a", "7")])
    assert cache.drop("a") is True
    assert cache.drop("a") is False
    assert "a" not in cache and cache.get("a") is None and cache.version("a") is None


def test_a_large_slice_is_kept_compressed():
    # Idle memory: a slice is kept as compressed JSON, far smaller than its text.
    obj = stored("node-1-gpu", "3")
    obj["spec"]["devices"] = [samples.device(f"gpu-{i}") for i in range(200)]
    text = json.dumps(obj, separators=(",", ":"))
    tracemalloc.start()
    try:
        cache = SliceCache([obj])
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < len(text) / 5, (kept, len(text))
    assert cache["node-1-gpu"] == obj
