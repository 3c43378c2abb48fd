"""The test API server checks ``status.devices`` as the apiserver does (real HTTP)."""

from __future__ import annotations

from typing import Any

import pytest

from gpudra.kube.errors import Invalid
from gpudra.kube.raw_api import RESOURCE_CLAIMS, RawApi
from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.fakeapi.fixtures import api_session, fake_api  # noqa: F401

DRIVER = "gpu.nvidia.com"
SHARE = "0b7c3f4e-2a1d-4e5f-9a8b-7c6d5e4f3a2b"


@pytest.fixture
def claim(fake_api: FakeApiServer) -> None:  # noqa: F811
    results = [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
               {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-1",
                "shareID": SHARE}]
    fake_api.put({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                  "metadata": {"name": "c1", "namespace": "ns"},
                  "spec": {"devices": {"requests": [
                      {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
                  "status": {"allocation": {"devices": {"results": results}}}})


def entry(**fields: Any) -> dict[str, Any]:
    return {"driver": DRIVER, "pool": "node-a", "device": "gpu-0", **fields}


def ready(**fields: Any) -> dict[str, Any]:
    return {"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z", **fields}


async def apply(session: ApiSession, *devices: dict[str, Any]) -> dict[str, Any]:
    return await RawApi(session).apply(
        RESOURCE_CLAIMS, "c1", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                "status": {"devices": list(devices)}},
        namespace="ns", subresource="status", field_manager=DRIVER)


async def test_a_well_formed_entry_is_accepted(claim, api_session):  # noqa: F811
    stored = await apply(api_session, entry(conditions=[ready()], data={"uuid": "GPU-1"}),
                         entry(device="gpu-1", shareID=SHARE, networkData={
                             "interfaceName": "eth0", "ips": ["10.0.0.1/24", "fd00::1/64"],
                             "hardwareAddress": "aa:bb:cc:dd:ee:ff"}))
    assert len(stored["status"]["devices"]) == 2


@pytest.mark.parametrize(("device", "field", "message"), [
    (entry(device="gpu-9"), "status.devices[0]", "must be an allocated device in the claim"),
    (entry(device="gpu-1", shareID="NOT-A-UUID"), "status.devices[0].shareID",
     "must be a lowercase UUID"),
    (entry(conditions=[ready(reason="not ok!")]), "status.devices[0].conditions[0].reason",
     "a condition reason must start"),
    (entry(conditions=[ready(status="Yes")]), "status.devices[0].conditions[0].status",
     "supported values"),
    (entry(conditions=[ready(lastTransitionTime="")]),
     "status.devices[0].conditions[0].lastTransitionTime", "Required value"),
    (entry(conditions=[ready(), ready()]), "status.devices[0].conditions[1].type",
     "Duplicate value"),
    (entry(conditions=[ready(type=f"T{i}") for i in range(9)]), "status.devices[0].conditions",
     "must have at most 8 items"),
    (entry(data={"blob": "x" * 10240}), "status.devices[0].data", "may not be more than"),
    (entry(data=["not", "an", "object"]), "status.devices[0].data", "valid JSON object"),
    (entry(networkData={"ips": ["10.0.0.1"]}), "status.devices[0].networkData.ips[0]",
     "CIDR"),
    (entry(networkData={"ips": [f"10.0.0.{i}/24" for i in range(17)]}),
     "status.devices[0].networkData.ips", "must have at most 16 items"),
    (entry(networkData={"interfaceName": "e" * 257}),
     "status.devices[0].networkData.interfaceName", "may not be more than 256"),
])
async def test_the_apiservers_rules_hold(claim, api_session, device, field, message):  # noqa: F811
    with pytest.raises(Invalid) as failure:
        await apply(api_session, device)
    assert field in str(failure.value)
    assert message in str(failure.value)
