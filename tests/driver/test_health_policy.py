"""The health policy as a table: events at given times → taints and kubelet health."""

from __future__ import annotations

import pytest

from gpudra.driver.devices import Device, NodeDevices, Taint
from gpudra.driver.health import (
    APPLICATION_XIDS,
    TAINT_GPU_LOST,
    TAINT_UNMONITORED,
    TAINT_XID,
    GpuLostChanged,
    HealthEvent,
    HealthPolicy,
    HealthState,
    MigLocation,
    MonitoringChanged,
    XidObserved,
    parse_xids,
    rfc3339,
)

A, B = "GPU-aaaa", "GPU-bbbb"
# These XIDs come from a driver that reports no recovery needed (its NVML recovery action
# field says NONE): the quiet-period path. Recovery: tests/driver/test_xid_recovery.py.
def _quiet(*args: object) -> XidObserved:
    return XidObserved(*args, recovery_action=0)  # type: ignore[arg-type]


T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
MIG_0 = MigLocation(profile_id=19, start=0)
MIG_1 = MigLocation(profile_id=19, start=1)


def _full(minor: int, uuid: str) -> Device:
    return Device(f"gpu-{minor}", f"gpu-{minor}", {"type": "gpu", "uuid": uuid}, {})


def _mig(minor: int, parent: str, where: MigLocation) -> Device:
    name = f"gpu-{minor}-mig-1g10gb-{where.profile_id}-{where.start}"
    return Device(name, f"gpu-{minor}", {"type": "mig", "parentUUID": parent}, {})


# GPU 0 a plain GPU; GPU 1 with its full device and two MIG devices (dynamic MIG layout).
DEVICES = NodeDevices((_full(0, A), _full(1, B), _mig(1, B, MIG_0), _mig(1, B, MIG_1)))


def run(events: list[tuple[float, HealthEvent]], policy: HealthPolicy | None = None,
        *, expire_at: float | None = None) -> HealthState:
    state = HealthState(policy or HealthPolicy())
    for at, event in events:
        state = state.observe(event, T0 + at)
    return state.expire(T0 + expire_at) if expire_at is not None else state


def taints(state: HealthState) -> dict[str, list[tuple[str, str, str]]]:
    """Device name → (key, value, effect) of each taint, for tainted devices only."""
    return {d.name: [(t.key, t.value, t.effect) for t in d.taints]
            for d in state.apply(DEVICES).devices if d.taints}


def health(state: HealthState) -> dict[str, str]:
    return {h.device: h.status for h in state.device_health(DEVICES, T0)}


ALL_B = ["gpu-1", "gpu-1-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-1"]


@pytest.mark.parametrize(("events", "expected"), [
    pytest.param([(0, _quiet(A, 79))],
                 {"gpu-0": [(TAINT_XID, "79", "NoSchedule")]}, id="critical-xid"),
    pytest.param([(0, _quiet(A, 13))],
                 {"gpu-0": [(TAINT_XID, "13", "None")]}, id="application-xid"),
    pytest.param([(0, _quiet(B, 48))],
                 {key: [(TAINT_XID, "48", "NoSchedule")] for key in ALL_B},
                 id="gpu-wide-xid-taints-every-mig-device"),
    pytest.param([(0, _quiet(B, 94, MIG_1, "MIG-x"))],
                 {"gpu-1-mig-1g10gb-19-1": [(TAINT_XID, "94", "NoSchedule")]},
                 id="mig-xid-taints-that-mig-device-only"),
    pytest.param([(0, _quiet(A, 79)), (1, _quiet(A, 48))],
                 {"gpu-0": [(TAINT_XID, "48", "NoSchedule")]}, id="latest-critical-wins"),
    pytest.param([(0, _quiet(A, 79)), (1, _quiet(A, 13))],
                 {"gpu-0": [(TAINT_XID, "79", "NoSchedule")]},
                 id="application-xid-never-relaxes-a-critical-one"),
    pytest.param([(0, _quiet(A, 13)), (1, _quiet(A, 79))],
                 {"gpu-0": [(TAINT_XID, "79", "NoSchedule")]}, id="critical-after-application"),
    pytest.param([(0, _quiet(B, 48)), (1, _quiet(B, 94, MIG_0))],
                 {"gpu-1": [(TAINT_XID, "48", "NoSchedule")],
                  "gpu-1-mig-1g10gb-19-0": [(TAINT_XID, "94", "NoSchedule")],
                  "gpu-1-mig-1g10gb-19-1": [(TAINT_XID, "48", "NoSchedule")]},
                 id="latest-wins-per-device-across-scopes"),
    pytest.param([(0, GpuLostChanged(B, True))],
                 {key: [(TAINT_GPU_LOST, "", "NoSchedule")] for key in ALL_B}, id="gpu-lost"),
    pytest.param([(0, GpuLostChanged(B, True)), (5, GpuLostChanged(B, False))], {},
                 id="gpu-lost-clears-when-it-answers"),
    pytest.param([(0, MonitoringChanged(A, False, "not supported"))],
                 {"gpu-0": [(TAINT_UNMONITORED, "", "None")]}, id="unmonitored"),
    pytest.param([(0, _quiet(A, 79)), (1, GpuLostChanged(A, True))],
                 {"gpu-0": [(TAINT_XID, "79", "NoSchedule"), (TAINT_GPU_LOST, "", "NoSchedule")]},
                 id="xid-and-lost-together"),
])
def test_events_become_taints(events, expected):
    assert taints(run(events)) == expected


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_every_default_application_xid_is_recorded_without_blocking(xid):
    state = run([(0, _quiet(A, xid))])
    assert taints(state) == {"gpu-0": [(TAINT_XID, str(xid), "None")]}
    assert health(state)["gpu-0"] == "Healthy"


def test_configured_application_xids_are_added_to_the_defaults():
    policy = HealthPolicy.with_additional(parse_xids("63, 64"))
    assert policy.application_xids == APPLICATION_XIDS | {63, 64}
    state = run([(0, _quiet(A, 63)), (0, _quiet(B, 79))], policy)
    assert taints(state)["gpu-0"] == [(TAINT_XID, "63", "None")]
    assert taints(state)["gpu-1"] == [(TAINT_XID, "79", "NoSchedule")]


@pytest.mark.parametrize(("text", "error"), [
    ("13,x", "'x' is not a positive XID number"),
    ("0", "'0' is not a positive XID number"),
    ("-5", "'-5' is not a positive XID number"),
])
def test_a_bad_xid_list_names_the_field_and_entry(text, error):
    with pytest.raises(ValueError, match=rf"--additional-xids-to-ignore: {error}"):
        parse_xids(text, field_name="--additional-xids-to-ignore")


def test_parse_xids_accepts_spaces_and_empty():
    assert parse_xids("") == frozenset()
    assert parse_xids(" 13 , 31,,") == {13, 31}


@pytest.mark.parametrize("quiet", [0, -1.0])
def test_a_non_positive_quiet_period_is_refused(quiet):
    with pytest.raises(ValueError, match="quiet_period: must be > 0"):
        HealthPolicy(quiet_period=quiet)


# --- recovery ---------------------------------------------------------------------------------


def test_an_xid_taint_clears_after_the_quiet_period():
    policy = HealthPolicy(quiet_period=60)
    events: list[tuple[float, HealthEvent]] = [(0, _quiet(A, 79))]
    assert taints(run(events, policy, expire_at=59.9)) == {"gpu-0": [(TAINT_XID, "79",
                                                                       "NoSchedule")]}
    assert taints(run(events, policy, expire_at=60)) == {}


def test_a_new_critical_xid_restarts_the_quiet_period_and_keeps_time_added():
    policy = HealthPolicy(quiet_period=60)
    events: list[tuple[float, HealthEvent]] = [(0, _quiet(A, 79)), (50, _quiet(A, 48))]
    state = run(events, policy, expire_at=100)
    [device] = [d for d in state.apply(DEVICES).devices if d.taints]
    assert device.taints == (Taint(TAINT_XID, "48", "NoSchedule", rfc3339(T0)),)
    assert state.next_expiry() == T0 + 110
    assert taints(run(events, policy, expire_at=110)) == {}


def test_scopes_recover_independently():
    policy = HealthPolicy(quiet_period=60)
    events: list[tuple[float, HealthEvent]] = [
        (0, _quiet(B, 48)), (30, _quiet(B, 94, MIG_0))]
    assert taints(run(events, policy, expire_at=70)) == {
        "gpu-1-mig-1g10gb-19-0": [(TAINT_XID, "94", "NoSchedule")]}


def test_an_application_xid_shows_once_the_critical_one_cleared():
    policy = HealthPolicy(quiet_period=60)
    events: list[tuple[float, HealthEvent]] = [(0, _quiet(A, 79)), (30, _quiet(A, 13))]
    assert taints(run(events, policy, expire_at=70)) == {"gpu-0": [(TAINT_XID, "13", "None")]}


def test_without_a_quiet_period_taints_stay():
    state = run([(0, _quiet(A, 79))], HealthPolicy(quiet_period=None), expire_at=1e9)
    assert taints(state) == {"gpu-0": [(TAINT_XID, "79", "NoSchedule")]}
    assert state.next_expiry() is None


def test_expire_returns_the_same_state_when_nothing_expires():
    state = run([(0, _quiet(A, 79))])
    assert state.expire(T0 + 1) is state


def test_gpu_lost_keeps_its_first_time_across_repeats():
    state = run([(0, GpuLostChanged(A, True)), (10, GpuLostChanged(A, True))])
    [device] = [d for d in state.apply(DEVICES).devices if d.taints]
    assert device.taints[0].time_added == rfc3339(T0)


def test_gpu_lost_is_not_cleared_by_the_quiet_period():
    state = run([(0, GpuLostChanged(A, True))], HealthPolicy(quiet_period=1), expire_at=1000)
    assert taints(state) == {"gpu-0": [(TAINT_GPU_LOST, "", "NoSchedule")]}


# --- views ------------------------------------------------------------------------------------


def test_device_health_for_the_kubelet():
    state = run([(0, _quiet(B, 94, MIG_0, "MIG-1234")), (0, _quiet(A, 13)),
                 (0, MonitoringChanged(B, False, "registering failed"))])
    report = {h.device: h for h in state.device_health(DEVICES, T0 + 7)}
    assert {name: h.status for name, h in report.items()} == {
        "gpu-0": "Healthy",  # application XID: a program's fault
        "gpu-1": "Unknown",  # nobody watches GPU 1
        "gpu-1-mig-1g10gb-19-0": "Unhealthy",
        "gpu-1-mig-1g10gb-19-1": "Unknown",
    }
    assert report["gpu-1-mig-1g10gb-19-0"].message == (
        "critical XID 94 on GPU-bbbb (MIG-1234) at 2023-11-14T22:13:20Z; "
        "clears after 300 s without another critical XID")
    assert report["gpu-0"].message.startswith("application XID 13 on GPU-aaaa")
    assert report["gpu-1"].message == (
        "XID events cannot be watched on this GPU: registering failed")
    assert {h.last_updated for h in report.values()} == {T0 + 7}


def test_a_lost_gpu_is_unhealthy_with_a_message():
    [gpu0, *_] = run([(0, GpuLostChanged(A, True))]).device_health(DEVICES, T0)
    assert (gpu0.status, gpu0.message) == (
        "Unhealthy", "GPU is lost (NVML GPU_IS_LOST) since 2023-11-14T22:13:20Z: "
                     "it fell off the bus or needs a reset")


def test_apply_replaces_our_taints_and_keeps_everyone_elses():
    foreign = Taint("example.com/maintenance", "true", "NoSchedule")
    stale = Taint(TAINT_XID, "31", "None")
    devices = NodeDevices((Device("gpu-0", "gpu-0", {"type": "gpu", "uuid": A}, {},
                                  taints=(foreign, stale)),))
    cleared = HealthState().apply(devices)
    assert cleared.devices[0].taints == (foreign,)
    tainted = run([(0, _quiet(A, 79))]).apply(devices)
    assert tainted.devices[0].taints == (foreign,
                                         Taint(TAINT_XID, "79", "NoSchedule", rfc3339(T0)))


def test_apply_is_pure_and_keeps_untouched_devices():
    state = run([(0, _quiet(A, 79))])
    result = state.apply(DEVICES)
    assert DEVICES.devices[0].taints == ()
    assert result.devices[1] is DEVICES.devices[1]


def test_fingerprint_ignores_repeats_but_not_new_values():
    first = run([(0, _quiet(A, 79))])
    assert first.observe(_quiet(A, 79), T0 + 5).fingerprint() == first.fingerprint()
    assert first.observe(_quiet(A, 48), T0 + 5).fingerprint() != first.fingerprint()
    assert first.expire(T0 + 1000).fingerprint() != first.fingerprint()


def test_fingerprint_follows_latest_wins_across_scopes():
    """GPU-wide 48, then 94 on one MIG device, then 48 again: that MIG device shows 48."""
    state = run([(0, _quiet(B, 48)), (1, _quiet(B, 94, MIG_0))])
    assert taints(state)["gpu-1-mig-1g10gb-19-0"] == [(TAINT_XID, "94", "NoSchedule")]
    again = state.observe(_quiet(B, 48), T0 + 2)
    assert taints(again)["gpu-1-mig-1g10gb-19-0"] == [(TAINT_XID, "48", "NoSchedule")]
    assert again.fingerprint() != state.fingerprint()
