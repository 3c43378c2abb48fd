"""VFIO passthrough's parts, on a simulated node's sysfs and NVML: bus ids, the simulated
kernel's binding rules, release from every state a crash can leave, the bounded wait for NVML
(an injected clock: no real waiting), and the CDI nodes with and without iommufd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.api.claims import claim_ref
from gpudra.driver import sim
from gpudra.driver.cdi import DeviceNode
from gpudra.driver.checkpoint_model import (
    PREPARE_COMPLETED,
    ClaimRecord,
    DeviceRecord,
    VfioFunction,
    VfioRecord,
)
from gpudra.driver.nvml import Nvml, open_nvml
from gpudra.driver.sim.pci import FIRST_GROUP, SimPciSysfs, add_function, share_iommu_group
from gpudra.driver.vfio import VfioError, VfioPassthrough
from gpudra.driver.vfio_sysfs import SysfsError, check_bus_id, sysfs_bus_id

GPU0 = "0000:1b:00.0"
GPU1 = "0000:43:00.0"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Nvml, Path]]:
    nvml = open_nvml(simulate="dgx-h100", sim_state=tmp_path / "sim")
    try:
        yield nvml, tmp_path
    finally:
        nvml.shutdown()
        sim.uninstall()


def sysfs_of(tmp: Path, *, iommufd: bool = False) -> SimPciSysfs:
    return SimPciSysfs(tmp / "sim", tmp / "dev-root", iommufd=iommufd)


def passthrough(nvml: Nvml, tmp: Path, **kwargs: object) -> VfioPassthrough:
    uuids = {GPU0: nvml.probe_all()[0].uuid}  # type: ignore[union-attr]
    return VfioPassthrough(sysfs_of(tmp), nvml, enabled=True,
                           gpu_bus_ids=lambda: {u: b for b, u in uuids.items()},
                           **kwargs)  # type: ignore[arg-type]


def record(uuid: str, functions: list[VfioFunction], group: int = FIRST_GROUP) -> ClaimRecord:
    device = DeviceRecord(request_names=["gpu"], pool="node", device="gpu-vfio-0",
                          cdi_device_ids=[], kind="gpu", uuid=uuid,
                          vfio=VfioRecord(iommu_group=group, functions=functions))
    return ClaimRecord(uid="c1", namespace="default", name="vm", state=PREPARE_COMPLETED,
                       devices=[device])


def test_bus_ids_from_nvml_and_checked_before_they_reach_a_path():
    assert sysfs_bus_id("00000000:1B:00.0") == GPU0
    assert sysfs_bus_id("0000:1b:00.0") == GPU0
    for bad in ("../../etc", "0000:1b:00.8", "00010000:1b:00.0", "123456789:1b:00.0"):
        with pytest.raises(ValueError, match=r"bus id|domain"):
            sysfs_bus_id(bad)
    with pytest.raises(ValueError, match="sysfs PCI bus id"):
        check_bus_id("0000:1B:00.0/../x")


def test_the_simulated_kernel_moves_a_gpu_and_nvml_follows(node):
    nvml, tmp = node
    sysfs = sysfs_of(tmp)
    uuid = nvml.probe_all()[0].uuid  # type: ignore[union-attr]
    assert sysfs.driver(GPU0) == "nvidia" and sysfs.iommu_group(GPU0) == FIRST_GROUP
    assert sysfs.group_devices(FIRST_GROUP) == [GPU0]
    sysfs.unbind(GPU0)
    assert sysfs.driver(GPU0) is None
    assert nvml.why_unavailable(uuid) is not None  # the nvidia driver let go of it
    sysfs.bind(GPU0, "vfio-pci")
    assert sysfs.driver(GPU0) == "vfio-pci"
    assert (tmp / "dev-root/dev/vfio" / str(FIRST_GROUP)).exists()
    sysfs.unbind(GPU0)
    assert not (tmp / "dev-root/dev/vfio" / str(FIRST_GROUP)).exists()
    sysfs.bind(GPU0, "nvidia")
    assert nvml.why_unavailable(uuid) is None
    assert (sysfs.device_dir(GPU0) / "driver_override").read_text().strip() == "(null)"


def test_the_simulated_kernel_refuses_what_the_real_one_does(node):
    _, tmp = node
    sysfs = sysfs_of(tmp)
    with pytest.raises(SysfsError, match="has a driver already"):
        sysfs.write(sysfs.driver_dir("vfio-pci") / "bind", GPU0)
    sim.SimControl(tmp / "sim").add_process(0, 77)
    with pytest.raises(SysfsError, match="in use by 1 process"):
        sysfs.unbind(GPU0)
    assert sysfs.driver(GPU0) == "nvidia"


def test_groups_and_other_functions(node):
    _, tmp = node
    group = share_iommu_group(tmp / "sim", [0, 1])
    audio = add_function(tmp / "sim", 0, 1)
    sysfs = sysfs_of(tmp)
    assert sysfs.group_devices(group) == sorted([GPU0, GPU1, audio])
    assert sysfs.iommu_group(GPU1) == group and sysfs.driver(audio) == "snd_hda_intel"
    nvidia = sysfs.functions("0x10de")  # the 8 GPUs and the audio function
    assert len(nvidia) == 9 and {GPU0, GPU1, audio} <= set(nvidia)


@pytest.mark.parametrize("left_at", ["nvidia", "none", "vfio-pci"])
def test_release_puts_back_what_any_crash_left(node, left_at):
    nvml, tmp = node
    vfio = passthrough(nvml, tmp)
    uuid = nvml.probe_all()[0].uuid  # type: ignore[union-attr]
    audio = add_function(tmp / "sim", 0, 1)
    sysfs = vfio.sysfs
    if left_at != "nvidia":
        sysfs.unbind(GPU0)
        sysfs.unbind(audio)
    if left_at == "vfio-pci":
        sysfs.bind(GPU0, "vfio-pci")
        sysfs.bind(audio, "vfio-pci")
    done = record(uuid, [VfioFunction(bus_id=GPU0, previous_driver="nvidia", gpu_uuid=uuid),
                         VfioFunction(bus_id=audio, previous_driver="snd_hda_intel")])
    vfio.release(done)
    vfio.release(done)  # idempotent: the kubelet's retry
    assert sysfs.driver(GPU0) == "nvidia" and sysfs.driver(audio) == "snd_hda_intel"
    assert nvml.why_unavailable(uuid) is None


def test_release_leaves_a_function_someone_else_rebound(node):
    nvml, tmp = node
    vfio = passthrough(nvml, tmp)
    audio = add_function(tmp / "sim", 0, 1, driver="snd_hda_intel")
    vfio.sysfs.unbind(audio)
    vfio.sysfs.bind(audio, "nvidia")  # an admin's doing: not ours to change
    vfio.release(record("GPU-x", [VfioFunction(bus_id=audio, previous_driver=None)]))
    assert vfio.sysfs.driver(audio) == "nvidia"


def test_the_wait_for_nvml_is_bounded_by_the_injected_clock(node):
    nvml, tmp = node
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    vfio = passthrough(nvml, tmp, rebind_timeout=2.0, clock=lambda: now[0], sleep=sleep)
    uuid = nvml.probe_all()[0].uuid  # type: ignore[union-attr]
    sim.SimControl(tmp / "sim").set_gpu_lost(0, True)  # bound to nvidia, yet NVML fails
    with pytest.raises(VfioError, match="NVML does not see it after 2s"):
        vfio.release(record(uuid, [VfioFunction(bus_id=GPU0, previous_driver="nvidia",
                                                gpu_uuid=uuid)]))
    assert now[0] >= 2.0 and len(slept) == pytest.approx(20, abs=1)
    sim.SimControl(tmp / "sim").set_gpu_lost(0, False)
    slept.clear()
    vfio.release(record(uuid, [VfioFunction(bus_id=GPU0, previous_driver="nvidia",
                                            gpu_uuid=uuid)]))
    assert slept == []  # seen at once: no wait


def test_cdi_nodes_legacy_and_iommufd(node):
    nvml, tmp = node
    (tmp / "dev-root/dev").mkdir(parents=True)
    (tmp / "dev-root/dev/iommu").touch()
    vfio = VfioPassthrough(sysfs_of(tmp, iommufd=True), nvml, enabled=True,
                           gpu_bus_ids=dict)
    vfio.sysfs.unbind(GPU0)
    vfio.sysfs.bind(GPU0, "vfio-pci")
    cdev = vfio.sysfs.vfio_cdev(GPU0)
    assert cdev is not None and cdev.startswith("vfio")

    def node_at(path: str) -> DeviceNode | None:
        return DeviceNode(path=path) if (tmp / "dev-root" / path.lstrip("/")).exists() else None

    done = VfioRecord(iommu_group=FIRST_GROUP,
                      functions=[VfioFunction(bus_id=GPU0, previous_driver="nvidia")])
    paths = [n.path for n in vfio.container_edits(done, node_at).device_nodes]
    assert paths == ["/dev/vfio/vfio", f"/dev/vfio/{FIRST_GROUP}", "/dev/iommu",
                     f"/dev/vfio/devices/{cdev}"]
    vfio.sysfs.unbind(GPU0)
    with pytest.raises(Exception, match="no VFIO device node for IOMMU group"):
        vfio.container_edits(done, node_at)


def test_refusals_name_the_claim_and_change_nothing(node):
    from gpudra.driver.claims import ClaimError, ClaimToPrepare
    from gpudra.driver.vfio import VfioRequest

    nvml, tmp = node
    uuid = nvml.probe_all()[0].uuid  # type: ignore[union-attr]
    claim = ClaimToPrepare(uid="c2", namespace="default", name="vm", devices=(), configs=())
    ref = claim_ref("default", "vm", "c2")
    request = VfioRequest("gpu-vfio-0", uuid, GPU0)
    off = VfioPassthrough(sysfs_of(tmp), nvml, enabled=False, gpu_bus_ids=dict)
    with pytest.raises(ClaimError, match=f"claim {ref}: .*feature gate PassthroughSupport"):
        off.plan(claim, request, None, False)
    on = passthrough(nvml, tmp)
    with pytest.raises(ClaimError, match="takes no opaque config"):
        on.plan(claim, request, None, True)
    unloaded = on.sysfs.driver_dir("vfio-pci").rename(tmp / "vfio-pci-unloaded")
    with pytest.raises(ClaimError, match=r"vfio-pci driver is not loaded .*modprobe vfio-pci"):
        on.plan(claim, request, None, False)
    unloaded.rename(on.sysfs.driver_dir("vfio-pci"))
    planned = on.plan(claim, request, None, False)
    assert planned.functions == [VfioFunction(bus_id=GPU0, previous_driver="nvidia",
                                              gpu_uuid=uuid)]
    assert on.sysfs.driver(GPU0) == "nvidia"  # planning changes nothing
