"""The reflector tells a 410 (LIST again, at once) from other failures (back off), by the
error's type, over real HTTP to the test API server. It sleeps on a :class:`FakeTime`, so
the tests see each back-off it takes, and nothing happens during one until they move the
clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from gpudra.controller.slice_reflector import SliceReflector
from gpudra.kube.backoff import Backoff
from gpudra.kube.raw_api import RawApi
from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi import samples
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.fake_time import FakeTime
from tests.fakeapi.fixtures import api_session, fake_api  # noqa: F401

BACKOFF = 30.0
"""Without jitter, so a test can name the delay it expects."""


@contextlib.asynccontextmanager
async def running(client: ApiSession, clock: FakeTime) -> AsyncIterator[SliceReflector]:
    reflector = SliceReflector(
        RawApi(client), field_selector="spec.nodeName=node-1", on_change=lambda: None,
        backoff=Backoff(initial=BACKOFF, cap=BACKOFF, random=lambda: 0.5),
        clock=clock.monotonic, sleep=clock.sleep)
    task = asyncio.create_task(reflector.run())
    try:
        yield reflector
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Wait (for the server's answers) until ``predicate()``; fail if it never holds."""
    try:
        async with asyncio.timeout(within):
            while not predicate():  # noqa: ASYNC110 (the server answers from its own thread)
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"never happened (waited {within}s)") from None


async def test_a_watch_answered_410_lists_again_without_backing_off(
        api_session: ApiSession, fake_api: FakeApiServer):  # noqa: F811
    fake_api.put(samples.resource_slice(devices=[]))
    fake_api.fail_next(1, status=410, verb="watch", message="too old resource version")
    clock = FakeTime()
    async with running(api_session, clock) as reflector:
        await eventually(lambda: reflector.lists == 2 and reflector.watches == 1)
        assert list(reflector.cache) == ["node-1-gpu"]
        assert clock.slept == []  # listed again at once


@pytest.mark.parametrize("status", [404, 409, 503])
async def test_other_watch_failures_back_off(
        api_session: ApiSession, fake_api: FakeApiServer, status):  # noqa: F811
    fake_api.fail_next(1, status=status, verb="watch", retry_after=None)
    clock = FakeTime()
    async with running(api_session, clock) as reflector:
        await clock.until_sleeping()
        assert clock.slept == [BACKOFF]
        # No second watch, no second list while it waits out the back-off.
        assert fake_api.calls["watch", "resourceslices"] == 1
        assert (reflector.lists, reflector.watches) == (1, 0)

        await clock.advance_to_next()
        await eventually(lambda: reflector.watches == 1)  # then it watches again
        assert reflector.lists == 1 and fake_api.calls["watch", "resourceslices"] == 2
