"""The identifier rules and the bounded JSON decoder of the daemon's edge."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudra.api import bounded_json
from gpudra.api.identifiers import (
    IdentifierError,
    check_claim,
    check_driver,
    check_label,
    check_pool,
    check_request,
    check_subdomain,
    check_uid,
    claim_problems,
    safe_component,
    shown,
)
from gpudra.api.name_formats import dns1123_label_errors, dns1123_subdomain_errors

UID = "0b0e3a9c-1d2e-4f30-8a4b-5c6d7e8f9a0b"


@pytest.mark.parametrize("uid", [
    "/etc", "../../../../x", "..", ".", "", UID.upper(), UID + "\n", UID[:-1], "a" * 36,
    f"{UID}/..", " " + UID[1:], "x" * 10_000, "0b0e3a9c_1d2e_4f30_8a4b_5c6d7e8f9a0b",
])
def test_uids_that_are_not_lower_case_uuids_are_refused(uid):
    with pytest.raises(IdentifierError, match=r"^uid "):
        check_uid(uid)


def test_a_uuid_passes_and_a_wrong_type_is_named():
    assert check_uid(UID) == UID
    with pytest.raises(IdentifierError, match=r"metadata\.uid must be a string, got int"):
        check_uid(7, "metadata.uid")


@pytest.mark.parametrize(("namespace", "name", "field"), [
    ("default", "../x", "name"), ("default", "a/b", "name"), ("Default", "c", "namespace"),
    ("a.b", "c", "namespace"), ("x" * 64, "c", "namespace"), ("default", "c" * 254, "name"),
    ("", "c", "namespace"), ("default", "", "name"), ("default", "c\x00", "name"),
])
def test_claim_names_follow_their_kubernetes_rules(namespace, name, field):
    with pytest.raises(IdentifierError, match=f"^{field} "):
        check_claim(namespace, name, UID)


def test_valid_names_pass():
    assert check_claim("kube-system", "my-claim.v1", UID) == ("kube-system", "my-claim.v1", UID)
    assert check_driver("gpu.nvidia.com") == "gpu.nvidia.com"
    assert check_pool("node-a/part-1") == "node-a/part-1"
    assert check_request("gpu/small") == "gpu/small"
    for bad, check in (("GPU.nvidia.com", check_driver), ("x" * 64, check_driver),
                       ("a//b", check_pool), ("a/b/c", check_request), ("..", check_request)):
        with pytest.raises(IdentifierError):
            check(bad)


def test_shown_quotes_escapes_and_cuts():
    assert shown("a\nb") == "'a\\nb'"
    assert shown("x" * 1000).endswith("... (1000 characters)")
    assert len(shown("x" * 1000)) < 120
    assert shown(None) == "of type NoneType"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/", "a\0b", "x" * 256])
def test_a_path_component_is_one_plain_name(name):
    with pytest.raises(IdentifierError):
        safe_component(name, "name")


def test_json_nested_deeper_than_the_bound_is_refused_before_decoding():
    deep = b"[" * 5000 + b"]" * 5000
    with pytest.raises(bounded_json.JsonTooDeep, match=r"5000 levels deep \(at most 100\) at "
                       r"\[0\]\[0\]"):
        bounded_json.loads(deep)
    nested = b'{"a": [1, {"b": {"c": ' + b"[" * 200 + b"]" * 200 + b"}}]}"
    with pytest.raises(bounded_json.JsonTooDeep, match=r"at a\[1\]\.b\.c\[0\]"):
        bounded_json.loads(nested)
    # A string full of brackets is text, not nesting.
    text = json.dumps({"a": "[" * 500, "b": "\\\"{{{"}).encode()
    assert bounded_json.depth(text) == 1
    assert bounded_json.loads(text)["a"] == "[" * 500
    at_bound = b"[" * 100 + b"]" * 100
    assert bounded_json.depth(at_bound) == 100
    bounded_json.loads(at_bound)
    with pytest.raises(bounded_json.JsonTooDeep):
        bounded_json.loads(b"[" * 101 + b"]" * 101)
    assert isinstance(bounded_json.JsonTooDeep("x"), ValueError)


NAMEISH = st.one_of(
    st.from_regex(r"[a-z0-9][-a-z0-9./]{0,70}[a-z0-9]?", fullmatch=True),
    st.text(alphabet="abc-.0/A_", max_size=300), st.just("a" * 63), st.just("a" * 64),
    st.just(".".join(["a" * 63] * 4)), st.just(".".join(["a" * 63] * 4) + "a"))


def passes(check, value) -> bool:
    try:
        check(value, "x")
    except IdentifierError:
        return False
    return True


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(namespace=NAMEISH, name=NAMEISH, uid=st.one_of(st.uuids().map(str), NAMEISH))
def test_the_fast_paths_agree_with_apimachinery_rules(namespace, name, uid):
    """Each check's one-regex path says "valid" exactly when the apimachinery rules
    (api/name_formats.py) do."""
    for value in (namespace, name):
        assert passes(check_label, value) == (dns1123_label_errors(value) == [])
        assert passes(check_subdomain, value) == (dns1123_subdomain_errors(value) == [])
        assert passes(check_pool, value) == (len(value) <= 253 and not any(
            dns1123_subdomain_errors(part) for part in value.split("/")))
        parts = value.split("/")
        assert passes(check_request, value) == (len(parts) <= 2 and not any(
            dns1123_label_errors(part) for part in parts))
    rules = passes(check_label, namespace) and passes(check_subdomain, name) \
        and passes(check_uid, uid)
    assert (claim_problems(namespace, name, uid) == []) == rules


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(alphabet='[]{}"\\a:,', max_size=4), inner, max_size=3),
    max_leaves=20)


def nesting(value) -> int:
    if isinstance(value, list):
        return 1 + max((nesting(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((nesting(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(value=JSON)
def test_the_depth_scan_counts_nesting_not_brackets_in_strings(value):
    body = json.dumps(value).encode()
    assert bounded_json.depth(body) == nesting(value)
    assert bounded_json.loads(body, max_depth=max(nesting(value), 1)) == value
