"""Where a prepare's claim GETs run: on the event loop, all of a call's at once; with the
loop gone, every claim's error says the daemon is stopping. A real Preparer over a simulated
node, the test API server in its own threads, and an event loop run (or not) by the test."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.api.claims import ClaimRef
from gpudra.kube.session import ApiSession
from gpudra.kubeletplugin.claims.claim_fetcher import ClaimFetcher
from gpudra.kubeletplugin.claims.preparer import Preparer
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.driver.node_fixture import DRIVER, SimNode, start_node
from tests.fakeapi.fixtures import fake_api  # noqa: F401
from tests.integration.daemon import claim_object


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    node = start_node(tmp_path / "node")
    try:
        yield node
    finally:
        node.close()


@pytest.fixture
def closed_loop() -> asyncio.AbstractEventLoop:
    """An event loop that is closed already: whatever is sent to it is refused."""
    loop = asyncio.new_event_loop()
    loop.close()
    return loop


def stored(api: FakeApiServer, name: str, device: str) -> ClaimRef:
    meta = api.put(claim_object(name, devices=[device]))["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def test_without_the_event_loop_each_claim_says_the_daemon_is_stopping(
        node: SimNode, fake_api: FakeApiServer,  # noqa: F811
        closed_loop: asyncio.AbstractEventLoop):
    session = ApiSession.for_url(fake_api.url)
    try:
        preparer = Preparer(driver=DRIVER, fetcher=ClaimFetcher(session, timeout=0.5),
                            state=node.state, loop=closed_loop)
        one, two = stored(fake_api, "one", "gpu-0"), stored(fake_api, "two", "gpu-1")
        for refs in ([one], [one, two]):
            outcomes = preparer.prepare(refs)
            for ref in refs:
                assert outcomes[ref.uid].error == f"claim {ref}: the node daemon is stopping"
    finally:
        asyncio.run(session.close())


class Recorder:
    """A prepare observer that notes what it is told, in which thread; ``broken``: it
    raises on that claim's news (a bug) and still notes it."""

    def __init__(self, broken: str = "", expect: int = 5) -> None:
        self.told: list[tuple[str, str]] = []
        self.all_told = asyncio.Event()  # ``expect`` pieces of news (set on the loop only)
        self.expect = expect
        self.threads: set[int] = set()
        self.broken = broken

    def prepared(self, ref: ClaimRef, devices: object, claim: object) -> None:
        self._note("prepared", ref)

    def unprepared(self, ref: ClaimRef) -> None:
        self._note("unprepared", ref)

    def _note(self, what: str, ref: ClaimRef) -> None:
        self.told.append((what, ref.name))
        self.threads.add(threading.get_ident())
        if len(self.told) == self.expect:
            self.all_told.set()
        if ref.name == self.broken:
            raise RuntimeError("observer bug")


async def test_the_observers_get_a_burst_of_calls_news_in_order_on_the_loop(
        node: SimNode, fake_api: FakeApiServer):  # noqa: F811
    loop = asyncio.get_running_loop()
    recorder = Recorder(broken="c1")
    async with ApiSession.for_url(fake_api.url) as session:
        preparer = Preparer(driver=DRIVER, fetcher=ClaimFetcher(session, timeout=2.0),
                            state=node.state, loop=loop, observer=recorder)
        refs = [stored(fake_api, f"c{i}", f"gpu-{i}") for i in range(3)]

        def calls() -> None:
            for ref in refs:
                assert preparer.prepare([ref])[ref.uid].error is None
            assert preparer.unprepare(refs[:2]) == {refs[0].uid: None, refs[1].uid: None}

        await asyncio.to_thread(calls)
        await asyncio.wait_for(recorder.all_told.wait(), 5.0)
    # Every call's news, in call order, on the loop's thread; c1's observer bug (logged)
    # did not stop the news after it.
    assert recorder.told == [("prepared", "c0"), ("prepared", "c1"), ("prepared", "c2"),
                             ("unprepared", "c0"), ("unprepared", "c1")]
    assert recorder.threads == {threading.get_ident()}


async def test_the_at_once_observer_knows_before_the_answer_in_the_calls_thread(
        node: SimNode, fake_api: FakeApiServer):  # noqa: F811
    # The usage sampler's pod labels: were they told later, a sample taken before would
    # export the claim's series without its pod, then again with it.
    loop = asyncio.get_running_loop()
    at_once, later = Recorder(broken="c1", expect=0), Recorder(expect=3)
    async with ApiSession.for_url(fake_api.url) as session:
        preparer = Preparer(driver=DRIVER, fetcher=ClaimFetcher(session, timeout=2.0),
                            state=node.state, loop=loop, observer=later, at_once=at_once)
        refs = [stored(fake_api, f"c{i}", f"gpu-{i}") for i in range(2)]
        seen: list[list[tuple[str, str]]] = []

        def calls() -> int:
            for ref in refs:
                assert preparer.prepare([ref])[ref.uid].error is None
                seen.append(list(at_once.told))
            assert preparer.unprepare(refs[:1]) == {refs[0].uid: None}
            seen.append(list(at_once.told))
            return threading.get_ident()

        caller = await asyncio.to_thread(calls)
        await asyncio.wait_for(later.all_told.wait(), 5.0)
    # Each call's news was there when the call returned (c1's observer bug did not fail
    # its prepare); the loop's observer got the same news too.
    assert seen == [[("prepared", "c0")],
                    [("prepared", "c0"), ("prepared", "c1")],
                    [("prepared", "c0"), ("prepared", "c1"), ("unprepared", "c0")]]
    assert at_once.threads == {caller}
    assert later.told == [("prepared", "c0"), ("prepared", "c1"), ("unprepared", "c0")]
