"""Two ``gpudra controller`` processes: only the Lease holder acts; the other takes over
when the leader stops; a leader that loses its Lease stops acting and exits with an error."""

from __future__ import annotations

from pathlib import Path

from gpudra.testing.fakeapi.server import FakeApiServer
from tests.controller.compute_domains.harness import (
    DRIVER_NS,
    ControllerProcess,
    create_domain,
    wait_for,
)

FAST = ("--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "0.2s")
LEASE = "gpudra-compute-domain-controller"


def _holder(api: FakeApiServer) -> str:
    return str(((api.get("Lease", LEASE, DRIVER_NS) or {}).get("spec") or {})
               .get("holderIdentity") or "")


def test_only_the_leader_acts_and_the_standby_takes_over(api: FakeApiServer,
                                                         tmp_path: Path) -> None:
    a = ControllerProcess(api.url, tmp_path, identity="a", extra=FAST).start()
    b: ControllerProcess | None = None
    try:
        wait_for("a leads", lambda: "became the leader" in a.events())
        b = ControllerProcess(api.url, tmp_path, identity="b", extra=FAST).start()
        wait_for("b waits", lambda: "waiting for the lease" in b.events())
        create_domain(api, "first")
        wait_for("a made the template", lambda: api.get(
            "ResourceClaimTemplate", "first-channel", "team"))
        assert _holder(api) == "a"
        assert "caches filled; reconciling" in a.events()
        assert "became the leader" not in b.events()
        assert "caches filled; reconciling" not in b.events()  # b never even listed

        assert a.stop() == 0  # releases the Lease on its way out
        wait_for("b leads", lambda: "became the leader" in b.events())
        assert _holder(api) == "b"
        create_domain(api, "second")
        wait_for("b made the template", lambda: api.get(
            "ResourceClaimTemplate", "second-channel", "team"))
    finally:
        for proc in (a, b):
            if proc is not None:
                proc.stop()


def test_a_leader_that_loses_its_lease_stops(api: FakeApiServer, tmp_path: Path) -> None:
    a = ControllerProcess(api.url, tmp_path, identity="a", extra=FAST).start()
    try:
        wait_for("a leads", lambda: "became the leader" in a.events())
        lease = api.get("Lease", LEASE, DRIVER_NS)
        assert lease is not None
        # Another candidate took it (as after a long pause of this process).
        api.modify("Lease", LEASE, {"spec": {"holderIdentity": "intruder",
                                             "leaseDurationSeconds": 3600}}, DRIVER_NS)
        assert a.process is not None
        code = a.process.wait(timeout=60)
        assert code == 1
        assert "lost the lease" in a.events()
        assert _holder(api) == "intruder"  # not released: it was not ours any more
    finally:
        a.stop()
