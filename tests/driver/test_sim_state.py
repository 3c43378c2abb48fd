"""State on disk: restarts and other processes see the same GPUs; writes never interleave."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
import time

import pynvml
import pytest

from gpudra.driver import sim
from gpudra.driver.sim.state import StateStore

ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE


def run_python(code: str, timeout: float = 30) -> str:
    """Run ``code`` in a fresh interpreter (a separate process with its own pynvml)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def layout(handle):
    """(profile id, start) of every GPU instance, through the real wrappers."""
    found = []
    for profile_id in (0, 5, 9, 14, 15, 19, 20):
        array = (pynvml.c_nvmlGpuInstance_t * 8)()
        count = ctypes.c_uint(0)
        pynvml.nvmlDeviceGetGpuInstances(handle, profile_id, array, ctypes.byref(count))
        for i in range(count.value):
            info = pynvml.nvmlGpuInstanceGetInfo(array[i])
            found.append((info.profileId, info.placement.start))
    return sorted(found)


def test_first_install_seeds_the_state_file(sim_state):
    sim.install("dgx-h100", sim_state)
    try:
        data = json.loads((sim_state / "state.json").read_text())
    finally:
        sim.uninstall()
    assert data["profile"] == "dgx-h100" and len(data["gpus"]) == 8
    assert not list(sim_state.glob(".state.json.*")), "temp files must not linger"


def test_a_second_install_sees_what_the_first_created(simulate, sim_state):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(5)
    pynvml.nvmlDeviceSetMigMode(handle, ENABLE)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(4, 4)
    pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, ctypes.byref(placement))
    pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(2), 3)

    simulate("dgx-h100")  # a restart: new library object, same state directory
    handle = pynvml.nvmlDeviceGetHandleByIndex(5)
    assert pynvml.nvmlDeviceGetMigMode(handle) == [ENABLE, ENABLE]
    assert layout(handle) == [(9, 4)]
    assert pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(2)) == 3


def test_another_process_sees_instances_and_a_crash_keeps_them(simulate, sim_state):
    simulate("dgx-a100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetMigMode(handle, ENABLE)
    pynvml.nvmlDeviceCreateGpuInstance(handle, 14)  # driver's choice: 2g at 4
    # The child sees it, creates one more and dies without any cleanup.
    out = run_python(f"""
        import ctypes, os, pynvml
        from pathlib import Path
        from gpudra.driver import sim
        sim.install("dgx-a100", Path({str(sim_state)!r}))
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        arr = (pynvml.c_nvmlGpuInstance_t * 3)(); n = ctypes.c_uint()
        pynvml.nvmlDeviceGetGpuInstances(h, 14, arr, ctypes.byref(n))
        print(pynvml.nvmlGpuInstanceGetInfo(arr[0]).placement.start, flush=True)
        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 19, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(0, 1)))
        os._exit(0)  # no nvmlShutdown, no cleanup: as abrupt as a crash
    """)
    assert out.strip() == "4"
    assert layout(handle) == [(14, 4), (19, 0)]


def test_another_profile_on_a_node_is_new_hardware(sim_state):
    """The node's GPUs were swapped while it was down: the old state is gone, and a process
    still running on the old hardware finds every GPU lost rather than the new GPUs."""
    old = sim.install("dgx-h100", sim_state)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetMigMode(handle, ENABLE)
    old_uuid = pynvml.nvmlDeviceGetUUID(handle)
    try:
        new = sim.install("dgx-a100", sim_state)
        assert sim.SimControl(sim_state).snapshot()["profile"] == "dgx-a100"
        pynvml.nvmlInit()
        fresh = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetUUID(fresh) != old_uuid
        assert pynvml.nvmlDeviceGetMigMode(fresh) == [0, 0]
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID(old_uuid)
        # the old library (a process that did not notice) sees its GPUs gone
        assert old.nvmlDeviceGetComputeMode(handle, ctypes.byref(ctypes.c_int())) == \
            pynvml.NVML_ERROR_GPU_IS_LOST
        assert new.node.name == "dgx-a100"
    finally:
        sim.uninstall()


def test_control_needs_an_installed_node(tmp_path):
    with pytest.raises(FileNotFoundError, match="install"):
        sim.SimControl(tmp_path)


def test_concurrent_writers_never_lose_an_update(simulate, sim_state):
    """Two processes and this one add processes at once; every single one must survive."""
    simulate("l4-x4")
    script = f"""
        import sys
        from pathlib import Path
        from gpudra.driver import sim
        control = sim.SimControl(Path({str(sim_state)!r}))
        base = int(sys.argv[1])
        for pid in range(base, base + 25):
            control.add_process(pid % 4, pid)
    """
    children = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), str(base)])
                for base in (1000, 2000)]
    control = sim.SimControl(sim_state)
    for pid in range(3000, 3025):
        control.add_process(pid % 4, pid)
    assert all(child.wait(timeout=30) == 0 for child in children)
    pids = {p["pid"] for g in control.snapshot()["gpus"] for p in g["processes"]}
    assert len(pids) == 75
    seen = {p.pid for i in range(4)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(
                pynvml.nvmlDeviceGetHandleByIndex(i))}
    assert seen == pids


def test_reading_unchanged_state_is_cheap(simulate, sim_state):
    simulate("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    store = StateStore(sim_state)
    store.read()
    calls = 2000
    start = time.perf_counter()
    for _ in range(calls):
        store.read()
    per_read = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    for _ in range(calls):
        pynvml.nvmlDeviceGetMigMode(handle)
    per_call = (time.perf_counter() - start) / calls
    assert per_read < 50e-6 and per_call < 100e-6, (per_read, per_call)


def test_snapshot_describes_everything(simulate, sim_state):
    simulate("dgx-a100-static-mig")
    control = sim.SimControl(sim_state)
    snap = control.snapshot()
    gpu0 = snap["gpus"][0]
    assert snap["profile"] == "dgx-a100-static-mig" and snap["driver_version"] == "580.95.05"
    assert gpu0["mig_mode"] == {"current": 1, "pending": 1}
    assert gpu0["pci_bus_id"] == "00000000:07:00.0" and gpu0["model"] == "A100-SXM4-40GB"
    assert [(gi["profile"], gi["placement"]["start"]) for gi in gpu0["gpu_instances"]] == [
        ("3g.20gb", 4), ("2g.10gb", 2), ("1g.5gb", 0), ("1g.5gb", 1)]
    mig_uuid = gpu0["gpu_instances"][0]["compute_instances"][0]["uuid"]
    control.add_process(0, 7, mig_uuid)
    control.set_gpu_lost(3, True)
    snap = control.snapshot()
    assert snap["gpus"][0]["processes"] == [{"pid": 7, "mig_uuid": mig_uuid, "used_memory_mib": 0}]
    assert snap["gpus"][3]["lost"] is True
    with pytest.raises(ValueError, match="MIG mode"):
        control.add_process(0, 8)
    with pytest.raises(ValueError, match="no GPU 9"):
        control.set_gpu_lost(9, True)


def test_a_cached_reader_sees_every_same_size_change(sim_state):
    """Same-size rewrites in quick succession (a reader skipping versions) are never missed."""
    writer, reader = sim.SimulatedNvml("l4-x4", sim_state), sim.SimulatedNvml("l4-x4", sim_state)
    writer.nvmlInitWithFlags(0)
    reader.nvmlInitWithFlags(0)
    # Handles belong to the library that made them, as with two processes.
    mine, theirs = ctypes.c_void_p(writer.gpu_handle(0)), ctypes.c_void_p(reader.gpu_handle(0))
    mode = ctypes.c_uint()
    for value in [3, 2] * 25:
        assert writer.nvmlDeviceSetComputeMode(mine, 5 - value) == pynvml.NVML_SUCCESS
        assert writer.nvmlDeviceSetComputeMode(mine, value) == pynvml.NVML_SUCCESS
        assert reader.nvmlDeviceGetComputeMode(theirs, ctypes.byref(mode)) == pynvml.NVML_SUCCESS
        assert mode.value == value
