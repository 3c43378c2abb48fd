"""Prepare/unprepare on a simulated node: real NVML seam, checkpoint, CDI files."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpudra.driver import sim
from gpudra.driver.claims import ClaimError, OpaqueConfig
from tests.driver.node_fixture import DRIVER, SimNode, claim, start_node

UID1 = "11111111-1111-4111-8111-111111111111"
UID2 = "22222222-2222-4222-8222-222222222222"
GV = "resource.nvidia.com/v1beta1"


@pytest.fixture
def gated_node(tmp_path: Path) -> Iterator[Callable[..., SimNode]]:
    """Start a node with feature gates off or other host commands (``start_node``'s options)."""
    started: list[SimNode] = []

    def start(**options: Any) -> SimNode:
        started.append(start_node(tmp_path, **options))
        return started[-1]

    yield start
    for n in started:
        n.close()
    sim.uninstall()


def spec_of(node: SimNode, uid: str) -> dict:
    return json.loads((node.cdi_root / f"k8s.{DRIVER}-claim_{uid}.json").read_text())


def mig_instances(node: SimNode, gpu: int) -> list:
    return node.control.snapshot()["gpus"][gpu]["gpu_instances"]


def test_full_gpu_prepare_writes_cdi_and_is_idempotent(node):
    result = node.state.prepare(claim(UID1, "gpu-0"))
    assert [(r.device, r.cdi_device_ids) for r in result] == [
        ("gpu-0", (f"k8s.{DRIVER}/claim={UID1}-gpu-0",))]
    spec = spec_of(node, UID1)
    assert spec["kind"] == f"k8s.{DRIVER}/claim"
    assert spec["cdiVersion"] == "0.5.0"
    (device,) = spec["devices"]
    assert device["name"] == f"{UID1}-gpu-0"
    paths = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    assert paths == ["/dev/nvidia0"]
    assert node.state.prepare(claim(UID1, "gpu-0")) == result
    node.state.unprepare(UID1)
    assert not (node.cdi_root / f"k8s.{DRIVER}-claim_{UID1}.json").exists()
    node.state.unprepare(UID1)  # unknown claim: fine


def test_a_device_held_by_another_claim_is_refused(node):
    node.state.prepare(claim(UID1, "gpu-0"))
    with pytest.raises(ClaimError, match=r"device 'gpu-0' is already prepared for claim"):
        node.state.prepare(claim(UID2, "gpu-0"))
    # a partition of a GPU held whole is refused too
    with pytest.raises(ClaimError, match="overlaps device 'gpu-0'"):
        node.state.prepare(claim(UID2, "gpu-0-mig-1g10gb-19-6"))
    assert mig_instances(node, 0) == []


def test_dynamic_mig_prepare_creates_and_unprepare_destroys(node):
    result = node.state.prepare(claim(UID1, "gpu-0-mig-3g40gb-9-4"))
    assert result[0].device == "gpu-0-mig-3g40gb-9-4"
    gpu = node.control.snapshot()["gpus"][0]
    assert gpu["mig_mode"]["current"] == 1
    (gi,) = gpu["gpu_instances"]
    assert (gi["profile_id"], gi["placement"]["start"], gi["placement"]["size"]) == (9, 4, 4)
    nodes = [n["path"] for n in spec_of(node, UID1)["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes[0] == "/dev/nvidia0" and all(p.startswith("/dev/nvidia-caps/") for p in nodes[1:])
    node.state.unprepare(UID1)
    gpu = node.control.snapshot()["gpus"][0]
    assert gpu["gpu_instances"] == []
    assert gpu["mig_mode"]["current"] == 0  # Hopper: back to what it was


def test_seven_1g_on_one_h100_then_the_full_gpu_is_refused(node):
    uids = [f"{i:08d}-0000-4000-8000-000000000000" for i in range(7)]
    for uid, start in zip(uids, range(7), strict=True):
        node.state.prepare(claim(uid, f"gpu-0-mig-1g10gb-19-{start}"))
    assert len(mig_instances(node, 0)) == 7
    with pytest.raises(ClaimError, match="overlaps"):
        node.state.prepare(claim(UID1, "gpu-0"))
    for uid in uids:
        node.state.unprepare(uid)
    assert node.control.snapshot()["gpus"][0]["mig_mode"]["current"] == 0


def test_taken_placement_is_a_clear_error_and_changes_nothing(node):
    # an admin (not the scheduler) made a 1g MIG device at slice 5 behind the driver's back
    gpu1 = next(g for g in node.state.index.devices.devices if g.name == "gpu-1")
    uuid = str(gpu1.attributes["uuid"])
    node.nvml.set_mig_mode(uuid, True)
    profiles = {p.profile_id: p for p in node.nvml.mig_profiles(uuid, 81559 << 20)}
    one_g = profiles[19]
    node.nvml.create_mig_device(uuid, one_g, next(p for p in one_g.placements if p.start == 5))
    before = node.control.snapshot()
    with pytest.raises(ClaimError, match=r"cannot create 3g.40gb at placement 4:4 on GPU "
                                         r".*the placement is taken"):
        node.state.prepare(claim(UID2, "gpu-1-mig-3g40gb-9-4"))
    assert node.control.snapshot()["gpus"] == before["gpus"]
    assert not (node.cdi_root / f"k8s.{DRIVER}-claim_{UID2}.json").exists()


def test_unknown_device_and_wrong_pool(node):
    with pytest.raises(ClaimError, match="'gpu-9' is not in this node's inventory"):
        node.state.prepare(claim(UID1, "gpu-9"))
    bad = claim(UID1, "gpu-0")
    bad = type(bad)(uid=bad.uid, namespace=bad.namespace, name=bad.name, devices=(
        type(bad.devices[0])(request="gpu", pool="other-node", device="gpu-0"),))
    with pytest.raises(ClaimError, match="pool 'other-node', not this node's pool"):
        node.state.prepare(bad)
    assert list(node.cdi_root.glob("*")) == []


def test_compute_mode_set_and_restored(node):
    config = OpaqueConfig(requests=(), parameters={
        "apiVersion": GV, "kind": "GpuConfig", "computeMode": "ExclusiveProcess"})
    node.state.prepare(claim(UID1, "gpu-2", configs=(config,)))
    assert node.control.snapshot()["gpus"][2]["compute_mode"] == 3
    node.state.unprepare(UID1)
    assert node.control.snapshot()["gpus"][2]["compute_mode"] == 0


def test_compute_mode_is_refused_when_its_feature_gate_is_off(gated_node):
    node = gated_node(compute_modes=False)  # feature gate ComputeModeSettings off
    config = OpaqueConfig(requests=(), parameters={
        "apiVersion": GV, "kind": "MigDeviceConfig", "computeMode": "Prohibited"})
    before = node.control.snapshot()["gpus"]
    with pytest.raises(ClaimError) as info:
        node.state.prepare(claim(UID1, "gpu-0-mig-1g10gb-19-0", configs=(config,)))
    message = str(info.value)
    assert message.startswith(f"claim default/claim-{UID1[:8]}:{UID1}: ")
    assert "computeMode" in message and "feature gate ComputeModeSettings" in message
    assert node.control.snapshot()["gpus"] == before  # no MIG device, no mode change
    assert list(node.cdi_root.glob("*")) == []
    assert node.state.prepared(UID1) is None
    # Sharing still sets the mode it needs: only an explicit computeMode is gated.
    sliced = OpaqueConfig(requests=(), parameters={
        "apiVersion": GV, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}})
    node.state.prepare(claim(UID2, "gpu-5", configs=(sliced,)))
    node.state.unprepare(UID2)


def test_gpu_config_for_a_mig_device_is_refused(node):
    config = OpaqueConfig(requests=("gpu",), parameters={"apiVersion": GV, "kind": "GpuConfig"})
    with pytest.raises(ClaimError, match="is a GpuConfig but request 'gpu' got mig device"):
        node.state.prepare(claim(UID1, "gpu-0-mig-1g10gb-19-0", configs=(config,)))
    assert mig_instances(node, 0) == []


def test_invalid_opaque_config_names_the_field(node):
    config = OpaqueConfig(requests=(), position=2, parameters={
        "apiVersion": GV, "kind": "GpuConfig", "sharing": {"strategy": "Magic"}})
    with pytest.raises(ClaimError, match=r"config\[2\]\.opaque\.parameters\.sharing\.strategy"):
        node.state.prepare(claim(UID1, "gpu-0", configs=(config,)))


def test_static_mig_device_prepares_without_creating(tmp_path):
    node = start_node(tmp_path, "dgx-a100-static-mig")
    try:
        before = node.control.snapshot()["gpus"][1]["gpu_instances"]
        node.state.prepare(claim(UID1, "gpu-1-mig-1g5gb-19-3"))
        node.state.unprepare(UID1)
        assert node.control.snapshot()["gpus"][1]["gpu_instances"] == before
    finally:
        node.close()
        sim.uninstall()


def test_restart_keeps_prepared_claims_and_mig_devices(tmp_path):
    node = start_node(tmp_path)
    first = node.state.prepare(claim(UID1, "gpu-3-mig-2g20gb-14-2"))
    node.close()
    sim.uninstall()
    node = start_node(tmp_path)
    try:
        assert len(mig_instances(node, 3)) == 1  # reconcile kept the owned instance
        assert node.state.prepare(claim(UID1, "gpu-3-mig-2g20gb-14-2")) == first
        # the published device model still treats gpu-3 as dynamic (not static MIG)
        names = {d.name for d in node.state.index.devices.devices}
        assert "gpu-3" in names and "gpu-3-mig-1g10gb-19-0" in names
        node.state.unprepare(UID1)
    finally:
        node.close()
        sim.uninstall()


def test_time_slicing_is_set_and_reset(node):
    config = OpaqueConfig(requests=(), parameters={
        "apiVersion": GV, "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}})
    node.state.prepare(claim(UID1, "gpu-5", configs=(config,)))
    uuid = next(str(d.attributes["uuid"]) for d in node.state.index.devices.devices
                if d.name == "gpu-5")
    runner = node.state.hardware.commands
    assert runner is not None
    assert runner.time_slices()[uuid] == 3
    node.state.unprepare(UID1)
    assert runner.time_slices()[uuid] == 0


def test_no_config_touches_nothing(node):
    node.state.prepare(claim(UID1, "gpu-5"))
    assert node.state.hardware.commands.time_slices() == {}
    assert node.control.snapshot()["gpus"][5]["compute_mode"] == 0


def test_mps_daemon_lifecycle_and_cdi_edits(node):
    config = OpaqueConfig(requests=(), parameters={
        "apiVersion": GV, "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {
            "defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "4Gi"}}})
    node.state.prepare(claim(UID1, "gpu-6-mig-2g20gb-14-0", configs=(config,)))
    daemon_dir = node.root / "plugin" / "mps" / UID1
    assert (daemon_dir / "pipe" / "control").exists()
    log = (daemon_dir / "log" / "control.log").read_text()
    assert "set_default_active_thread_percentage 40" in log
    assert "set_default_device_pinned_mem_limit MIG-" in log and " 4096M" in log
    edits = spec_of(node, UID1)["devices"][0]["containerEdits"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
    assert edits["mounts"][0]["hostPath"] == str(daemon_dir / "pipe")
    mig_uuid = node.state.prepared(UID1)  # the claim is recorded as prepared
    assert mig_uuid is not None
    node.state.unprepare(UID1)
    assert not daemon_dir.exists()
    assert node.control.snapshot()["gpus"][6]["gpu_instances"] == []


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-a100"])
def test_every_mig_profile_at_every_placement(profile, tmp_path):
    node = start_node(tmp_path, profile)
    try:
        names = [d.name for d in node.state.index.devices.devices
                 if d.group == "gpu-0" and d.type == "mig"]
        assert len(names) == 25
        for i, name in enumerate(names):
            uid = f"{i:08d}-aaaa-4000-8000-000000000000"
            node.state.prepare(claim(uid, name))
            (gi,) = mig_instances(node, 0)
            ref = name.rsplit("-", 2)
            assert (gi["profile_id"], gi["placement"]["start"]) == (int(ref[1]), int(ref[2]))
            node.state.unprepare(uid)
            assert mig_instances(node, 0) == []
    finally:
        node.close()
        sim.uninstall()


def test_invalid_configs_change_nothing_on_the_gpu(node):
    from tests.api.test_configs import INVALID

    before = node.control.snapshot()
    for case, parameters, expected in INVALID:
        if not isinstance(parameters, dict):
            continue  # JSON text and non-objects are refused before reaching the driver
        config = OpaqueConfig(requests=(), parameters=parameters)
        devices = ("gpu-0-mig-1g10gb-19-0" if parameters.get("kind") == "MigDeviceConfig"
                   else "gpu-0",)
        with pytest.raises(ClaimError) as info:
            node.state.prepare(claim(UID1, *devices, configs=(config,)))
        assert expected.split(":")[0] in str(info.value), case
        assert node.control.snapshot()["gpus"] == before["gpus"], case
        assert list(node.cdi_root.glob("*")) == [], case


def test_refused_mps_changes_nothing(gated_node):
    node = gated_node(mps=False)  # feature gate MPSSupport off
    config = OpaqueConfig(requests=(), parameters={
        "apiVersion": GV, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}})
    before = node.control.snapshot()["gpus"]
    with pytest.raises(ClaimError, match="MPS, which is not enabled"):
        node.state.prepare(claim(UID1, "gpu-5", configs=(config,)))
    assert node.control.snapshot()["gpus"] == before


def test_refused_time_slicing_changes_nothing(gated_node):
    node = gated_node(time_slicing=False)  # feature gate TimeSlicingSettings off
    config = OpaqueConfig(requests=(), parameters={
        "apiVersion": GV, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}})
    before = node.control.snapshot()["gpus"]
    with pytest.raises(ClaimError, match="time-slicing, which is not enabled"):
        node.state.prepare(claim(UID1, "gpu-5", configs=(config,)))
    assert node.control.snapshot()["gpus"] == before


def test_settings_applied_before_a_failure_are_restored(gated_node):
    from gpudra.driver.commands import CommandError

    class Failing:
        def run(self, argv, *, env=None, stdin=None):
            raise CommandError(f"{argv[0]}: simulated failure")

    node = gated_node(commands=Failing())
    exclusive = OpaqueConfig(requests=("a",), parameters={
        "apiVersion": GV, "kind": "GpuConfig", "computeMode": "ExclusiveProcess"})
    sliced = OpaqueConfig(requests=("b",), parameters={
        "apiVersion": GV, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}})
    base = claim(UID1, "gpu-2", "gpu-3", configs=(exclusive, sliced))
    two = type(base)(uid=base.uid, namespace=base.namespace, name=base.name, configs=base.configs,
                     devices=(type(base.devices[0])(request="a", pool="node-a", device="gpu-2"),
                              type(base.devices[0])(request="b", pool="node-a", device="gpu-3")))
    with pytest.raises(ClaimError, match="simulated failure"):
        node.state.prepare(two)
    gpus = node.control.snapshot()["gpus"]
    assert gpus[2]["compute_mode"] == 0 and gpus[3]["compute_mode"] == 0


def test_a_failed_create_never_destroys_the_device_in_the_way(node):
    gpu0 = next(d for d in node.state.index.devices.devices if d.name == "gpu-0")
    uuid = str(gpu0.attributes["uuid"])
    node.nvml.set_mig_mode(uuid, True)
    one_g = {p.profile_id: p for p in node.nvml.mig_profiles(uuid, 81559 << 20)}[19]
    admin = node.nvml.create_mig_device(uuid, one_g, one_g.placements[0])
    with pytest.raises(ClaimError, match="placement is taken"):
        node.state.prepare(claim(UID1, "gpu-0-mig-1g10gb-19-0"))
    assert [m.uuid for m in node.nvml.mig_instances(uuid)] == [admin.uuid]


def test_one_failing_claim_in_a_call_keeps_the_others(node):
    node.control.set_gpu_lost(1, True)
    results = node.state.prepare_many([claim(UID1, "gpu-5"),
                                       claim(UID2, "gpu-1-mig-1g10gb-19-0")])
    assert isinstance(results[UID2], ClaimError)
    assert not isinstance(results[UID1], ClaimError)
    assert node.state.prepared(UID1) is not None  # checkpointed despite the other's failure
    node.control.set_gpu_lost(1, False)


def test_a_subrequest_is_answered_as_allocated_and_stripped_only_at_the_wire(node):
    # The kubelet's gRPC layer (dra_service.base_request_names) turns "gpu/big" into "gpu".
    (device,) = node.state.prepare(claim(UID1, "gpu-4", request="gpu/big"))
    assert device.request_names == ("gpu/big",)
    assert node.state.prepared(UID1) == (device,)


def _checkpoint_writes() -> float:
    return REGISTRY.get_sample_value("gpudra_checkpoint_write_seconds_count") or 0.0


def test_a_call_of_eight_claims_commits_the_checkpoint_once_each_way(node):
    uids = [f"{i}{i}{i}{i}{i}{i}{i}{i}-0000-4000-8000-000000000000" for i in range(8)]
    before = _checkpoint_writes()
    results = node.state.prepare_many([claim(uid, f"gpu-{i}") for i, uid in enumerate(uids)])
    assert not [r for r in results.values() if isinstance(r, ClaimError)]
    assert _checkpoint_writes() - before == 1
    assert set(node.state.prepared_many(uids)) == set(uids)
    assert all(spec_of(node, uid)["devices"] for uid in uids)
    before = _checkpoint_writes()
    unknown = "99999999-9999-4999-8999-999999999999"
    assert node.state.unprepare_many([*uids, unknown]) == {uid: None for uid in [*uids, unknown]}
    assert _checkpoint_writes() - before == 1
    assert node.state.prepared_many(uids) == {}
    assert list(node.cdi_root.glob("*.json")) == []


def test_unpreparing_two_mig_claims_of_one_gpu_in_one_call_restores_it(node):
    node.state.prepare(claim(UID1, "gpu-0-mig-1g10gb-19-0"))
    node.state.prepare(claim(UID2, "gpu-0-mig-1g10gb-19-1"))
    assert len(mig_instances(node, 0)) == 2
    assert node.state.unprepare_many([UID1, UID2]) == {UID1: None, UID2: None}
    assert mig_instances(node, 0) == []
    assert node.control.snapshot()["gpus"][0]["mig_mode"]["current"] == 0


def test_a_gpu_that_answers_again_swaps_the_view_whole(tmp_path):
    start_node(tmp_path).close()  # the simulated node, installed
    sim.uninstall()
    sim.SimControl(tmp_path / "sim").set_gpu_lost(1, True)
    n = start_node(tmp_path)  # starts without it
    try:
        before = n.state.view
        assert "gpu-1" not in before.by_name and n.state.refresh_gpus() is False
        assert n.state.view is before  # nothing answered: nothing swapped
        gone = before.inventory.unavailable[0].uuid
        assert gone in n.state.watched_gpus()  # watched while it does not answer
        n.control.set_gpu_lost(1, False)
        assert n.state.refresh_gpus() is True
        after = n.state.view
        assert "gpu-1" in after.by_name and after.index is n.state.index
        assert after.inventory.unavailable == ()
        # the view a call took before is as it was: calls never see half a refresh
        assert "gpu-1" not in before.by_name and before.inventory.unavailable
        assert n.state.refresh_gpus() is False and n.state.view is after
        n.state.prepare(claim(UID1, "gpu-1"))  # and the GPU is prepared against it
    finally:
        n.close()
        sim.uninstall()


def test_the_state_is_not_patched_from_outside(node):
    with pytest.raises(AttributeError):
        node.state.index = node.state.index  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.state.view.index = node.state.index  # type: ignore[misc]


def test_the_daemon_reads_records_through_the_state(node):
    node.state.prepare(claim(UID1, "gpu-0"))
    assert set(node.state.records()) == set(node.state.completed()) == {UID1}
    node.state.unprepare(UID1)
    assert node.state.records() == {}
