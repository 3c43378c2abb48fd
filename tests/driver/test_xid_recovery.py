"""XIDs classified by the recovery they need: NVML's GPU recovery action where the driver
offers it, NVIDIA's XID catalog otherwise. Application XIDs clear after the quiet period;
reset- or reboot-required ones never clear by themselves, only once the driver reports the
GPU healthy again (or, on a driver without the field, once the GPU is seen again)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from gpudra.cli.main import build_parser
from gpudra.cli.node_cmd import node_config
from gpudra.cli.options import CliError
from gpudra.driver import gpu_recovery, sim, xid_catalog
from gpudra.driver.device_model import build_devices
from gpudra.driver.devices import Device, NodeDevices
from gpudra.driver.health import (
    TAINT_RECOVERY,
    TAINT_XID,
    GpuLostChanged,
    HealthEvent,
    HealthPolicy,
    HealthState,
    MigLocation,
    RecoveryActionChanged,
    XidObserved,
)
from gpudra.driver.health_monitor import HealthMonitor
from gpudra.driver.inventory import read_inventory, simulated_pcie_root
from gpudra.driver.metrics import GPU_RECOVERY_REQUIRED
from gpudra.driver.nvml import Nvml
from gpudra.kubeletplugin.node.node_config import NodeConfig
from tests.driver.test_health_watcher import PROBE_INTERVAL, WAIT_MS, Node, _wait_until_watching

A = "GPU-aaaa"
T0 = 1_700_000_000.0
RESET, REBOOT = 1, 2
MIG = MigLocation(19, 0)
DEVICES = NodeDevices((
    Device("gpu-0", "gpu-0", {"type": "gpu", "uuid": A}, {}),
    Device("gpu-0-mig-1g10gb-19-0", "gpu-0", {"type": "mig", "parentUUID": A}, {}),
))


def run(events: list[tuple[float, HealthEvent]], policy: HealthPolicy | None = None,
        *, expire_at: float | None = None) -> HealthState:
    state = HealthState(policy or HealthPolicy(quiet_period=60))
    for at, event in events:
        state = state.observe(event, T0 + at)
    return state.expire(T0 + expire_at) if expire_at is not None else state


def taints(state: HealthState, device: str = "gpu-0") -> list[tuple[str, str, str]]:
    (found,) = [d for d in state.apply(DEVICES).devices if d.name == device]
    return [(t.key, t.value, t.effect) for t in found.taints]


def status(state: HealthState, device: str = "gpu-0") -> str:
    return {h.device: h.status for h in state.device_health(DEVICES, T0)}[device]


# --- the catalog -------------------------------------------------------------------------------


def test_the_catalog_names_the_recovery_of_the_xids_that_matter():
    for xid in (13, 31, 43, 45):
        assert xid_catalog.recovery_of(xid) == "restart-app", xid
    for xid in (48, 63, 64, 74, 92, 94, 95, 119, 120):
        assert xid_catalog.recovery_of(xid) == "gpu-reset", xid
    assert xid_catalog.recovery_of(79) == "node-reboot"
    assert xid_catalog.recovery_of(4242) is None
    assert all(row.source for row in xid_catalog.CATALOG.values())


# --- the policy, driver without the recovery field (the catalog decides) -----------------------


@pytest.mark.parametrize(("xid", "action"), [(48, "gpu-reset"), (94, "gpu-reset"),
                                             (79, "node-reboot"), (119, "gpu-reset")])
def test_a_reset_or_reboot_xid_never_clears_by_itself(xid, action):
    state = run([(0, XidObserved(A, xid))], expire_at=10_000)
    # The XID's own taint went with the quiet period; the recovery taint stays.
    assert taints(state) == [(TAINT_RECOVERY, action, "NoSchedule")]
    assert status(state) == "Unhealthy"
    # ... on the MIG devices of that GPU too: a reset resets the whole GPU.
    assert taints(state, "gpu-0-mig-1g10gb-19-0") == [(TAINT_RECOVERY, action, "NoSchedule")]
    assert state.next_expiry() is None


@pytest.mark.parametrize("xid", [13, 31, 43, 45])
def test_an_application_xid_clears_after_the_quiet_period(xid):
    state = run([(0, XidObserved(A, xid))])
    assert taints(state) == [(TAINT_XID, str(xid), "None")]
    assert status(state) == "Healthy"
    assert taints(run([(0, XidObserved(A, xid))], expire_at=61)) == []


def test_an_xid_the_catalog_does_not_list_clears_after_the_quiet_period():
    state = run([(0, XidObserved(A, 4242))])
    assert taints(state) == [(TAINT_XID, "4242", "NoSchedule")]
    assert taints(run([(0, XidObserved(A, 4242))], expire_at=61)) == []


def test_without_the_field_the_gpu_recovers_when_seen_again_after_leaving_the_bus():
    events: list[tuple[float, HealthEvent]] = [(0, XidObserved(A, 79))]
    assert taints(run([*events, (5, GpuLostChanged(A, False))]))[-1][0] == TAINT_RECOVERY
    back = run([*events, (5, GpuLostChanged(A, True)), (9, GpuLostChanged(A, False))])
    assert taints(back) == []
    assert status(back) == "Healthy"


def test_recovery_can_evict_where_the_admin_opts_in():
    state = run([(0, XidObserved(A, 48))], HealthPolicy(recovery_effect="NoExecute"))
    assert (TAINT_RECOVERY, "gpu-reset", "NoExecute") in taints(state)
    with pytest.raises(ValueError, match="recovery_effect"):
        HealthPolicy(recovery_effect="Evict")


# --- the policy, driver with the recovery field (the driver decides) ---------------------------


def test_the_driver_decides_where_it_offers_the_field():
    # The driver says an XID the catalog calls an application error needs a reset ...
    assert taints(run([(0, XidObserved(A, 13, recovery_action=RESET))]))[-1] == (
        TAINT_RECOVERY, "gpu-reset", "NoSchedule")
    # ... and that a catalogued reset XID needs nothing: quiet period only.
    state = run([(0, XidObserved(A, 48, recovery_action=gpu_recovery.NONE))])
    assert taints(state) == [(TAINT_XID, "48", "NoSchedule")]
    assert taints(run([(0, XidObserved(A, 48, recovery_action=0))], expire_at=61)) == []


def test_a_driver_reported_recovery_clears_only_when_the_driver_says_none():
    events: list[tuple[float, HealthEvent]] = [(0, XidObserved(A, 74, recovery_action=RESET))]
    waiting = run(events, expire_at=10_000)
    assert taints(waiting) == [(TAINT_RECOVERY, "gpu-reset", "NoSchedule")]
    message = {h.device: h.message for h in waiting.device_health(DEVICES, T0)}["gpu-0"]
    assert "needs gpu-reset" in message and "XID 74" in message
    # The GPU coming back is not enough: the driver still asks for the reset.
    still = run([*events, (5, GpuLostChanged(A, True)), (6, GpuLostChanged(A, False))])
    assert (TAINT_RECOVERY, "gpu-reset", "NoSchedule") in taints(still)
    # Right after the reset (well inside the quiet period) the XID is history too.
    healthy = run([*events, (5, RecoveryActionChanged(A, gpu_recovery.NONE))])
    assert taints(healthy) == []
    assert status(healthy) == "Healthy"


def test_a_recovery_the_driver_reports_without_an_xid_taints_too():
    """E.g. after the daemon restarted: the driver still wants the node rebooted."""
    state = run([(0, RecoveryActionChanged(A, REBOOT))])
    assert taints(state) == [(TAINT_RECOVERY, "node-reboot", "NoSchedule")]
    # an escalation keeps the taint's time; a later NONE clears it
    worse = state.observe(RecoveryActionChanged(A, 4), T0 + 9)
    (taint,) = [t for d in worse.apply(DEVICES).devices if d.name == "gpu-0" for t in d.taints]
    assert (taint.value, taint.time_added) == ("drain-and-reset", "2023-11-14T22:13:20Z")
    assert worse.fingerprint() != state.fingerprint()
    assert taints(worse.observe(RecoveryActionChanged(A, 0), T0 + 20)) == []
    # a driver that does not offer the field changes nothing
    assert run([(0, RecoveryActionChanged(A, None))]).fingerprint() == HealthState(
        HealthPolicy(quiet_period=60)).fingerprint()


def test_a_mig_scoped_xid_that_needs_a_reset_taints_the_whole_gpu():
    state = run([(0, XidObserved(A, 94, MIG, "MIG-1"))], expire_at=10_000)
    assert taints(state, "gpu-0") == [(TAINT_RECOVERY, "gpu-reset", "NoSchedule")]
    assert taints(state, "gpu-0-mig-1g10gb-19-0") == [(TAINT_RECOVERY, "gpu-reset",
                                                        "NoSchedule")]


# --- through the simulator: NVML field, XID injection, reset -----------------------------------


@pytest.fixture
def sim_node(simulate, sim_state) -> Callable[[str], Node]:
    def make(profile: str) -> Node:
        library = simulate(profile)
        nvml = Nvml()
        inventory = read_inventory(nvml, pcie_root=simulated_pcie_root)
        return Node(nvml, library, sim.SimControl(sim_state), sim_state,
                    build_devices(inventory), [g.probe.uuid for g in inventory.gpus])
    return make


class _Changes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _wait(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the watcher never reported it"
        time.sleep(0.01)


def _recovery_taints(n: Node, monitor: HealthMonitor) -> dict[str, str]:
    return {name: value for name, found in n.taints(monitor).items()
            for key, value, _ in found if key == TAINT_RECOVERY}


def test_an_xid_the_driver_wants_reset_stays_until_the_gpu_is_reset(sim_node):
    n = sim_node("l4-x4")
    monitor = HealthMonitor(n.nvml, n.uuids, HealthPolicy(quiet_period=0.2), _Changes(),
                            wait_ms=WAIT_MS, probe_interval=PROBE_INTERVAL)
    with monitor:
        _wait_until_watching(n)
        n.control.raise_xid(1, 48, recovery_action=RESET)
        _wait(lambda: _recovery_taints(n, monitor) == {"gpu-1": "gpu-reset"})
        assert GPU_RECOVERY_REQUIRED.labels(gpu=n.uuids[1], action="gpu-reset")._value.get() == 1
        # many quiet periods later it is still there: the GPU was not reset
        _wait(lambda: not any(k == TAINT_XID for found in n.taints(monitor).values()
                              for k, _, _ in found))
        assert _recovery_taints(n, monitor) == {"gpu-1": "gpu-reset"}
        n.control.reset_gpu(1)  # the driver reports no recovery pending any more
        _wait(lambda: _recovery_taints(n, monitor) == {})
        assert (n.uuids[1], "gpu-reset") not in {
            (s.labels["gpu"], s.labels["action"])
            for m in GPU_RECOVERY_REQUIRED.collect() for s in m.samples}


def test_a_pending_recovery_is_found_at_start_without_an_xid(sim_node):
    n = sim_node("l4-x4")
    n.control.set_recovery_action(2, REBOOT)
    monitor = HealthMonitor(n.nvml, n.uuids, HealthPolicy(), _Changes(),
                            wait_ms=WAIT_MS, probe_interval=PROBE_INTERVAL)
    with monitor:
        _wait(lambda: _recovery_taints(n, monitor) == {"gpu-2": "node-reboot"})


def test_a_driver_without_the_field_falls_back_to_the_catalog(sim_node):
    n = sim_node("l4-x4")
    n.control.set_recovery_action(0, None)  # an older driver
    assert n.nvml.gpu_recovery_action(n.uuids[0]) is None
    monitor = HealthMonitor(n.nvml, n.uuids, HealthPolicy(quiet_period=0.2), _Changes(),
                            wait_ms=WAIT_MS, probe_interval=PROBE_INTERVAL)
    with monitor:
        _wait_until_watching(n)
        n.control.raise_xid(0, 79)
        _wait(lambda: _recovery_taints(n, monitor) == {"gpu-0": "node-reboot"})
        n.control.set_gpu_lost(0, True)
        _wait(lambda: any(k == "gpu.nvidia.com/gpu-lost"
                          for k, _, _ in n.taints(monitor).get("gpu-0", [])))
        n.control.set_gpu_lost(0, False)  # seen again after leaving the bus
        _wait(lambda: _recovery_taints(n, monitor) == {})


# --- the node's flags ----------------------------------------------------------------------


def _config(*flags: str) -> NodeConfig:
    return node_config(build_parser("node").parse_args(["node", *flags]))


def test_the_recovery_effect_flag_and_its_environment(monkeypatch):
    monkeypatch.delenv("RECOVERY_TAINT_EFFECT", raising=False)
    assert _config().health.recovery_effect == "NoSchedule"
    assert _config("--recovery-taint-effect", "NoExecute").health.recovery_effect == "NoExecute"
    monkeypatch.setenv("RECOVERY_TAINT_EFFECT", "NoExecute")
    assert _config().health.recovery_effect == "NoExecute"
    with pytest.raises(CliError, match=r"--recovery-taint-effect \(env RECOVERY_TAINT_EFFECT\): "
                                       r"'Evict' is not one of NoSchedule, NoExecute"):
        _config("--recovery-taint-effect", "Evict")
