"""adminAccess observes a device; it never creates, destroys or reconfigures hardware
(issue 27 item 6), through the real ``gpudra node`` over gRPC on a simulated DGX H100."""

from __future__ import annotations

from gpudra.api.claims import ClaimRef
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon, claim_object
from tests.trust.conftest import cdi_specs, hardware

MIG = "gpu-3-mig-1g10gb-19-6"  # made on demand: no GPU instance until a claim needs it


def stored(api: FakeApiServer, name: str, **kwargs: object) -> ClaimRef:
    meta = api.put(claim_object(name, devices=[MIG], request="mig", **kwargs))["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


async def test_admin_access_never_creates_a_mig_device_and_observes_an_existing_one(
        kubelet: KubeletEmulator, node: Daemon, api: FakeApiServer) -> None:
    admin = stored(api, "admin-observer", admin_access=True)
    regular = stored(api, "regular-user")
    baseline = hardware(node)

    # Not made yet: the admin claim is refused and the GPU stays as it was.
    entry = (await kubelet.prepare([admin]))[admin.uid]
    assert "adminAccess" in entry["error"] and MIG in entry["error"], entry
    assert "does not exist" in entry["error"]
    assert entry["devices"] == []
    assert hardware(node) == baseline
    assert cdi_specs(node) == []

    # The claim the scheduler gave the device makes it.
    assert (await kubelet.prepare([regular]))[regular.uid]["error"] == ""
    made = hardware(node)
    assert made != baseline

    # Now it exists, the admin claim observes it: same MIG device, nothing changed.
    entry = (await kubelet.prepare([admin]))[admin.uid]
    assert entry["error"] == "", entry
    assert [d["device_name"] for d in entry["devices"]] == [MIG]
    assert hardware(node) == made
    assert (await kubelet.unprepare([admin]))[admin.uid]["error"] == ""
    assert hardware(node) == made  # the observer leaving destroys nothing

    assert (await kubelet.unprepare([regular]))[regular.uid]["error"] == ""
    assert hardware(node) == baseline
    assert cdi_specs(node) == []


async def test_the_device_goes_with_its_maker_and_the_observer_leaves_cleanly(
        kubelet: KubeletEmulator, node: Daemon, api: FakeApiServer) -> None:
    admin = stored(api, "admin-watcher", admin_access=True)
    regular = stored(api, "regular-owner")
    baseline = hardware(node)
    assert (await kubelet.prepare([regular]))[regular.uid]["error"] == ""
    assert (await kubelet.prepare([admin]))[admin.uid]["error"] == ""
    # The maker leaves first: its MIG device goes (an observer does not keep it).
    assert (await kubelet.unprepare([regular]))[regular.uid]["error"] == ""
    assert hardware(node) == baseline
    assert (await kubelet.unprepare([admin]))[admin.uid]["error"] == ""
    assert hardware(node) == baseline
    assert cdi_specs(node) == []
