"""Rebuilding a node's claims from what survives an unreadable checkpoint (pure): CDI
specs, hardware, API claims, published slices → checkpoint records and a held set.

The device names resolve against a real simulated DGX H100's index (every live MIG device
counted as the daemon's, as the start-up step builds it); the survivors are plain values.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudra.driver.checkpoint_model import PREPARE_COMPLETED, PREPARE_STARTED
from gpudra.driver.device_model import ModelOptions
from gpudra.driver.gpu_shares import ALL
from gpudra.driver.held import (
    HELD_TAINT,
    HeldDevice,
    conflict,
    held_document,
    held_mig_uuids,
    kept_mig_instances,
    parse_held,
    still_held,
    with_held_taints,
)
from gpudra.driver.inventory import read_inventory, simulated_pcie_root
from gpudra.driver.mig import Placement
from gpudra.driver.nvml import (
    COMPUTE_MODE_DEFAULT,
    COMPUTE_MODE_EXCLUSIVE_PROCESS,
    MigInstance,
    open_nvml,
)
from gpudra.driver.prepare_plan import DynamicMigTarget, NodeIndex
from gpudra.driver.recovery import rebuild
from gpudra.driver.survivors import (
    MAX_SPEC_BYTES,
    AllocatedResult,
    ApiClaim,
    ClaimSpec,
    GpuHardware,
    SpecDevice,
    Survivors,
    api_claims,
    parse_spec,
    published_mig,
)

DRIVER = "gpu.nvidia.com"
POOL = NODE = "node-a"
UID_A = "0a0a0a0a-0000-4000-8000-00000000000a"
UID_B = "0b0b0b0b-0000-4000-8000-00000000000b"
UID_C = "0c0c0c0c-0000-4000-8000-00000000000c"
UID_D = "0d0d0d0d-0000-4000-8000-00000000000d"
MIG = "gpu-1-mig-1g10gb-19-6"
SHARE_ID = "5a5a5a5a-0000-4000-8000-00000000000a"
EXCLUSIVE = COMPUTE_MODE_EXCLUSIVE_PROCESS


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeIndex]:
    root = tmp_path_factory.mktemp("sim")
    nvml = open_nvml(simulate="dgx-h100", sim_state=root / "sim", driver_root=root)
    try:
        inventory = read_inventory(nvml, pcie_root=simulated_pcie_root)
        yield NodeIndex.build(POOL, inventory, ModelOptions(shareable=ALL))
    finally:
        nvml.shutdown()


def uuid_of(index: NodeIndex, device: str) -> str:
    target = index.targets[device]
    return target.parent_uuid if isinstance(target, DynamicMigTarget) else target.uuid  # type: ignore[union-attr]


def gpus(index: NodeIndex, *, modes: dict[int, int] | None = None,
         instances: dict[int, list[MigInstance]] | None = None) -> list[GpuHardware]:
    """The node's GPUs at baseline, with the compute modes and MIG devices given."""
    modes, instances = modes or {}, instances or {}
    return [GpuHardware(uuid=uuid_of(index, f"gpu-{m}"), minor=m,
                        compute_mode=modes.get(m, COMPUTE_MODE_DEFAULT),
                        mig_enabled=bool(instances.get(m)),
                        mig_instances=tuple(instances.get(m, ())))
            for m in range(8)]


def instance(uuid: str = "MIG-aaaa", gi: int = 5, start: int = 6, profile: int = 19,
             size: int = 1) -> MigInstance:
    return MigInstance(uuid=uuid, gpu_instance_id=gi, compute_instance_id=0,
                       profile_id=profile, placement=Placement(start, size))


def spec(uid: str, *names: str, env: tuple[str, ...] = ()) -> ClaimSpec:
    return ClaimSpec(uid, tuple(SpecDevice(n, env) for n in names))


def api(uid: str, *devices: str, reserved: bool = True, **result: Any) -> ApiClaim:
    return ApiClaim(uid=uid, namespace="ns", name=f"claim-{uid[:2]}", reserved=reserved,
                    results=tuple(AllocatedResult(request="req", device=d, **result)
                                  for d in devices))


def run(index: NodeIndex, *, specs: list[ClaimSpec] = (), hw: list[GpuHardware] | None = None,
        claims: dict[str, ApiClaim] | None = None, published: dict[str, bool] | None = None,
        mps: frozenset[str] = frozenset()):  # type: ignore[no-untyped-def]
    survivors = Survivors(specs=list(specs), gpus=hw if hw is not None else gpus(index),
                          claims=claims, published_mig=published or {}, mps_daemons=mps)
    return rebuild(survivors, targets=index.targets, pool=POOL, driver=DRIVER, boot_id="boot")


# --- rebuilt from specs ------------------------------------------------------------------


def test_a_full_gpu_in_exclusive_mode_is_rebuilt_to_be_put_back_to_default(index):
    hw = gpus(index, modes={0: EXCLUSIVE})
    result = run(index, specs=[spec(UID_A, "gpu-0")], hw=hw, claims={UID_A: api(UID_A, "gpu-0")})
    record = result.checkpoint.claims[UID_A]
    assert record.state == PREPARE_COMPLETED and result.rebuilt == (record.ref,)
    assert (record.namespace, record.name) == ("ns", "claim-0a")
    [device] = record.devices
    assert (device.device, device.kind, device.uuid) == ("gpu-0", "gpu", uuid_of(index, "gpu-0"))
    assert device.request_names == ["req"]
    assert device.cdi_device_ids == [f"k8s.{DRIVER}/claim={UID_A}-gpu-0"]
    assert record.restore.model_dump() == {
        "computeMode": {uuid_of(index, "gpu-0"): COMPUTE_MODE_DEFAULT}}
    assert result.held == ()


def test_a_full_gpu_left_in_default_mode_has_nothing_to_put_back(index):
    result = run(index, specs=[spec(UID_A, "gpu-0")])
    assert result.checkpoint.claims[UID_A].restore.model_dump() == {}


def test_without_the_api_server_the_spec_alone_rebuilds_the_claim(index):
    result = run(index, specs=[spec(UID_A, "gpu-0")], hw=gpus(index, modes={0: EXCLUSIVE}),
                 claims=None)
    record = result.checkpoint.claims[UID_A]
    assert (record.namespace, record.name) == ("", "")
    assert record.devices[0].request_names == []
    assert record.restore.compute_mode == {uuid_of(index, "gpu-0"): COMPUTE_MODE_DEFAULT}
    assert result.held == ()


def test_a_dynamic_mig_device_is_rebuilt_as_created_and_mig_mode_as_turned_on(index):
    parent = uuid_of(index, MIG)
    other = instance("MIG-other", gi=1, start=0, profile=19)
    hw = gpus(index, instances={1: [instance(), other]})
    result = run(index, specs=[spec(UID_A, MIG), spec(UID_B, "gpu-1-mig-1g10gb-19-0")], hw=hw,
                 published={parent: True})
    record = result.checkpoint.claims[UID_A]
    [device] = record.devices
    assert device.mig is not None and device.mig.created
    assert (device.mig.gpu_instance_id, device.mig.profile_id, device.mig.placement_start,
            device.mig.mig_uuid) == (5, 19, 6, "MIG-aaaa")
    assert record.restore.preexisting_mig == {parent: [1]}
    assert result.checkpoint.mig_mode_baseline == {parent: False}
    assert result.held == ()


def test_an_admins_static_layout_is_never_rebuilt_as_ours(index):
    parent = uuid_of(index, MIG)
    hw = gpus(index, instances={1: [instance(), instance("MIG-free", gi=1, start=0)]})
    result = run(index, specs=[spec(UID_A, MIG)], hw=hw, published={parent: False})
    [device] = result.checkpoint.claims[UID_A].devices
    assert device.mig is not None and not device.mig.created and device.mig.profile_id == -1
    assert result.checkpoint.mig_mode_baseline == {}
    assert result.held == ()  # the admin's free MIG device is theirs, published as before


def test_unknown_slices_a_gpu_is_ours_only_when_every_mig_device_is_named(index):
    parent = uuid_of(index, MIG)
    named = run(index, specs=[spec(UID_A, MIG)], hw=gpus(index, instances={1: [instance()]}))
    assert named.checkpoint.claims[UID_A].devices[0].mig.created  # type: ignore[union-attr]
    extra = instance("MIG-nobody", gi=1, start=0)
    mixed = run(index, specs=[spec(UID_A, MIG)],
                hw=gpus(index, instances={1: [instance(), extra]}))
    assert not mixed.checkpoint.claims[UID_A].devices[0].mig.created  # type: ignore[union-attr]
    [held] = mixed.held
    assert (held.kind, held.gpu, held.mig_uuid) == ("mig", parent, "MIG-nobody")


def test_a_spec_whose_mig_device_is_gone_has_nothing_to_destroy(index):
    result = run(index, specs=[spec(UID_A, MIG)], published={uuid_of(index, MIG): True})
    [device] = result.checkpoint.claims[UID_A].devices
    assert device.mig is not None
    assert (device.mig.profile_id, device.mig.gpu_instance_id) == (-1, -1)
    assert result.held == ()


def test_an_mps_share_is_rebuilt_from_its_client_environment(index):
    env = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25")
    hw = gpus(index, modes={0: EXCLUSIVE})
    claims = {UID_A: api(UID_A, "gpu-0-shared", share_id=SHARE_ID,
                         consumed={"multiprocessors": 33, "shares": 1})}
    result = run(index, specs=[spec(UID_A, f"gpu-0-shared-{SHARE_ID}", env=env)], hw=hw,
                 claims=claims)
    record = result.checkpoint.claims[UID_A]
    [device] = record.devices
    assert (device.device, device.share_id) == ("gpu-0-shared", SHARE_ID)
    assert record.restore.shares[SHARE_ID] == {
        "gpu": uuid_of(index, "gpu-0"), "device": "gpu-0-shared", "strategy": "MPS",
        "memoryBytes": 20480 << 20, "multiprocessors": 33, "shares": 1, "threadPercentage": 25,
        "interval": "Default", "baselineComputeMode": COMPUTE_MODE_DEFAULT}
    assert result.held == ()  # the exclusive mode is the share's


def test_a_claims_mps_daemon_is_kept_as_its_own(index):
    result = run(index, specs=[spec(UID_A, "gpu-0")], hw=gpus(index, modes={0: EXCLUSIVE}),
                 mps=frozenset({UID_A}))
    assert result.checkpoint.claims[UID_A].restore.model_dump()["mps"] == {
        "claim": UID_A, "uuids": [uuid_of(index, "gpu-0")]}


def test_admin_access_is_rebuilt_as_observing_only(index):
    parent = uuid_of(index, MIG)
    claims = {UID_A: api(UID_A, "gpu-0", MIG, admin_access=True)}
    result = run(index, specs=[spec(UID_A, "gpu-0", MIG)], claims=claims,
                 hw=gpus(index, modes={0: EXCLUSIVE}, instances={1: [instance()]}),
                 published={parent: True})
    record = result.checkpoint.claims[UID_A]
    assert all(d.admin_access for d in record.devices)
    assert not record.restore.compute_mode
    assert not record.devices[1].mig.created  # type: ignore[union-attr]
    # what it observes is somebody else's: held
    assert sorted(h.kind for h in result.held) == ["compute-mode", "mig"]


def test_a_spec_naming_a_device_the_node_does_not_publish_is_kept_and_held(index):
    result = run(index, specs=[spec(UID_A, "gpu-9")])
    record = result.checkpoint.claims[UID_A]
    assert [d.device for d in record.devices] == ["gpu-9"] and record.restore.model_dump() == {}
    [held] = result.held
    assert (held.kind, held.claim, held.gpu) == ("device", UID_A, None)


# --- held ------------------------------------------------------------------------------


def test_what_nobody_explains_is_held_and_mig_mode_left_alone(index):
    parent = uuid_of(index, MIG)
    hw = gpus(index, modes={0: EXCLUSIVE}, instances={1: [instance(), instance("MIG-b", 1, 0)]})
    result = run(index, specs=[spec(UID_A, MIG)], hw=hw, published={parent: True})
    assert [(h.kind, h.minor, h.mig_uuid) for h in result.held] == [
        ("compute-mode", 0, None), ("mig", 1, "MIG-b")]
    assert result.checkpoint.claims[UID_A].devices[0].mig.created  # type: ignore[union-attr]
    assert result.checkpoint.mig_mode_baseline == {}  # a held device keeps MIG mode on
    assert kept_mig_instances(result.held) == {(parent, 1)}
    assert held_mig_uuids(result.held) == {"MIG-b"}


def test_a_reserved_claim_without_a_spec_never_finished_and_is_rolled_back(index):
    parent = uuid_of(index, MIG)
    hw = gpus(index, modes={0: EXCLUSIVE}, instances={1: [instance()]})
    claims = {UID_A: api(UID_A, MIG), UID_B: api(UID_B, "gpu-0")}
    result = run(index, hw=hw, claims=claims, published={parent: True})
    assert {uid: r.state for uid, r in result.checkpoint.claims.items()} == {
        UID_A: PREPARE_STARTED, UID_B: PREPARE_STARTED}
    assert result.checkpoint.claims[UID_A].devices[0].mig.created  # type: ignore[union-attr]
    assert result.checkpoint.claims[UID_B].restore.compute_mode == {
        uuid_of(index, "gpu-0"): COMPUTE_MODE_DEFAULT}
    assert len(result.restarted) == 2 and result.rebuilt == () and result.held == ()


def test_a_claim_not_reserved_or_changing_nothing_explains_nothing(index):
    hw = gpus(index, modes={0: EXCLUSIVE})
    unreserved = run(index, hw=hw, claims={UID_A: api(UID_A, "gpu-0", reserved=False)})
    assert unreserved.checkpoint.claims == {} and [h.kind for h in unreserved.held] == [
        "compute-mode"]
    untouched = run(index, claims={UID_A: api(UID_A, "gpu-0")})
    assert untouched.empty


def test_nothing_anywhere_starts_empty(index):
    result = run(index, claims={})
    assert result.empty and result.checkpoint.claims == {}


def test_conflicts_by_scope(index):
    parent = uuid_of(index, MIG)
    mig = HeldDevice(kind="mig", gpu=parent, minor=1, mig_uuid="MIG-b", gpu_instance_id=1,
                     placement=Placement(0, 1), reason="r")
    mode = HeldDevice(kind="compute-mode", gpu=uuid_of(index, "gpu-0"), minor=0, reason="r")
    targets = index.targets
    assert conflict([mig], targets["gpu-1"], admin_access=False) is mig
    assert conflict([mig], targets["gpu-1-mig-1g10gb-19-0"], admin_access=False) is mig
    assert conflict([mig], targets["gpu-1-mig-7g80gb-0-0"], admin_access=False) is mig
    assert conflict([mig], targets[MIG], admin_access=False) is None  # slice 6: free
    assert conflict([mig], targets["gpu-1"], admin_access=True) is None
    assert conflict([mode], targets["gpu-0-mig-1g10gb-19-6"], admin_access=False) is mode
    assert conflict([mode, mig], targets["gpu-2"], admin_access=False) is None


def test_held_devices_are_tainted_no_schedule(index):
    mode = HeldDevice(kind="compute-mode", gpu=uuid_of(index, "gpu-0"), minor=0, reason="r")
    tainted = with_held_taints(index.devices, [mode], index.targets, "2026-01-01T00:00:00Z")
    hit = {d.name for d in tainted.devices if any(t.key == HELD_TAINT for t in d.taints)}
    assert "gpu-0" in hit and "gpu-0-shared" in hit and "gpu-0-mig-1g10gb-19-6" in hit
    assert not any(name.startswith("gpu-1") for name in hit)
    [taint] = next(d for d in tainted.devices if d.name == "gpu-0").taints
    assert (taint.effect, taint.value, taint.time_added) == (
        "NoSchedule", "", "2026-01-01T00:00:00Z")
    assert with_held_taints(index.devices, [], index.targets, "t") is index.devices


def test_held_is_released_once_the_hardware_is_back(index):
    parent = uuid_of(index, MIG)
    mig = HeldDevice(kind="mig", gpu=parent, minor=1, mig_uuid="MIG-b", gpu_instance_id=1,
                     placement=Placement(0, 1), reason="r")
    mode = HeldDevice(kind="compute-mode", gpu=uuid_of(index, "gpu-0"), minor=0, reason="r")
    there = gpus(index, modes={0: EXCLUSIVE}, instances={1: [instance("MIG-b", 1, 0)]})
    assert still_held([mig, mode], there) == ((mig, mode), ())
    assert still_held([mig, mode], gpus(index)) == ((), (mig, mode))


def test_the_held_file_round_trips_and_names_a_bad_field(index):
    mig = HeldDevice(kind="mig", gpu="GPU-1", minor=1, mig_uuid="MIG-b", gpu_instance_id=1,
                     placement=Placement(0, 1), reason="why", claim=None)
    device = HeldDevice(kind="device", claim=UID_A, reason="gone")
    assert parse_held(held_document([mig, device]), "f") == (mig, device)
    bad = json.dumps({"held": [{"kind": "mig", "minor": "1", "reason": "x"}]}).encode()
    with pytest.raises(ValueError, match=r"f: held\[0\]\.minor: expected an integer"):
        parse_held(bad, "f")
    with pytest.raises(ValueError, match=r"f: held\[0\]\.kind"):
        parse_held(b'{"held": [{"kind": "x"}]}', "f")
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_held(b"[" * 100_000, "f")
    with pytest.raises(ValueError, match="expected"):
        parse_held(b"[]", "f")


# --- parsing the survivors --------------------------------------------------------------


def _spec_doc(uid: str, *names: str, kind: str = f"k8s.{DRIVER}/claim") -> bytes:
    return json.dumps({"cdiVersion": "0.5.0", "kind": kind, "devices": [
        {"name": f"{uid}-{n}", "containerEdits": {"env": ["A=1", 5]}} for n in names]}).encode()


def test_parse_spec(tmp_path: Path):
    parsed = parse_spec(UID_A, _spec_doc(UID_A, "gpu-0", MIG), DRIVER)
    assert parsed == ClaimSpec(UID_A, (SpecDevice("gpu-0", ("A=1",)), SpecDevice(MIG, ("A=1",))))
    assert parse_spec(UID_A, _spec_doc(UID_B, "gpu-0"), DRIVER) == (
        f"device name '{UID_B}-gpu-0' does not start with the claim UID")
    assert parse_spec(UID_A, _spec_doc(UID_A, "gpu-0", kind="other/claim"), DRIVER) == (
        f"kind is not k8s.{DRIVER}/claim")
    assert parse_spec(UID_A, b"{", DRIVER) == "not valid JSON"
    assert parse_spec(UID_A, b"[" * 100_000, DRIVER) == "not valid JSON"
    assert parse_spec(UID_A, b" " * (MAX_SPEC_BYTES + 1), DRIVER) == (
        f"larger than {MAX_SPEC_BYTES} bytes")
    assert parse_spec(UID_A, b'{"kind": "k8s.gpu.nvidia.com/claim", "devices": []}',
                      DRIVER) == "no devices"
    assert "is not a lower-case RFC 4122 UUID" in str(parse_spec("..", b"{}", DRIVER))
    assert parse_spec(UID_A, _spec_doc(UID_A, "../gpu-0"), DRIVER) == (
        f"device name '{UID_A}-../gpu-0' is not a device this driver names")


def _claim_obj(uid: Any = UID_A, *, node: str = NODE, driver: str = DRIVER,
               reserved: bool = True, **result: Any) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "namespace": "ns", "name": "c"}, "status": {
        "allocation": {"devices": {"results": [
            {"request": "r", "driver": driver, "pool": node, "device": "gpu-0", **result}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        **({"reservedFor": [{"resource": "pods", "name": "p"}]} if reserved else {})}}


def test_api_claims_keep_only_this_nodes_driver_and_pool():
    objects = [
        _claim_obj(shareID=SHARE_ID, adminAccess=True,
                   consumedCapacity={"memory": "20Gi", "shares": "1", "bad": "1.5"}),
        _claim_obj(UID_B, node="node-b"),
        _claim_obj(UID_C, driver="other.example.com"),
        _claim_obj(5), {"metadata": []}, "junk", {"metadata": {"uid": "x"}, "status": "s"},
        _claim_obj(UID_D, reserved=False),
    ]
    found = api_claims(objects, driver=DRIVER, pool=POOL, node=NODE)
    assert sorted(found) == [UID_A, UID_D]
    [result] = found[UID_A].results
    assert (result.device, result.request, result.admin_access, result.share_id) == (
        "gpu-0", "r", True, SHARE_ID)
    assert result.consumed == {"memory": 20 << 30, "shares": 1}
    assert found[UID_A].reserved and not found[UID_D].reserved


@pytest.mark.parametrize(("field", "value"), [
    ("uid", "../../etc"), ("uid", "0A0A0A0A-0000-4000-8000-00000000000A"),
    ("namespace", "a/b"), ("name", "x" * 300), ("request", "../r"), ("device", "gpu 0"),
    ("shareID", "/tmp/x"),
])
def test_api_claims_with_identifiers_out_of_their_form_are_left_out(field, value):
    """The API server is untrusted: what would reach a log line, a record or a path is
    checked first; a claim that fails is not used (its spec, if any, still names it)."""
    obj = _claim_obj()
    if field in ("uid", "namespace", "name"):
        obj["metadata"][field] = value
    else:
        obj["status"]["allocation"]["devices"]["results"][0][field] = value
    assert api_claims([obj], driver=DRIVER, pool=POOL, node=NODE) == {}


def test_published_mig_tells_dynamic_from_static():
    def device(kind: str, gpu: str, counters: bool) -> dict[str, Any]:
        key = "parentUUID" if kind == "mig" else "uuid"
        return {"name": "d", "attributes": {"type": {"string": kind}, key: {"string": gpu}},
                **({"consumesCounters": [{"counterSet": "c"}]} if counters else {})}
    slices = [
        {"spec": {"driver": DRIVER, "nodeName": NODE, "devices": [
            device("gpu", "GPU-0", True), device("mig", "GPU-0", True),
            device("mig", "GPU-1", False), device("gpu", "GPU-2", False)]}},
        {"spec": {"driver": DRIVER, "nodeName": "node-b", "devices": [
            device("mig", "GPU-9", True)]}},
        "junk", {"spec": {"driver": DRIVER, "nodeName": NODE, "devices": "x"}},
    ]
    assert published_mig(slices, driver=DRIVER, node=NODE) == {
        "GPU-0": True, "GPU-1": False, "GPU-2": False}
