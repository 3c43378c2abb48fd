"""The fake's pure building blocks: quantities, patches, selectors, apply ownership."""

from __future__ import annotations

import pytest

from gpudra.testing.fakeapi import quantity
from gpudra.testing.fakeapi.apply import ManagedFields, from_fields_v1, leaves, to_fields_v1
from gpudra.testing.fakeapi.errors import ApiError, DecodeError
from gpudra.testing.fakeapi.patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from gpudra.testing.fakeapi.selectors import (
    labels_match,
    parse_field_selector,
    parse_label_selector,
)


@pytest.mark.parametrize(("given", "stored"), [
    ("1024Mi", "1Gi"), ("81920Mi", "80Gi"), ("1536Mi", "1536Mi"), ("0.5Gi", "512Mi"),
    ("1000", "1k"), ("1500", "1500"), ("1.5", "1500m"), ("0.1", "100m"), ("100m", "100m"),
    ("1000M", "1G"), ("1e3", "1e3"), ("1.5e3", "1500"), ("0", "0"), ("0Gi", "0"),
    ("512Ki", "512Ki"), ("1.5Ki", "1536"), ("0.5Ki", "512"), ("-1024Mi", "-1Gi"),
    ("1n", "1n"), ("0.1n", "1n"), (7, "7"), ("10000", "10k"), ("1Ei", "1Ei"),
])
def test_quantities_are_stored_canonically_like_the_apiserver(given, stored):
    assert quantity.canonical(given) == stored


@pytest.mark.parametrize("bad", ["", "12 GiB", "1GB", "Gi", ".", "1.2.3", "abc", True, None])
def test_unparsable_quantities_are_decode_errors(bad):
    with pytest.raises(DecodeError, match=r"quantities must match|suffix"):
        quantity.canonical(bad)


def test_merge_patch_follows_rfc7386():
    target = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert merge_patch(target, {"a": {"b": None, "c": [3]}, "e": {"f": 1}}) == \
        {"a": {"c": [3]}, "d": 1, "e": {"f": 1}}
    assert target == {"a": {"b": 1, "c": [1, 2]}, "d": 1}  # untouched


def test_strategic_merge_patch_drops_directives():
    assert strategic_merge_patch({"a": 1}, {"b": 2, "$patch": "replace"}) == {"a": 1, "b": 2}


def test_json_patch_operations():
    doc = {"spec": {"devices": [{"name": "a"}], "x": 1}}
    out = json_patch(doc, [
        {"op": "test", "path": "/spec/x", "value": 1},
        {"op": "add", "path": "/spec/devices/-", "value": {"name": "b"}},
        {"op": "replace", "path": "/spec/x", "value": 2},
        {"op": "copy", "from": "/spec/x", "path": "/spec/y"},
        {"op": "move", "from": "/spec/y", "path": "/spec/z"},
        {"op": "remove", "path": "/spec/devices/0"},
        {"op": "add", "path": "/metadata~1x", "value": "escaped"},
    ])
    assert out == {"spec": {"devices": [{"name": "b"}], "x": 2, "z": 2}, "metadata/x": "escaped"}
    with pytest.raises(PatchError, match="test failed"):
        json_patch(doc, [{"op": "test", "path": "/spec/x", "value": 9}])
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "replace", "path": "/nope", "value": 1}])
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "remove", "path": "/spec/devices/5"}])


def test_field_selectors_parse_with_escapes_and_operators():
    terms = parse_field_selector(r"spec.nodeName=a\,b,spec.driver!=x,metadata.name==n")
    assert [(t.field, t.op, t.value) for t in terms] == [
        ("spec.nodeName", "=", "a,b"), ("spec.driver", "!=", "x"), ("metadata.name", "=", "n")]
    with pytest.raises(ApiError):
        parse_field_selector("nonsense")


def test_label_selectors_support_equality_and_sets():
    labels = {"app": "gpu", "tier": "node"}
    assert labels_match(parse_label_selector("app=gpu,tier!=x"), labels)
    assert labels_match(parse_label_selector("app in (gpu, cpu),!missing,tier"), labels)
    assert not labels_match(parse_label_selector("app notin (gpu)"), labels)
    assert not labels_match(parse_label_selector("missing"), labels)
    assert not labels_match(parse_label_selector("app==cpu"), labels)


def test_fields_v1_round_trips():
    paths = {("spec", "driver"), ("metadata", "labels", "a"), ("spec", "devices")}
    assert from_fields_v1(to_fields_v1(paths)) == paths


def test_apply_removes_fields_the_manager_stopped_applying_and_detects_conflicts():
    managed = ManagedFields(None, "v1")
    obj = {"metadata": {"name": "x"}, "spec": {"a": 1, "b": 2}}
    obj = managed.apply(obj, obj, "one", force=False, subresource="", status_subresource=False,
                        now="t")
    obj = managed.apply(obj, {"spec": {"a": 1}}, "one", force=False, subresource="",
                        status_subresource=False, now="t")
    assert obj["spec"] == {"a": 1}
    with pytest.raises(ApiError) as err:
        managed.apply(obj, {"spec": {"a": 5}}, "two", force=False, subresource="",
                      status_subresource=False, now="t")
    assert err.value.code == 409 and '"one"' in err.value.message and ".spec.a" in \
        err.value.message
    obj = managed.apply(obj, {"spec": {"a": 5}}, "two", force=True, subresource="",
                        status_subresource=False, now="t")
    assert obj["spec"] == {"a": 5}
    assert {e["manager"] for e in managed.entries()} == {"two"}


def test_leaves_separate_status_from_the_main_resource():
    obj = {"apiVersion": "v1", "metadata": {"name": "n", "labels": {"a": "b"}},
           "spec": {"x": [1]}, "status": {"y": 1}}
    assert set(leaves(obj, status_subresource=True, scope="main")) == \
        {("metadata", "labels", "a"), ("spec", "x")}
    assert set(leaves(obj, status_subresource=True, scope="status")) == {("status", "y")}
