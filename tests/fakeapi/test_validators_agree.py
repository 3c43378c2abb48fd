"""The two copies of the apiserver's ResourceSlice rules agree with each other.

``gpudra.controller.slice_validation`` (what the publisher checks before sending) and the fake
API server's validation were written independently from the same reference, so that each
checks the other. Every slice of the controller's rule table is POSTed (dry run) to the fake
server over HTTP: where the controller accepts, the server must accept; where it rejects, the
server must answer 422 with the very message the controller renders, or 400 where the
apiserver's JSON decoder fails first. Cases where the two still differ are listed with why.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpudra.api.field_errors import format_invalid
from gpudra.controller.slice_validation import validate_slice
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.controller.test_slice_validation import INVALID, VALID

DECODED_BY_THE_SERVER = {
    # Wrong JSON types and unparsable quantities fail in the apiserver's decoder (400); the
    # controller checks dicts, which have no decoder, so it reports them as field errors.
    "pool-generation-not-int", "int-as-string", "int-over-int64", "bool-as-int",
    "capacity-not-quantity", "counter-not-quantity", "device-not-object", "spec-not-object",
}

KNOWN_DIFFERENCES = {
    # Both reject; the fake names the object before validating it and then checks only the
    # generated name, the apiserver reports both generateName and the generated name.
    "generate-name-bad": "the fake does not check generateName itself",
    # Both reject; apimachinery's IsDNS1123Label says "must not contain dots" for a valid
    # subdomain, which the fake does not special-case.
    "device-name-dots": "the fake does not say 'must not contain dots'",
    # Both reject, with different errors for an empty value: not settled against 1.37 yet.
    "driver-missing": "an empty driver: Required alone, or Required and Invalid",
    "device-name-missing": "an empty device name: Required, or Invalid",
}
"""Cases where the two copies give different errors, and which detail differs."""

ACCEPTED_BY_THE_FAKE = {
    # The fake takes a capacity without a value as zero, as Go's decoder leaves it.
    "capacity-value-missing",
}
"""Cases the controller rejects but the fake accepts (the controller is the stricter)."""


@pytest.fixture(scope="module")
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as fake:
        yield fake


def post_dry_run(server: FakeApiServer, obj: Any) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{server.url}/apis/resource.k8s.io/v1/resourceslices?dryRun=All", method="POST",
        data=json.dumps(obj).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


@pytest.mark.parametrize("obj", list(VALID.values()), ids=list(VALID))
def test_what_the_controller_accepts_the_server_accepts(server, obj):
    assert validate_slice(obj) == []
    code, body = post_dry_run(server, obj)
    assert code == 201, body


@pytest.mark.parametrize("name", list(INVALID))
def test_what_the_controller_rejects_the_server_rejects_in_the_same_words(server, name):
    obj, _ = INVALID[name]
    errors = validate_slice(obj)
    assert errors
    code, body = post_dry_run(server, obj)
    if name in ACCEPTED_BY_THE_FAKE:
        assert code == 201, body
    elif name in DECODED_BY_THE_SERVER:
        assert (code, body["reason"]) == (400, "BadRequest"), body
    elif name in KNOWN_DIFFERENCES:
        assert code == 422, body
    else:
        assert code == 422, body
        assert body["message"] == format_invalid(obj["metadata"].get("name", ""), errors)


def test_the_lists_of_differences_name_real_cases():
    listed = DECODED_BY_THE_SERVER | set(KNOWN_DIFFERENCES) | ACCEPTED_BY_THE_FAKE
    assert listed <= set(INVALID)
