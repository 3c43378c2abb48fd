"""Shares of a GPU prepared on a simulated node: one MPS daemon per GPU with each share's
limits, time-slicing shares, and every bad input refused before anything changes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.driver import sim
from gpudra.driver.claims import AllocatedDevice, ClaimError, ClaimToPrepare, OpaqueConfig
from gpudra.driver.device_model import ModelOptions
from gpudra.driver.gpu_shares import ALL, NONE, keeping, parse_shareable
from gpudra.driver.shares import daemon_key
from gpudra.driver.sim.mps_daemon import read_limits
from tests.driver.node_fixture import DRIVER, POOL, SimNode, claim, start_node

GV = "resource.nvidia.com/v1beta1"
GIB = 1 << 30
UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"
UID_C = "cccccccc-0000-4000-8000-000000000003"
SHARE_A = "5a5a5a5a-0000-4000-8000-00000000000a"
SHARE_B = "5b5b5b5b-0000-4000-8000-00000000000b"
SHARE_C = "5c5c5c5c-0000-4000-8000-00000000000c"


def share_claim(uid: str, share_id: str | None, *, memory: int = 20 * GIB,
                multiprocessors: int = 33, shares: int = 1, device: str = "gpu-0-shared",
                configs: tuple[OpaqueConfig, ...] = (),
                extra: tuple[AllocatedDevice, ...] = ()) -> ClaimToPrepare:
    consumed = (("memory", memory), ("multiprocessors", multiprocessors), ("shares", shares))
    return ClaimToPrepare(
        uid=uid, namespace="default", name=f"share-{uid[:8]}",
        devices=(AllocatedDevice(request="gpu", pool=POOL, device=device, share_id=share_id,
                                 consumed=consumed), *extra),
        configs=configs)


def mps_config(**mps: object) -> tuple[OpaqueConfig, ...]:
    return (OpaqueConfig(requests=(), parameters={
        "apiVersion": GV, "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": mps}}),)


def time_slicing(interval: str = "Long") -> tuple[OpaqueConfig, ...]:
    return (OpaqueConfig(requests=(), parameters={
        "apiVersion": GV, "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}),)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    n = start_node(tmp_path, options=ModelOptions(shareable=ALL))
    yield n
    for uid in n.state.store.load().claims:  # never leave a daemon behind
        n.state.unprepare(uid)
    n.close()
    sim.uninstall()


def daemon_dir(node: SimNode, gpu: int = 0) -> Path:
    return node.root / "plugin" / "mps" / daemon_key(node.control.gpu_uuid(gpu))


def spec_env(node: SimNode, uid: str) -> dict[str, list[str]]:
    spec = json.loads(next(node.cdi_root.glob(f"*{uid}*")).read_text())
    return {d["name"]: list(d["containerEdits"].get("env", [])) for d in spec["devices"]}


def nothing_changed(node: SimNode, uid: str) -> None:
    assert uid not in node.state.store.load().claims
    assert not list(node.cdi_root.glob(f"*{uid}*"))


def test_two_shares_one_daemon_with_each_share_limits(node):
    uuid = node.control.gpu_uuid(0)
    a = node.state.prepare(share_claim(UID_A, SHARE_A, memory=20 * GIB, multiprocessors=33))
    b = node.state.prepare(share_claim(UID_B, SHARE_B, memory=40 * GIB, multiprocessors=66))
    # the kubelet's answer carries the share ID, and the CDI names are distinct per share
    assert a[0].share_id == SHARE_A and b[0].share_id == SHARE_B
    assert a[0].cdi_device_ids == (f"k8s.{DRIVER}/claim={UID_A}-gpu-0-shared-{SHARE_A}",)
    assert b[0].cdi_device_ids == (f"k8s.{DRIVER}/claim={UID_B}-gpu-0-shared-{SHARE_B}",)
    # one daemon for the GPU, none per claim
    mps = sorted(p.name for p in (node.root / "plugin" / "mps").iterdir())
    assert mps == [daemon_key(uuid)]
    assert node.state.hardware.mps is not None
    assert node.state.hardware.mps.running_pid(daemon_key(uuid)) is not None
    # per-client limits from the allocation: 20Gi and ceil(33/132*100) = 25 %
    env_a = spec_env(node, UID_A)[f"{UID_A}-gpu-0-shared-{SHARE_A}"]
    env_b = spec_env(node, UID_B)[f"{UID_B}-gpu-0-shared-{SHARE_B}"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in env_a
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env_a
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M" in env_b
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in env_b
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env_a
    # the daemon's defaults are the largest share's (a ceiling for any client)
    limits = read_limits(daemon_dir(node) / "log")
    assert limits["defaultActiveThreadPercentage"] == 50
    assert limits["defaultDevicePinnedMemLimit"] == {uuid: "40960M"}
    assert "rejected" not in limits
    assert node.control.snapshot()["gpus"][0]["compute_mode"] == 3
    # the first share leaves: the daemon stays, its ceiling shrinks to the other share's
    node.state.unprepare(UID_B)
    assert node.state.hardware.mps.running_pid(daemon_key(uuid)) is not None
    limits = read_limits(daemon_dir(node) / "log")
    assert limits["defaultActiveThreadPercentage"] == 25
    assert limits["defaultDevicePinnedMemLimit"] == {uuid: "20480M"}
    # the last share leaves: daemon gone, GPU back to its compute mode
    node.state.unprepare(UID_A)
    assert not daemon_dir(node).exists()
    assert node.control.snapshot()["gpus"][0]["compute_mode"] == 0


def test_two_shares_of_one_gpu_in_one_claim(node):
    second = AllocatedDevice(request="other", pool=POOL, device="gpu-0-shared",
                             share_id=SHARE_B, consumed=(("memory", GIB),
                                                         ("multiprocessors", 1), ("shares", 1)))
    result = node.state.prepare(share_claim(UID_A, SHARE_A, extra=(second,)))
    names = {r.cdi_device_ids[0].rsplit("=", 1)[1] for r in result}
    assert names == {f"{UID_A}-gpu-0-shared-{SHARE_A}", f"{UID_A}-gpu-0-shared-{SHARE_B}"}
    node.state.unprepare(UID_A)
    assert not daemon_dir(node).exists()


def test_restart_re_adopts_the_shared_daemon(tmp_path):
    node = start_node(tmp_path, options=ModelOptions(shareable=ALL))
    node.state.prepare(share_claim(UID_A, SHARE_A))
    key = daemon_key(node.control.gpu_uuid(0))
    assert node.state.hardware.mps is not None
    pid = node.state.hardware.mps.running_pid(key)
    node.close()
    again = start_node(tmp_path, options=ModelOptions(shareable=ALL))
    try:
        assert again.state.hardware.mps is not None
        assert again.state.hardware.mps.running_pid(key) == pid
        again.state.unprepare(UID_A)
        assert not daemon_dir(again).exists()
    finally:
        again.close()
        sim.uninstall()


def test_time_slicing_shares_set_the_slice_once_and_the_last_restores_it(node):
    uuid = node.control.gpu_uuid(0)
    runner = node.state.hardware.commands
    node.state.prepare(share_claim(UID_A, SHARE_A, configs=time_slicing("Long")))
    node.state.prepare(share_claim(UID_B, SHARE_B, configs=time_slicing("Long")))
    assert runner.time_slices()[uuid] == 3
    assert not (node.root / "plugin" / "mps").exists() or not daemon_dir(node).exists()
    node.state.unprepare(UID_A)
    assert runner.time_slices()[uuid] == 3
    node.state.unprepare(UID_B)
    assert runner.time_slices()[uuid] == 0


@pytest.mark.parametrize(("configs", "message"), [
    (mps_config(defaultActiveThreadPercentage=80), "defaultActiveThreadPercentage 80 contradicts"),
    (mps_config(defaultPinnedDeviceMemoryLimit="30Gi"), "30720Mi contradicts"),
])
def test_config_that_contradicts_the_allocation_is_refused(node, configs, message):
    with pytest.raises(ClaimError, match=message):
        node.state.prepare(share_claim(UID_A, SHARE_A, configs=configs))
    nothing_changed(node, UID_A)
    assert not daemon_dir(node).exists()


def test_config_that_agrees_with_the_allocation_is_fine(node):
    node.state.prepare(share_claim(
        UID_A, SHARE_A, configs=mps_config(defaultActiveThreadPercentage=25,
                                           defaultPinnedDeviceMemoryLimit="20Gi")))


@pytest.mark.parametrize(("claim_of", "message"), [
    (lambda: share_claim(UID_C, None), "has no shareID"),
    (lambda: share_claim(UID_C, SHARE_C, memory=GIB + 5), "consumedCapacity.memory .* outside"),
    (lambda: share_claim(UID_C, SHARE_C, multiprocessors=500),
     "consumedCapacity.multiprocessors 500 is outside"),
    (lambda: share_claim(UID_C, SHARE_C, shares=0), "consumedCapacity.shares 0 is outside"),
    (lambda: ClaimToPrepare(uid=UID_C, namespace="default", name="x", devices=(
        AllocatedDevice(request="gpu", pool=POOL, device="gpu-0-shared", share_id=SHARE_C,
                        consumed=(("memory", GIB),)),)),
     "consumedCapacity.multiprocessors is missing"),
    (lambda: ClaimToPrepare(uid=UID_C, namespace="default", name="x", devices=(
        AllocatedDevice(request="gpu", pool=POOL, device="gpu-1", share_id=SHARE_C),)),
     "is not a shared device"),
    (lambda: share_claim(UID_C, SHARE_C, configs=(OpaqueConfig(requests=(), parameters={
        "apiVersion": GV, "kind": "GpuConfig", "computeMode": "Default"}),)),
     "computeMode"),
])
def test_bad_share_is_a_clear_error_and_changes_nothing(node, claim_of, message):
    with pytest.raises(ClaimError, match=f"claim default/.*{UID_C}.*{message}"):
        node.state.prepare(claim_of())
    nothing_changed(node, UID_C)
    assert not daemon_dir(node).exists()
    assert node.control.snapshot()["gpus"][0]["compute_mode"] == 0


def test_share_id_reused_is_refused(node):
    node.state.prepare(share_claim(UID_A, SHARE_A))
    before = read_limits(daemon_dir(node) / "log")
    with pytest.raises(ClaimError, match=f"share ID {SHARE_A} is already prepared for claim"):
        node.state.prepare(share_claim(UID_B, SHARE_A))
    nothing_changed(node, UID_B)
    assert read_limits(daemon_dir(node) / "log") == before


def test_overcommit_is_refused(node):
    node.state.prepare(share_claim(UID_A, SHARE_A, memory=60 * GIB))
    with pytest.raises(ClaimError, match=r"consumedCapacity\.memory would overcommit"):
        node.state.prepare(share_claim(UID_B, SHARE_B, memory=30 * GIB))
    nothing_changed(node, UID_B)


def test_mps_and_time_slicing_do_not_mix_on_one_gpu(node):
    node.state.prepare(share_claim(UID_A, SHARE_A))
    with pytest.raises(ClaimError, match="already holds MPS shares"):
        node.state.prepare(share_claim(UID_B, SHARE_B, configs=time_slicing()))
    nothing_changed(node, UID_B)


def test_full_gpu_and_shares_never_overlap(node):
    node.state.prepare(claim(UID_A, "gpu-0"))
    with pytest.raises(ClaimError, match="overlaps device 'gpu-0' of claim"):
        node.state.prepare(share_claim(UID_B, SHARE_B))
    nothing_changed(node, UID_B)
    node.state.unprepare(UID_A)
    node.state.prepare(share_claim(UID_B, SHARE_B))
    with pytest.raises(ClaimError, match="overlaps device 'gpu-0-shared' of claim"):
        node.state.prepare(claim(UID_A, "gpu-0"))
    nothing_changed(node, UID_A)


def test_share_on_a_gpu_that_is_not_shareable(tmp_path):
    node = start_node(tmp_path, options=ModelOptions(shareable=parse_shareable("0")))
    try:
        with pytest.raises(ClaimError, match="GPU 1 is not shareable on this node"):
            node.state.prepare(share_claim(UID_A, SHARE_A, device="gpu-1-shared"))
        nothing_changed(node, UID_A)
    finally:
        node.close()
        sim.uninstall()


def test_share_on_an_unhealthy_gpu_is_refused(node):
    node.control.set_gpu_lost(0, True)
    with pytest.raises(ClaimError, match="is unavailable"):
        node.state.prepare(share_claim(UID_A, SHARE_A))
    nothing_changed(node, UID_A)
    assert not daemon_dir(node).exists()
    node.control.set_gpu_lost(0, False)


def test_simulated_control_daemon_takes_what_the_real_shell_takes(node):
    node.state.prepare(share_claim(UID_A, SHARE_A))
    mps = node.state.hardware.mps
    assert mps is not None
    key = daemon_key(node.control.gpu_uuid(0))
    mps.send(key, ["set_active_thread_percentage 4242 30",
                   "set_device_pinned_mem_limit 4242 0 2G",
                   "set_default_active_thread_percentage 130",
                   "set_default_device_pinned_mem_limit 0 lots"])
    limits = read_limits(daemon_dir(node) / "log")
    assert limits["servers"] == {"4242": {"activeThreadPercentage": 30,
                                          "devicePinnedMemLimit": {"0": "2G"}}}
    assert limits["rejected"] == ["set_default_active_thread_percentage 130",
                                  "set_default_device_pinned_mem_limit 0 lots"]
    assert limits["defaultActiveThreadPercentage"] == 25  # the rejected one changed nothing


def test_mig_and_shares_never_overlap(node):
    """Whatever the scheduler did (upstream allocators before kubernetes#139040 forgot shared
    allocations when counting counters across scheduling cycles), the node refuses."""
    mig = "gpu-0-mig-1g10gb-19-0"
    node.state.prepare(claim(UID_A, mig))
    with pytest.raises(ClaimError, match=f"overlaps device '{mig}' of claim"):
        node.state.prepare(share_claim(UID_B, SHARE_B))
    nothing_changed(node, UID_B)
    node.state.unprepare(UID_A)
    node.state.prepare(share_claim(UID_B, SHARE_B))
    with pytest.raises(ClaimError, match="overlaps device 'gpu-0-shared' of claim"):
        node.state.prepare(claim(UID_A, mig))
    nothing_changed(node, UID_A)


def test_keeping_adds_the_gpus_that_hold_shares():
    listed = parse_shareable("1,GPU-aaaa")
    kept = keeping(listed, ["GPU-bbbb"])
    assert kept.covers(1, "GPU-x") and kept.covers(7, "GPU-aaaa") and kept.covers(7, "GPU-bbbb")
    assert not kept.covers(2, "GPU-cccc")
    assert keeping(NONE, []) == NONE
    assert keeping(ALL, ["GPU-bbbb"]) == ALL
