"""The slice publisher against the test API server, over real HTTP with the real client.

Aspects: a cold start publishes a complete, valid pool (with and without dynamic MIG); a
kubelet-style wipe is repaired after one debounce, with no back-off; an inventory change
rewrites only what changed; a steady state writes nothing; every fault class (5xx, 429 +
Retry-After, 409, slow answers, dropped connections, closed and expired watches, a
restarted server) converges without crashing; a slice the server rejects is not retried
hot; fields the server drops are adopted, not rewritten forever; deleting the Node
garbage-collects the slices for good.

Every test runs the publisher inside ``running()``, which bounds the test's time. Tests
about how long the publisher waits give it a :class:`FakeTime` and assert what it slept;
tests that check no write too many follows wait until it has ``settled()`` (the watch
brought back its last write and nothing is left to do), not for a while of real time.
(How fast a wipe is repaired is measured in bench/node_daemon.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from prometheus_client import REGISTRY

from gpudra.controller.publisher import MAX_DEBOUNCE_DELAYS, SlicePublisher
from gpudra.controller.slice_diff import slice_difference
from gpudra.controller.slices import OwnerRef, build_slices
from gpudra.driver import sim
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.devices import Device, NodeDevices, Taint
from gpudra.driver.inventory import NodeInventory, read_inventory, simulated_pcie_root
from gpudra.driver.nvml import open_nvml
from gpudra.kube.backoff import Backoff
from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi import FakeApiServer
from gpudra.testing.fakeapi.samples import node as node_object
from tests.fake_time import FakeTime

DRIVER = "gpu.nvidia.com"
NODE = "node-1"
SLICES = "resourceslices"
RESYNC = 0.05
FAST = dict(resync_delay=RESYNC)


def fast_backoff() -> Backoff:
    return Backoff(initial=0.05, cap=0.5)


def exact_backoff(initial: float = 1.0, cap: float = 8.0) -> Backoff:
    """No jitter: each delay is exactly ``initial`` doubled per failure, so tests can name it."""
    return Backoff(initial=initial, cap=cap, random=lambda: 0.5)


def timed(clock: FakeTime) -> dict[str, Any]:
    """The keyword arguments that put a publisher on ``clock``."""
    return {"clock": clock.monotonic, "sleep": clock.sleep}


# --- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def inventory(tmp_path: Path) -> Iterator[NodeInventory]:
    """The simulated dgx-h100: 8 H100 GPUs under the real pynvml."""
    nvml = open_nvml(simulate="dgx-h100", sim_state=tmp_path / "sim")
    try:
        yield read_inventory(nvml, pcie_root=simulated_pcie_root)
    finally:
        nvml.shutdown()
        sim.uninstall()


@pytest.fixture
def devices(inventory: NodeInventory) -> NodeDevices:
    """Dynamic MIG: a counters slice plus one slice per GPU (9 slices, 208 devices)."""
    return build_devices(inventory, ModelOptions(dynamic_mig=True))


@pytest.fixture
def gpus(inventory: NodeInventory) -> NodeDevices:
    """Full GPUs only (8 slices, 8 devices): enough for the fault tests, and quick."""
    return build_devices(inventory, ModelOptions(dynamic_mig=False))


@pytest.fixture
def node_uid(fake_api: FakeApiServer) -> str:
    uid: str = fake_api.put(node_object(NODE))["metadata"]["uid"]
    return uid


@contextlib.asynccontextmanager
async def running(publisher: SlicePublisher, *, limit: float = 15.0,
                  ) -> AsyncIterator[asyncio.Task[None]]:
    """Run the publisher for the body of the ``async with``; it must never have ended."""
    task = asyncio.create_task(publisher.run())
    try:
        async with asyncio.timeout(limit):
            yield task
        assert not task.done(), "the publisher stopped (it must only stop when cancelled)"
    finally:
        task.cancel()
        results = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError), results[0]


async def eventually(predicate: Callable[[], bool], within: float = 10.0,
                     interval: float = 0.01) -> None:
    """Wait (for the server's answers, on the loop) until ``predicate()``; fail if never."""
    try:
        async with asyncio.timeout(within):
            while not predicate():  # noqa: ASYNC110 (the server answers from its own thread)
                await asyncio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"never happened (waited {within}s)") from None


async def run_clock(clock: FakeTime, until: Callable[[], bool], within: float = 10.0) -> None:
    """Move ``clock`` from one sleep's deadline to the next until ``until()``; in between,
    wait on the loop for the server's answers. Fails if it never happens."""
    try:
        async with asyncio.timeout(within):
            while not until():
                if clock.sleeping():
                    await clock.advance_to_next()
                else:
                    await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"never happened (waited {within}s)") from None


async def settled(pub: SlicePublisher) -> None:
    """Wait until the publisher has nothing left to do: a write too many would have been
    made by then (see ``SlicePublisher.settled``)."""
    await eventually(pub.settled)


def pauses(slept: list[float], resync: float = RESYNC) -> list[float]:
    """The sleeps that were not a debounce: back-offs and Retry-Afters."""
    return [seconds for seconds in slept if seconds != resync]


def stored(api: FakeApiServer) -> list[dict[str, Any]]:
    return [s for s in api.list("ResourceSlice") if s["spec"]["driver"] == DRIVER]


def pool_matches(api: FakeApiServer, devices: NodeDevices, uid: str) -> bool:
    """The server holds exactly ``devices`` as one complete, valid pool owned by the Node."""
    slices = stored(api)
    if not slices or api.pool_problems(DRIVER):
        return False
    generation = slices[0]["spec"]["pool"]["generation"]
    desired = build_slices(devices, driver=DRIVER, node_name=NODE, generation=generation,
                           owner=OwnerRef(NODE, uid))
    by_name = {s["metadata"]["name"]: s for s in slices}
    return sorted(by_name) == sorted(s["metadata"]["name"] for s in desired) and all(
        slice_difference(d, by_name[d["metadata"]["name"]]) is None for d in desired)


def writes(api: FakeApiServer) -> dict[str, int]:
    return {verb: api.calls[verb, SLICES] for verb in ("create", "update", "delete")
            if api.calls[verb, SLICES]}


def with_taint(devices: NodeDevices, device_name: str, taint: Taint) -> NodeDevices:
    def change(device: Device) -> Device:
        if device.name != device_name:
            return device
        return dataclasses.replace(device, taints=(*device.taints, taint))

    return dataclasses.replace(devices, devices=tuple(change(d) for d in devices.devices))


def without_gpu(devices: NodeDevices, group: str) -> NodeDevices:
    return dataclasses.replace(
        devices, devices=tuple(d for d in devices.devices if d.group != group),
        groups=tuple(g for g in devices.groups if g != group),
        counter_sets=tuple(c for c in devices.counter_sets if not c.name.startswith(f"{group}-")))


async def wipe(session: ApiSession) -> None:
    """What the kubelet does when it starts: delete every slice of the node at once."""
    async with asyncio.timeout(10):
        response = await session.request(
            "DELETE", "/apis/resource.k8s.io/v1/resourceslices",
            query=[("fieldSelector", f"spec.nodeName={NODE}")], connect_timeout=10)
        async with response:
            assert response.status == 200, await response.text()


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def publisher(client: ApiSession, **kwargs: Any) -> SlicePublisher:
    return SlicePublisher(client, driver=DRIVER, node_name=NODE, **kwargs)


def fast_publisher(client: ApiSession, devices: NodeDevices,
                   **kwargs: Any) -> SlicePublisher:
    """A publisher with short back-off and resync delays, already given ``devices``."""
    pub = publisher(client, **{"backoff": fast_backoff(), **FAST, **kwargs})
    pub.update(devices)
    return pub


@pytest.fixture
def pub(gpus: NodeDevices, api_session: ApiSession) -> SlicePublisher:
    """The publisher most tests run: the 8 full GPUs, short back-off and resync delays.

    It talks to the API server only once a test runs it, so faults set up in the test body
    are in place before its first request.
    """
    return fast_publisher(api_session, gpus)


# --- cold start -----------------------------------------------------------------------------


@pytest.mark.parametrize("dynamic_mig", [True, False], ids=["dynamic-mig", "full-gpus"])
async def test_cold_start_publishes_a_complete_valid_pool_owned_by_the_node(
        dynamic_mig: bool, inventory: NodeInventory, api_session: ApiSession,
        fake_api: FakeApiServer, node_uid: str) -> None:
    devices = build_devices(inventory, ModelOptions(dynamic_mig=dynamic_mig))
    pub = publisher(api_session)
    pub.update(devices)
    creates_before = metric("gpudra_api_calls_total", verb="create", resource=SLICES,
                            outcome="ok")

    async with running(pub):
        await asyncio.wait_for(pub.synced.wait(), 5)

        assert fake_api.pool_problems(DRIVER) == []
        assert pool_matches(fake_api, devices, node_uid)
        slices = stored(fake_api)
        assert len(slices) == (9 if dynamic_mig else 8)
        assert sum(len(s["spec"].get("devices", [])) for s in slices) == len(devices.devices)
        for obj in slices:
            assert obj["metadata"]["ownerReferences"] == [
                {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid,
                 "controller": True}]
            assert obj["spec"]["pool"] == {"name": NODE, "generation": 1,
                                           "resourceSliceCount": len(slices)}
        assert writes(fake_api) == {"create": len(slices)}
        assert fake_api.calls["get", "nodes"] == 1
        stats = pub.stats()
        assert stats["synced"] and stats["slices"] == len(slices)
        assert stats["devices"] == len(devices.devices)
        assert metric("gpudra_published_slices") == len(slices)
        assert metric("gpudra_published_devices") == len(devices.devices)
        assert metric("gpudra_api_calls_total", verb="create", resource=SLICES,
                      outcome="ok") - creates_before == len(slices)


async def test_the_node_is_waited_for_when_it_does_not_exist_yet(
        gpus: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer) -> None:
    clock = FakeTime()
    pub = fast_publisher(api_session, gpus, **timed(clock), backoff=exact_backoff())
    async with running(pub):
        await run_clock(clock, lambda: fake_api.calls["get", "nodes"] == 2)
        await clock.until_sleeping()  # backing off after the second 404
        assert stored(fake_api) == [] and fake_api.calls["create", SLICES] == 0
        assert pauses(clock.slept) == [1.0, 2.0]  # never asked again at once: doubling

        uid = fake_api.put(node_object(NODE))["metadata"]["uid"]
        await run_clock(clock, lambda: pool_matches(fake_api, gpus, uid))
        assert pauses(clock.slept) == [1.0, 2.0]  # the next look found it


# --- the kubelet's wipe ---------------------------------------------------------------------


async def test_a_kubelet_wipe_is_repaired_after_the_debounce_alone(
        devices: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    clock = FakeTime()
    resync = 0.2  # the default resync delay, as in the daemon
    pub = publisher(api_session, resync_delay=resync, **timed(clock))
    pub.update(devices)

    async with running(pub):
        await run_clock(clock, pub.settled)
        fake_api.reset_calls()
        before = len(clock.slept)

        await wipe(api_session)
        assert stored(fake_api) == []
        wiped = int(fake_api.resource_version)
        # The whole burst of DELETED events has reached the publisher before its clock moves.
        await eventually(lambda: int(pub.stats()["resource_version"]) >= wiped)
        # Poll cheaply: comparing the whole pool every few ms would starve the publisher.
        await run_clock(clock, lambda: fake_api.calls["create", SLICES] >= 9)
        await eventually(lambda: pool_matches(fake_api, devices, node_uid))

        repair = clock.slept[before:]
        # It waited for the burst to end (one debounce, maybe restarted by the burst's
        # tail), never for a back-off.
        assert repair and set(repair) == {resync}, repair
        assert len(repair) <= MAX_DEBOUNCE_DELAYS
        assert writes(fake_api) == {"create": 9}
        assert fake_api.calls["get", "nodes"] == 1  # the owner is checked before re-creating
        assert stored(fake_api)[0]["spec"]["pool"]["generation"] == 2  # never goes back


# --- inventory changes ----------------------------------------------------------------------


async def test_a_taint_on_one_gpu_rewrites_only_that_gpus_slice(
        devices: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    pub = publisher(api_session, **FAST)
    pub.update(devices)

    async with running(pub):
        await asyncio.wait_for(pub.synced.wait(), 5)
        fake_api.reset_calls()

        tainted = with_taint(devices, "gpu-3", Taint("gpu.nvidia.com/xid", "79", "NoSchedule"))
        pub.update(tainted)
        await eventually(lambda: pool_matches(fake_api, tainted, node_uid))
        await settled(pub)  # the echo of our own write came back: no second write

        assert writes(fake_api) == {"update": 1}
        assert [r.name for r in fake_api.requests if r.verb == "update"] == [
            "node-1-gpu.nvidia.com-gpu-3"]
        generations = {s["spec"]["pool"]["generation"] for s in stored(fake_api)}
        assert generations == {1}  # one changed slice keeps the generation
        taint = next(d for s in stored(fake_api) for d in s["spec"].get("devices", [])
                     if d["name"] == "gpu-3")["taints"][0]
        assert taint["timeAdded"]  # set by the server, and not a reason to write again


async def test_a_dropped_gpu_deletes_its_slice_and_moves_the_pool_generation(
        inventory: NodeInventory, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    devices = build_devices(inventory, ModelOptions(dynamic_mig=False))
    pub = publisher(api_session, **FAST)
    pub.update(devices)

    async with running(pub):
        await asyncio.wait_for(pub.synced.wait(), 5)
        fake_api.reset_calls()

        smaller = without_gpu(devices, "gpu-5")
        pub.update(smaller)
        await eventually(lambda: pool_matches(fake_api, smaller, node_uid))
        await eventually(lambda: pub.stats()["generation"] == 2)
        await settled(pub)  # a write too many would have been made by now

        assert writes(fake_api) == {"delete": 1, "update": 7}
        first = next(r.verb for r in fake_api.requests if r.verb in ("delete", "update"))
        assert first == "delete"  # obsolete slices go first
        assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"])
                for s in stored(fake_api)} == {(2, 7)}


# --- steady state ---------------------------------------------------------------------------


async def _assert_no_writes_while_running(seconds: float, devices: NodeDevices,
                                          client: ApiSession,
                                          api: FakeApiServer) -> None:
    """Settled, given equal devices, the publisher does nothing; then, for ``seconds`` of
    real time (a soak; 0: none), the watch's life costs no writes either."""
    pub = publisher(client, **FAST)
    pub.update(devices)
    async with running(pub, limit=seconds + 10):
        await asyncio.wait_for(pub.synced.wait(), 5)
        await settled(pub)
        api.reset_calls()
        rounds = pub.stats()["rounds"]
        pub.update(dataclasses.replace(devices))  # equal devices: nothing to do
        assert pub.settled() and pub.stats()["rounds"] == rounds  # not even a round
        if seconds:
            await asyncio.sleep(seconds)

        assert api.writes() == 0, api.calls
        assert set(api.calls) <= {("watch", SLICES)}, api.calls  # at most a re-watch
        assert pub.stats()["errors"] == 0


async def test_a_steady_state_costs_no_writes(
        devices: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    await _assert_no_writes_while_running(0, devices, api_session, fake_api)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("GPUDRA_SLOW_TESTS") != "1",
                    reason="a minute long; set GPUDRA_SLOW_TESTS=1")
async def test_a_steady_state_costs_no_writes_for_a_minute(
        devices: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    await _assert_no_writes_while_running(60.0, devices, api_session, fake_api)


# --- faults ---------------------------------------------------------------------------------


async def test_server_errors_are_retried_until_the_pool_is_complete(
        gpus: NodeDevices, pub: SlicePublisher, fake_api: FakeApiServer, node_uid: str) -> None:
    fake_api.fail_next(4, 500, verb="create")
    fake_api.fail_next(2, 503, verb="get", resource="nodes", retry_after=None)

    with structlog.testing.capture_logs() as logs:
        async with running(pub):
            await asyncio.wait_for(pub.synced.wait(), 8)
            assert pool_matches(fake_api, gpus, node_uid)

    assert fake_api.calls["create", SLICES] == 8 + 4
    assert pub.stats()["errors"] == 6 and "HTTP 500" in str(pub.stats()["last_error"])
    failures = [e for e in logs if e["log_level"] == "warning"]
    # One line per distinct failure (node GET 503, create 500), not one per retry.
    assert sorted((e["verb"], e["status"]) for e in failures) == [("create", 500),
                                                                  ("get", 503)]
    assert any(e["event"] == "publishing slices works again" for e in logs)


async def test_429_waits_at_least_its_retry_after(
        gpus: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    fake_api.fail_next(1, 429, verb="create", retry_after=1)
    clock = FakeTime()
    pub = fast_publisher(api_session, gpus, **timed(clock))

    async with running(pub):
        await run_clock(clock, lambda: fake_api.calls["create", SLICES] == 1)
        await clock.until_sleeping()
        assert pauses(clock.slept) == [1.0]  # its Retry-After, more than the back-off's 0.05
        assert fake_api.calls["create", SLICES] == 1  # nothing more until it has passed

        await run_clock(clock, lambda: pool_matches(fake_api, gpus, node_uid))
    assert pauses(clock.slept) == [1.0]
    assert fake_api.calls["create", SLICES] == 9


async def test_conflicts_on_update_are_reread_and_retried(
        gpus: NodeDevices, pub: SlicePublisher, fake_api: FakeApiServer, node_uid: str) -> None:
    async with running(pub):
        await asyncio.wait_for(pub.synced.wait(), 5)
        fake_api.reset_calls()
        fake_api.fail_next(2, 409, verb="update")
        tainted = with_taint(gpus, "gpu-1", Taint("example.com/maintenance", "", "NoExecute"))
        pub.update(tainted)
        await eventually(lambda: pool_matches(fake_api, tainted, node_uid))

        assert fake_api.calls["update", SLICES] == 3
        assert fake_api.calls["get", SLICES] == 2  # re-read after each conflict


async def test_a_real_conflict_with_another_writer_converges(
        gpus: NodeDevices, pub: SlicePublisher, fake_api: FakeApiServer, node_uid: str) -> None:
    async with running(pub):
        await asyncio.wait_for(pub.synced.wait(), 5)
        name = "node-1-gpu.nvidia.com-gpu-2"
        # Someone edits our slice while our watch is slow to tell us: our PUT gets a 409.
        fake_api.delay(0.5, verb="watch")
        fake_api.close_watches()
        fake_api.modify("ResourceSlice", name, {"metadata": {"annotations": {"x": "y"}}})
        tainted = with_taint(gpus, "gpu-2", Taint("example.com/maintenance", "", "NoExecute"))
        pub.update(tainted)
        await eventually(lambda: pool_matches(fake_api, tainted, node_uid))

        kept = fake_api.get("ResourceSlice", name)
        assert kept is not None and kept["metadata"]["annotations"] == {"x": "y"}


async def test_answers_slower_than_the_request_timeout_are_retried(
        gpus: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    # The server still creates the slices after we gave up: a retry may meet 409 AlreadyExists.
    fake_api.delay(1.0, verb="create", count=2)
    pub = fast_publisher(api_session, gpus, request_timeout=0.3)

    with structlog.testing.capture_logs() as logs:
        async with running(pub):
            await asyncio.wait_for(pub.synced.wait(), 8)
            assert pool_matches(fake_api, gpus, node_uid)

    assert any(e.get("reason") == "Timeout" and e["verb"] == "create" for e in logs
               if e["log_level"] == "warning")
    assert fake_api.pool_problems(DRIVER) == []


async def test_dropped_connections_are_retried(
        gpus: NodeDevices, pub: SlicePublisher, fake_api: FakeApiServer, node_uid: str) -> None:
    fake_api.drop_next(3, verb="create")
    fake_api.drop_next(1, verb="list")

    async with running(pub):
        await eventually(lambda: pool_matches(fake_api, gpus, node_uid))


async def test_closed_watches_are_resumed_without_missing_events(
        gpus: NodeDevices, pub: SlicePublisher, api_session: ApiSession,
        fake_api: FakeApiServer, node_uid: str) -> None:
    async with running(pub):
        await asyncio.wait_for(pub.synced.wait(), 5)
        for failures in (0, 2):
            if failures:
                fake_api.fail_next(failures, 503, verb="watch", retry_after=None)
            opened = pub.stats()["watches"]
            fake_api.close_watches()
            await eventually(lambda: pub.stats()["watches"] > opened)  # noqa: B023
        await wipe(api_session)
        await eventually(lambda: pool_matches(fake_api, gpus, node_uid), within=3)

        assert pub.stats()["lists"] == 1  # resumed from the last resourceVersion every time
        assert pub.stats()["watches"] == 3
        assert [r.status for r in fake_api.requests if r.verb == "watch"].count(503) == 2


async def test_an_expired_watch_lists_again(
        gpus: NodeDevices, pub: SlicePublisher, api_session: ApiSession,
        fake_api: FakeApiServer, node_uid: str) -> None:
    async with running(pub):
        await asyncio.wait_for(pub.synced.wait(), 5)
        fake_api.expire_watches()
        fake_api.close_watches()
        await eventually(lambda: pub.stats()["lists"] == 2)
        fake_api.reset_calls()
        await settled(pub)
        assert fake_api.writes() == 0  # the fresh list matches: nothing to write

        await wipe(api_session)
        await eventually(lambda: pool_matches(fake_api, gpus, node_uid), within=3)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_a_restarted_server_is_caught_up_with(
        gpus: NodeDevices) -> None:
    server = FakeApiServer(port=_free_port()).start()
    clock = FakeTime()
    try:
        uid = server.put(node_object(NODE))["metadata"]["uid"]
        async with ApiSession.for_url(server.url) as client:
            pub = fast_publisher(client, gpus, **timed(clock))
            async with running(pub):
                await run_clock(clock, pub.settled)

                server.shutdown()
                # While it is down (same storage, like an apiserver restart over etcd), the
                # kubelet's wipe happens; nobody can tell the publisher.
                for obj in stored(server):
                    server.delete("ResourceSlice", obj["metadata"]["name"])
                await clock.until_sleeping()  # its watch failed: backing off
                _reopen(server)
                await run_clock(clock, lambda: pool_matches(server, gpus, uid))

                assert pub.stats()["watches"] >= 2  # it watched the new server
    finally:
        server.shutdown()


def _reopen(server: FakeApiServer) -> None:
    """Start a shut-down server again on its port.

    Workaround: ``FakeApiServer.shutdown()`` leaves its watch control ``closing``, so after a
    restart every watch would end at once; reset that flag until the server does it itself.
    """
    control = server._control
    with server.store.changed:
        control.closing = False
    server.start()


# --- rejections -----------------------------------------------------------------------------


async def test_a_slice_the_server_rejects_is_not_retried_hot(
        gpus: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    def break_gpu_3(obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"].endswith("-gpu-3"):
            obj["spec"]["devices"][0]["name"] = "Not_A_DNS_Label"

    fake_api.mutate_writes("ResourceSlice", break_gpu_3)
    clock = FakeTime()
    backoff = exact_backoff(initial=0.1, cap=10.0)  # the default's cap is what matters
    pub = publisher(api_session, **FAST, backoff=backoff, **timed(clock))
    pub.update(gpus)

    def rejections() -> int:
        return [r.status for r in fake_api.requests].count(422)

    async def paused_for() -> float:
        """How long the publisher's next wait is (the only thing sleeping)."""
        await clock.until_sleeping()
        (deadline,) = clock.sleeping()
        return deadline - clock.now

    with structlog.testing.capture_logs() as logs:
        async with running(pub):
            await run_clock(clock, lambda: fake_api.calls["create", SLICES] >= 4)
            assert await paused_for() == 10.0  # the cap, not a hot retry
            creates = [r for r in fake_api.requests if r.verb == "create"]

            assert [r.status for r in creates].count(422) == 1  # one try per desired state
            assert len(creates) == 4  # gpu-0..2, then gpu-3: rejected
            assert not pub.synced.is_set()
            assert "Not_A_DNS_Label" in str(pub.stats()["last_error"])

            # A new desired state is tried at once; the server still rejects it: once more.
            capped = clock.sleeping()[0]
            pub.update(with_taint(gpus, "gpu-0", Taint("example.com/t", "", "NoSchedule")))
            await eventually(lambda: capped not in clock.sleeping())  # the pause ended early
            await run_clock(clock, lambda: rejections() == 2)
            assert await paused_for() == 10.0 and rejections() == 2

            # Once the cap has passed, it tries again (the server may have changed).
            await clock.advance_to_next()
            await run_clock(clock, lambda: rejections() == 3)

    rejected = [e for e in logs if e["log_level"] == "warning"
                and e["event"].startswith("the API server rejected a slice")]
    assert len(rejected) == 1 and rejected[0]["status"] == 422
    assert "Not_A_DNS_Label" in rejected[0]["message"]


async def test_a_locally_invalid_pool_is_not_sent_at_all(
        gpus: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    broken = dataclasses.replace(gpus, devices=(
        dataclasses.replace(gpus.devices[0], name="GPU_0"), *gpus.devices[1:]))
    clock = FakeTime()
    pub = publisher(api_session, **FAST, **timed(clock))
    pub.update(broken)

    with structlog.testing.capture_logs() as logs:
        async with running(pub):
            await run_clock(clock, lambda: pub.stats()["errors"] == 1)
            assert fake_api.writes() == 0
            assert clock.sleeping() == []  # no timed retry: it waits for new devices
            pub.update(gpus)
            await run_clock(clock, lambda: pool_matches(fake_api, gpus, node_uid))

    bugs = [e for e in logs if e["log_level"] == "error"]
    assert len(bugs) == 1 and "GPU_0" in bugs[0]["error"]


async def test_fields_the_server_drops_are_adopted_not_rewritten_forever(
        gpus: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    def drop_taints(obj: dict[str, Any]) -> None:  # as with DRADeviceTaints disabled
        for device in obj["spec"].get("devices") or []:
            device.pop("taints", None)

    fake_api.mutate_writes("ResourceSlice", drop_taints)
    tainted = with_taint(gpus, "gpu-4", Taint("example.com/t", "", "NoSchedule"))
    pub = publisher(api_session, **FAST)
    pub.update(tainted)

    async with running(pub):
        await asyncio.wait_for(pub.synced.wait(), 5)
        fake_api.reset_calls()
        fake_api.expire_watches()  # a fresh LIST makes the publisher compare everything again
        fake_api.close_watches()
        await eventually(lambda: pub.stats()["lists"] == 2)
        await settled(pub)  # the fresh list compared: a rewrite would have been made

        assert fake_api.writes() == 0


# --- the node goes away ---------------------------------------------------------------------


async def test_deleting_the_node_garbage_collects_the_slices_for_good(
        gpus: NodeDevices, api_session: ApiSession, fake_api: FakeApiServer,
        node_uid: str) -> None:
    clock = FakeTime()
    pub = fast_publisher(api_session, gpus, **timed(clock))
    async with running(pub):
        await run_clock(clock, pub.settled)
        fake_api.delete("Node", NODE)
        assert stored(fake_api) == []  # the garbage collector followed our owner references

        # It notices, looks the Node up and finds it gone, backs off and looks again.
        looked = fake_api.calls["get", "nodes"]
        await run_clock(clock, lambda: fake_api.calls["get", "nodes"] >= looked + 2)
        assert stored(fake_api) == []  # and the publisher did not bring them back
        assert fake_api.calls["create", SLICES] == 8

        new_uid = fake_api.put(node_object(NODE))["metadata"]["uid"]  # the node re-registers
        await run_clock(clock, lambda: pool_matches(fake_api, gpus, new_uid))
