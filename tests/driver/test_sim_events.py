"""XID events: raised by SimControl in any process, delivered by nvmlEventSetWait."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pynvml
import pytest

from gpudra.driver import sim

XID = pynvml.nvmlEventTypeXidCriticalError
NO_ID = 0xFFFFFFFF


def registered(handles):
    event_set = pynvml.nvmlEventSetCreate()
    for handle in handles:
        supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
        mask = (XID | pynvml.nvmlEventTypeDoubleBitEccError
                | pynvml.nvmlEventTypeSingleBitEccError) & supported
        pynvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
    return event_set


def test_wait_times_out_when_nothing_happens(simulate):
    simulate("l4-x4")
    event_set = registered([pynvml.nvmlDeviceGetHandleByIndex(0)])
    with pytest.raises(pynvml.NVMLError_Timeout):  # nothing happened: no event, no hang
        pynvml.nvmlEventSetWait(event_set, 50)
    pynvml.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait(event_set, 0)


def test_xid_from_another_process_reaches_a_waiting_set(simulate, sim_state):
    simulate("dgx-h100")
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    event_set = registered(handles[:4])
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from gpudra.driver import sim
        control = sim.SimControl(Path({str(sim_state)!r}))
        time.sleep(0.2)
        control.raise_xid(5, 48)   # GPU 5 is not registered: never delivered here
        control.raise_xid(2, 79)
    """)])
    try:
        data = pynvml.nvmlEventSetWait_v2(event_set, 10_000)
    finally:
        assert child.wait(timeout=30) == 0
    assert (data.eventType, data.eventData) == (XID, 79)
    assert pynvml.nvmlDeviceGetIndex(data.device) == 2
    assert (data.gpuInstanceId, data.computeInstanceId) == (NO_ID, NO_ID)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 20)


def test_events_before_registration_are_not_delivered(simulate, sim_state):
    simulate("t4-x1")
    control = sim.SimControl(sim_state)
    control.raise_xid(0, 13)
    event_set = registered([pynvml.nvmlDeviceGetHandleByIndex(0)])
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    control.raise_xid(0, 31)
    control.raise_xid(0, 43)
    assert [pynvml.nvmlEventSetWait_v2(event_set, 0).eventData for _ in range(2)] == [31, 43]


def test_mig_xid_names_the_instance(simulate, sim_state):
    simulate("dgx-a100-static-mig")
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 3)
    event_set = registered([handle])
    sim.SimControl(sim_state).raise_xid(1, 94, pynvml.nvmlDeviceGetUUID(mig))
    data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
    assert data.eventData == 94
    assert data.gpuInstanceId == pynvml.nvmlDeviceGetGpuInstanceId(mig)
    assert data.computeInstanceId == pynvml.nvmlDeviceGetComputeInstanceId(mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(handle, 1 << 40, event_set)
    with pytest.raises(ValueError, match="no MIG device"):
        sim.SimControl(sim_state).raise_xid(1, 94, "MIG-nope")


def test_a_lost_gpu_fails_the_wait(simulate, sim_state):
    simulate("dgx-a100")
    event_set = registered([pynvml.nvmlDeviceGetHandleByIndex(7)])
    sim.SimControl(sim_state).set_gpu_lost(7, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlEventSetWait_v2(event_set, 1000)
