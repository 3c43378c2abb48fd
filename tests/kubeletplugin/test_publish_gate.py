"""PublishGate: opens at the kubelet's first registration, says when it has not come, stays
open after a refusal. The registration state is the one the servicer fills in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from gpudra.kubeletplugin.serving.publish_gate import PublishGate
from gpudra.kubeletplugin.serving.registration import RegistrationState

SOCKET = Path("/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock")
WAITING = "ResourceSlices not published: waiting for the kubelet to register this plugin"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_opens_at_the_first_registration_and_says_why_it_is_closed():
    state, clock = RegistrationState(), Clock()
    gate = PublishGate(state, 30.0, SOCKET, clock=clock)
    assert not gate.open
    assert gate.problems() == ["not registered with the kubelet yet", WAITING]
    waiting = asyncio.create_task(gate.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    state.record(registered=True, error=None)
    await asyncio.wait_for(waiting, 1)
    assert gate.open and gate.problems() == []


async def test_a_kubelet_that_does_not_come_is_named_once_and_still_awaited():
    state, clock = RegistrationState(), Clock()
    gate = PublishGate(state, 0.05, SOCKET, clock=clock)
    with structlog.testing.capture_logs() as logs:
        waiting = asyncio.create_task(gate.wait())
        await asyncio.sleep(0.2)
        assert not waiting.done()  # publishes nothing, goes on waiting
        clock.now += 1
        assert gate.problems() == [
            "not registered with the kubelet after 0.05 s: is the kubelet running, and does "
            "it watch /var/lib/kubelet/plugins_registry?", WAITING]
        state.record(registered=True, error=None)
        await asyncio.wait_for(waiting, 1)
    assert [(e["log_level"], e["event"]) for e in logs] == [
        ("warning", "the kubelet has not registered this plugin; publishing nothing until it "
                    "does (is the kubelet running, and does it watch the registration "
                    "socket's directory?)"),
        ("info", "the kubelet registered this plugin at last; publishing"),
    ]
    assert logs[0]["registration_socket"] == str(SOCKET)


async def test_a_refusal_is_named_and_once_open_the_gate_stays_open():
    state, clock = RegistrationState(), Clock()
    gate = PublishGate(state, 30.0, SOCKET, clock=clock)
    state.record(registered=False, error="no common version")
    assert gate.problems() == ["the kubelet refused the registration: no common version",
                               WAITING]
    state.record(registered=True, error=None)
    state.record(registered=False, error="kubelet restarting")  # a restarted kubelet
    assert gate.open
    assert gate.problems() == ["the kubelet refused the registration: kubelet restarting"]
    await asyncio.wait_for(gate.wait(), 1)  # returns at once: a publisher restart goes on
