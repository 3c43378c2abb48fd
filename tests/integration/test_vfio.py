"""VFIO passthrough through the real daemon: a ``gpudra node`` process with the
PassthroughSupport gate, the kubelet emulator over real gRPC, the API stand-in over HTTP,
simulated NVML and sysfs. A GPU goes to ``vfio-pci`` for a claim (NVML stops seeing it),
comes back to ``nvidia`` at unprepare (NVML sees it again), is refused while it or its IOMMU
group is in use, and a crash at each step is rolled back or finished by the restart: never a
GPU left on ``vfio-pci`` without a claim."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from gpudra.api.claims import ClaimRef
from gpudra.driver.checkpoint_store import CheckpointStore
from gpudra.driver.sim import SimControl
from gpudra.driver.sim.pci import FIRST_GROUP, share_iommu_group
from gpudra.driver.sim.state import StateStore
from gpudra.driver.vfio_sysfs import PciSysfs
from gpudra.scheduling.allocator import Allocator
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import DRIVER, Daemon, create_claim, node_daemon
from tests.integration.test_claim_status_daemon import entries, eventually

GATE = ("--feature-gates", "PassthroughSupport=true")
BUS = {0: "0000:1b:00.0", 1: "0000:43:00.0", 2: "0000:52:00.0"}
"""Sysfs bus ids of the dgx-h100 profile's first GPUs."""


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    with node_daemon(fake_api, extra_args=GATE) as d:
        yield d


def sysfs(daemon: Daemon) -> PciSysfs:
    return PciSysfs(daemon.sim_state / "sys")


def nvml_sees(daemon: Daemon, gpu: int) -> bool:
    return StateStore(daemon.sim_state).read().gpus[gpu].enumerated


def spec(daemon: Daemon, ref: ClaimRef) -> dict[str, Any]:
    path = daemon.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json"
    return dict(json.loads(path.read_text()))


def checkpoint_claims(daemon: Daemon) -> dict[str, Any]:
    store = CheckpointStore(daemon.plugins / DRIVER)
    return dict(store.load().claims)


def published(fake_api: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in fake_api.list("ResourceSlice")
            for d in s["spec"].get("devices", [])}


def vfio_claim(api: FakeApiServer, name: str, gpu: int) -> ClaimRef:
    return create_claim(api, name, devices=[f"gpu-vfio-{gpu}"])


async def test_publishes_each_gpu_as_vfio_sharing_its_counters(daemon, fake_api):
    daemon.extra_args = (*GATE, "--dynamic-mig-gpus", "none")  # no MIG: a counter of its own
    daemon.start()
    devices = await eventually(lambda: (d := published(fake_api)) and "gpu-vfio-7" in d and d,
                               "vfio devices published")
    vfio, gpu = devices["gpu-vfio-1"], devices["gpu-1"]
    attrs = vfio["attributes"]
    assert attrs["type"] == {"string": "vfio"}
    pci = "resource.kubernetes.io/pciBusID"
    assert attrs[pci] == gpu["attributes"][pci] == {"string": "0000:43:00.0"}
    assert attrs["iommuGroup"] == {"int": FIRST_GROUP + 1}
    assert attrs["productName"] == gpu["attributes"]["productName"]
    assert "driverVersion" not in attrs  # a VM brings its own driver
    assert vfio["consumesCounters"] == gpu["consumesCounters"]
    [counter_set] = [s for s in fake_api.list("ResourceSlice") if "sharedCounters" in s["spec"]]
    names = {c["name"] for c in counter_set["spec"]["sharedCounters"]}
    assert vfio["consumesCounters"][0]["counterSet"] in names


async def test_with_dynamic_mig_the_vfio_device_takes_the_whole_mig_counter_set(
        daemon, fake_api):
    daemon.start()
    devices = await eventually(lambda: (d := published(fake_api)) and "gpu-vfio-0" in d and d,
                               "vfio devices published")
    assert devices["gpu-vfio-0"]["consumesCounters"] == devices["gpu-0"]["consumesCounters"]
    assert any(d.get("consumesCounters", [{}])[0].get("counterSet") ==
               devices["gpu-0"]["consumesCounters"][0]["counterSet"]
               for name, d in devices.items() if name.startswith("gpu-0-mig"))


async def test_gate_off_publishes_no_vfio_device_and_refuses_one(fake_api):
    with node_daemon(fake_api) as daemon:
        ref = vfio_claim(fake_api, "vm", 0)
        daemon.start()
        await eventually(lambda: "gpu-0" in published(fake_api), "GPUs published")
        assert not [n for n in published(fake_api) if "vfio" in n]
        async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
            answer = await kubelet.prepare([ref])
        assert "PassthroughSupport" in answer[ref.uid]["error"]
        assert not (daemon.sim_state / "sys").exists()  # nothing laid out, nothing bound


async def test_prepare_binds_vfio_pci_and_unprepare_gives_the_gpu_back(daemon, fake_api):
    ref = vfio_claim(fake_api, "vm", 1)
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        answer = await kubelet.prepare([ref])
        assert answer[ref.uid]["error"] == "", answer
        assert sysfs(daemon).driver(BUS[1]) == "vfio-pci"
        assert not nvml_sees(daemon, 1) and nvml_sees(daemon, 0)
        [device] = spec(daemon, ref)["devices"]
        nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
        assert nodes == ["/dev/vfio/vfio", f"/dev/vfio/{FIRST_GROUP + 1}"]
        common = spec(daemon, ref)["containerEdits"]
        assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
        assert "mounts" not in common  # no driver libraries for a VM
        [entry] = await eventually(lambda: entries(fake_api, ref), "device status")
        assert entry["data"]["pciBusID"] == BUS[1]
        assert entry["data"]["iommuGroup"] == FIRST_GROUP + 1
        assert entry["data"]["kind"] == "vfio"

        again = await kubelet.prepare([ref])  # the kubelet's retry: the same answer
        assert again[ref.uid] == answer[ref.uid]

        done = await kubelet.unprepare([ref])
        assert done[ref.uid]["error"] == "", done
    assert sysfs(daemon).driver(BUS[1]) == "nvidia"
    assert nvml_sees(daemon, 1)
    assert (sysfs(daemon).device_dir(BUS[1]) / "driver_override").read_text().strip() == "(null)"
    assert checkpoint_claims(daemon) == {}
    assert daemon.stop() == 0


async def test_a_gpu_with_processes_is_refused_and_left_alone(daemon, fake_api):
    ref = vfio_claim(fake_api, "vm", 2)
    daemon.start()
    SimControl(daemon.sim_state).add_process(2, 4242)
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        answer = await kubelet.prepare([ref])
    error = answer[ref.uid]["error"]
    assert "running processes (pids 4242)" in error and "default/vm" in error, error
    assert sysfs(daemon).driver(BUS[2]) == "nvidia"
    assert checkpoint_claims(daemon) == {}


async def test_the_iommu_group_is_taken_whole(daemon, fake_api):
    """GPUs 0 and 1 behind one switch without ACS share a group: a claim on one GPU
    refuses the other's passthrough, and a passed-through group refuses the other GPU."""
    daemon.start(wait=False)  # lays out sysfs; the group is changed before it is read
    daemon.wait_registered()
    daemon.stop()
    group = share_iommu_group(daemon.sim_state, [0, 1])
    plain = create_claim(fake_api, "pod", devices=["gpu-0"])
    vm = vfio_claim(fake_api, "vm", 1)
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([plain]))[plain.uid]["error"] == ""
        error = (await kubelet.prepare([vm]))[vm.uid]["error"]
        assert f"same IOMMU group {group}" in error and "default/pod" in error, error
        assert sysfs(daemon).driver(BUS[1]) == "nvidia"

        assert (await kubelet.unprepare([plain]))[plain.uid]["error"] == ""
        assert (await kubelet.prepare([vm]))[vm.uid]["error"] == ""
        assert sysfs(daemon).driver(BUS[0]) == sysfs(daemon).driver(BUS[1]) == "vfio-pci"
        again = create_claim(fake_api, "pod-2", devices=["gpu-0"])
        error = (await kubelet.prepare([again]))[again.uid]["error"]
        assert "passes through its IOMMU group" in error and "default/vm" in error, error

        assert (await kubelet.unprepare([vm]))[vm.uid]["error"] == ""
    assert sysfs(daemon).driver(BUS[0]) == sysfs(daemon).driver(BUS[1]) == "nvidia"
    assert nvml_sees(daemon, 0) and nvml_sees(daemon, 1)


PREPARE_CRASHES = ("prepare:after-started", "prepare:after-vfio-unbind",
                   "prepare:after-vfio-bind", "prepare:after-settings",
                   "prepare:after-cdi-write", "prepare:after-cdi-sync")
"""Every crash point a vfio claim's prepare passes, in order."""


@pytest.mark.parametrize("point", PREPARE_CRASHES)
async def test_a_crash_while_preparing_is_rolled_back_at_start(daemon, fake_api, point):
    ref = vfio_claim(fake_api, "vm", 1)
    daemon.env["GPUDRA_CRASH_AT"] = point
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        with pytest.raises(grpc.aio.AioRpcError):  # the daemon dies inside the call
            await kubelet.prepare([ref])
    assert daemon.process is not None
    assert daemon.process.wait(20) == 86
    daemon.stop_kubelet()
    del daemon.env["GPUDRA_CRASH_AT"]
    daemon.start()  # start-up rolls the interrupted prepare back
    assert sysfs(daemon).driver(BUS[1]) == "nvidia", point
    assert nvml_sees(daemon, 1)
    assert checkpoint_claims(daemon) == {}
    assert not list(daemon.cdi_root.glob("*.json"))
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""  # the retry works
        assert sysfs(daemon).driver(BUS[1]) == "vfio-pci"
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert sysfs(daemon).driver(BUS[1]) == "nvidia"


UNPREPARE_CRASHES = ("unprepare:after-vfio-unbind", "unprepare:after-vfio-rebind",
                     "unprepare:after-settings-restored", "unprepare:after-mig-destroy",
                     "unprepare:after-cdi-remove")
"""Every crash point a vfio claim's unprepare passes, in order."""


@pytest.mark.parametrize("point", UNPREPARE_CRASHES)
async def test_a_crash_while_unpreparing_is_finished_by_the_retry(daemon, fake_api, point):
    ref = vfio_claim(fake_api, "vm", 1)
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
    daemon.stop()
    daemon.env["GPUDRA_CRASH_AT"] = point
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.unprepare([ref])
    assert daemon.process is not None
    assert daemon.process.wait(20) == 86
    daemon.stop_kubelet()
    del daemon.env["GPUDRA_CRASH_AT"]
    daemon.start()
    # Still the claim's: the kubelet retries the unprepare, which finishes the job.
    assert ref.uid in checkpoint_claims(daemon)
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert sysfs(daemon).driver(BUS[1]) == "nvidia", point
    assert nvml_sees(daemon, 1)
    assert checkpoint_claims(daemon) == {}


async def test_a_restart_while_a_vm_holds_the_gpu_keeps_it_and_republishes_it_after(
        daemon, fake_api):
    ref = vfio_claim(fake_api, "vm", 1)
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
    daemon.stop()
    daemon.start()  # NVML does not list GPU 1 now: it stays the VM's
    assert sysfs(daemon).driver(BUS[1]) == "vfio-pci"
    assert ref.uid in checkpoint_claims(daemon)
    await eventually(lambda: "gpu-0" in published(fake_api), "GPUs published")
    assert "gpu-1" not in published(fake_api) and "gpu-vfio-1" not in published(fake_api)
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""  # kubelet's retry
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert sysfs(daemon).driver(BUS[1]) == "nvidia" and nvml_sees(daemon, 1)
    # Back in NVML: published again (found by the health watcher's probe).
    await eventually(lambda: {"gpu-1", "gpu-vfio-1"} <= set(published(fake_api)),
                     "GPU 1 published again", seconds=30)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vfio-passthrough"


async def test_the_kubevirt_example_gets_a_gpu_through_its_claim(daemon, fake_api):
    """examples/vfio-passthrough/: the VMI's claim, made from its template as KubeVirt makes
    it, is allocated by the reference allocator on the slices the daemon published and
    prepared over gRPC; the VM's launcher gets the VFIO nodes and the claim the PCI address."""
    objects = [doc for path in sorted(EXAMPLE.glob("*.yaml"))
               for doc in yaml.safe_load_all(path.read_text()) if doc]
    [vmi] = [o for o in objects if o["kind"] == "VirtualMachineInstance"]
    templates = {o["metadata"]["name"]: o for o in objects
                 if o["kind"] == "ResourceClaimTemplate"}
    [gpu] = vmi["spec"]["domain"]["devices"]["gpus"]
    [entry] = [e for e in vmi["spec"]["resourceClaims"] if e["name"] == gpu["claimName"]]
    template = templates[entry["resourceClaimTemplateName"]]
    assert gpu["requestName"] in {r["name"] for r in template["spec"]["spec"]["devices"]
                                  ["requests"]}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "virt-launcher-gpu-vm-gpu", "namespace": "default"},
             "spec": template["spec"]["spec"]}
    daemon.start()
    await eventually(lambda: "gpu-vfio-7" in published(fake_api), "vfio devices published")
    classes = [yaml.safe_load(p.read_text())
               for p in sorted((EXAMPLE.parents[1] / "deploy" / "deviceclasses").glob("*.yaml"))]
    allocation = Allocator(fake_api.list("ResourceSlice"), classes).allocate(claim, "node-a")
    assert allocation.allocatable, allocation.blocking
    [result] = allocation.results
    assert [r["device"] for r in result["devices"]["results"]] == ["gpu-vfio-0"]
    stored = fake_api.put({**claim, "status": {"allocation": result}})
    meta = stored["metadata"]
    ref = ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        answer = await kubelet.prepare([ref])
        assert answer[ref.uid]["error"] == "", answer
        [device] = spec(daemon, ref)["devices"]
        assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == [
            "/dev/vfio/vfio", f"/dev/vfio/{FIRST_GROUP}"]
        [status] = await eventually(lambda: entries(fake_api, ref), "device status")
        assert status["data"]["pciBusID"] == BUS[0]
        assert sysfs(daemon).driver(BUS[0]) == "vfio-pci"
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert sysfs(daemon).driver(BUS[0]) == "nvidia" and nvml_sees(daemon, 0)


def taints(fake_api: FakeApiServer, device: str) -> set[str]:
    return {t["key"] for t in published(fake_api).get(device, {}).get("taints", [])}


async def test_a_gpu_with_a_vm_is_unmonitored_not_lost(daemon, fake_api):
    """NVML cannot see a GPU on vfio-pci; the health watcher knows why: no gpu-lost taint,
    no "GPU is lost" error, but unmonitored (its health is the VM's) until it is back."""
    ref = vfio_claim(fake_api, "vm", 1)
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
        await eventually(lambda: "gpu.nvidia.com/unmonitored" in taints(fake_api, "gpu-vfio-1"),
                         "the VM's GPU reported unmonitored")
        assert "gpu.nvidia.com/gpu-lost" not in taints(fake_api, "gpu-vfio-1")
        assert not taints(fake_api, "gpu-vfio-0")  # the others are watched as before
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    await eventually(lambda: not taints(fake_api, "gpu-vfio-1"), "GPU 1 watched again",
                     seconds=30)
    lost = [e for e in daemon.events() if e.get("event") == "GPU is lost (NVML GPU_IS_LOST)"]
    assert lost == []


async def test_a_gpu_on_vfio_pci_that_no_claim_holds_is_named_and_left_alone(daemon, fake_api):
    daemon.start()  # lays out the simulated sysfs
    daemon.stop()
    sysfs = PciSysfs(daemon.sim_state / "sys")
    from gpudra.driver.sim.pci import SimPciSysfs

    kernel = SimPciSysfs(daemon.sim_state, daemon.base / "admin-dev")
    kernel.unbind(BUS[2])  # an admin's passthrough, outside gpudra
    kernel.bind(BUS[2], "vfio-pci")
    daemon.start()
    [warning] = [e for e in daemon.events()[1:] if "no claim of this node" in e.get("event", "")]
    assert warning["functions"] == [BUS[2]]
    assert sysfs.driver(BUS[2]) == "vfio-pci"  # not ours to change
    await eventually(lambda: "gpu-0" in published(fake_api), "GPUs published")
    assert "gpu-2" not in published(fake_api)  # NVML cannot see it: nobody is offered it


async def test_a_vm_taking_a_group_locks_every_gpu_of_it(daemon, fake_api):
    """A vfio claim holds the locks of every GPU of its IOMMU group while it works, so a
    claim for another GPU of the group, arriving meanwhile in another kubelet call, waits and
    is then refused, instead of being prepared on a GPU that is going to the VM."""
    daemon.start()  # lays out sysfs
    daemon.stop()
    share_iommu_group(daemon.sim_state, [0, 1])
    vm = vfio_claim(fake_api, "vm", 1)
    pod = create_claim(fake_api, "pod", devices=["gpu-0"])
    daemon.env["GPUDRA_DELAY_AT"] = "prepare:hardware=2"  # the VM's prepare is slow
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        first = asyncio.ensure_future(kubelet.prepare([vm]))
        # The VM's claim is recorded as started before its slow part: now send the pod's.
        await eventually(lambda: vm.uid in checkpoint_claims(daemon), "the VM's prepare started")
        second = await kubelet.prepare([pod])
        assert (await first)[vm.uid]["error"] == ""
    error = second[pod.uid]["error"]
    assert "passes through its IOMMU group" in error and "default/vm" in error, error
    assert sysfs(daemon).driver(BUS[0]) == "vfio-pci"
    assert set(checkpoint_claims(daemon)) == {vm.uid}
