"""Allocation results of shares decoded strictly: shareID and consumedCapacity."""

from __future__ import annotations

from typing import Any

import pytest

from gpudra.driver.claims import ClaimError
from gpudra.kubeletplugin.claims.claim_decoding import decode_claim

UID = "11111111-1111-4111-8111-111111111111"
SHARE = "5a5a5a5a-0000-4000-8000-00000000000a"
DRIVER = "gpu.nvidia.com"


def raw(**result: Any) -> dict[str, Any]:
    base = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0-shared"}
    return {"metadata": {"uid": UID},
            "status": {"allocation": {"devices": {"results": [{**base, **result}]}}}}


def decode(claim: dict[str, Any]):
    return decode_claim(claim, namespace="ns", name="c", uid=UID, driver=DRIVER)


def test_share_id_and_consumed_capacity_are_decoded():
    claim = decode(raw(shareID=SHARE, consumedCapacity={
        "memory": "20Gi", "multiprocessors": "33", "shares": "1"}))
    device = claim.devices[0]
    assert device.share_id == SHARE
    assert device.consumed_capacity == {"memory": 20 << 30, "multiprocessors": 33, "shares": 1}


def test_canonical_forms_compare_by_value():
    device = decode(raw(shareID=SHARE, consumedCapacity={"memory": "20480Mi"})).devices[0]
    assert device.consumed_capacity == {"memory": 20 << 30}


def test_a_full_gpu_has_neither():
    device = decode(raw(device="gpu-0")).devices[0]
    assert device.share_id is None and device.consumed == ()


@pytest.mark.parametrize(("result", "message"), [
    ({"shareID": "NOT-A-UUID"}, r"results\[0\]\.shareID 'NOT-A-UUID' is not a lower-case UUID"),
    ({"shareID": SHARE.upper()}, "is not a lower-case UUID"),
    ({"shareID": 7}, r"results\[0\]\.shareID 7"),
    ({"consumedCapacity": {"memory": "20 gigs"}},
     r"results\[0\]\.consumedCapacity\.memory: invalid quantity"),
    ({"consumedCapacity": {"memory": True}}, r"consumedCapacity\.memory: expected a quantity"),
    ({"consumedCapacity": {"multiprocessors": "1500m"}},
     r"consumedCapacity\.multiprocessors: '1500m' is not a whole"),
    ({"consumedCapacity": {"memory": "-1Gi"}}, r"consumedCapacity\.memory: '-1Gi' is not"),
    ({"consumedCapacity": ["memory"]}, r"consumedCapacity must be a map of quantities"),
])
def test_bad_values_name_the_claim_and_the_field(result, message):
    prefix = rf"claim ns/c:{UID}: status\.allocation\.devices\."
    pattern = prefix + message if message.startswith("results") else message
    with pytest.raises(ClaimError, match=pattern) as info:
        decode(raw(**result))
    assert f"ns/c:{UID}" in str(info.value)
