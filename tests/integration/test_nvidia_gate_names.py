"""``gpudra node`` started with NVIDIA's feature-gate names, as NVIDIA's chart values render
them: it runs, uses the gate they mean, and logs which name to use instead."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from gpudra.testing.fakeapi.server import FakeApiServer
from tests.integration.daemon import Daemon


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    made = Daemon(fake_api.url, kubelet=False, extra_args=[
        "--feature-gates", "NVMLDeviceHealthCheck=false,IMEXDaemonsWithDNSNames=true,"
                           "PassthroughSupport=false"])
    yield made
    if made.process is not None and made.process.poll() is None:
        made.stop()
    shutil.rmtree(made.base, ignore_errors=True)


def test_nvidia_gate_names_are_accepted_and_logged(daemon):
    daemon.start()
    events = daemon.events()
    assert events[0]["event"] == "starting node daemon"
    assert events[0]["feature_gates"]["DeviceHealthCheck"] is False
    warnings = [e["event"] for e in events if e.get("level") == "warning"]
    assert any("NVMLDeviceHealthCheck is NVIDIA's name for DeviceHealthCheck" in w
               and "use DeviceHealthCheck=false" in w for w in warnings), warnings
    assert any("feature gate IMEXDaemonsWithDNSNames is ignored" in w for w in warnings)
    assert daemon.stop() == 0
