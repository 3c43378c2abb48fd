"""The reflector tells a 410 (LIST again, at once) from other failures (back off), by the
error's type, over real HTTP to the test API server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest

from gpudra.controller.slice_reflector import SliceReflector
from gpudra.kube.backoff import Backoff
from gpudra.kube.raw_api import RawApi
from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi import samples
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.fakeapi.fixtures import api_session, fake_api  # noqa: F401

SLOW = Backoff(initial=30.0, cap=30.0)
"""Any back-off at all would outlast these tests."""


@contextlib.asynccontextmanager
async def running(client: ApiSession) -> AsyncIterator[SliceReflector]:
    reflector = SliceReflector(RawApi(client), field_selector="spec.nodeName=node-1",
                               on_change=lambda: None, backoff=SLOW.fresh())
    task = asyncio.create_task(reflector.run())
    try:
        yield reflector
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(predicate: Callable[[], bool], within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {within}s")
        await asyncio.sleep(0.02)


async def test_a_watch_answered_410_lists_again_without_backing_off(
        api_session: ApiSession, fake_api: FakeApiServer):  # noqa: F811
    fake_api.put(samples.resource_slice(devices=[]))
    fake_api.fail_next(1, status=410, verb="watch", message="too old resource version")
    async with running(api_session) as reflector:
        await eventually(lambda: reflector.lists == 2 and reflector.watches == 1)
        assert list(reflector.cache) == ["node-1-gpu"]


@pytest.mark.parametrize("status", [404, 409, 503])
async def test_other_watch_failures_back_off(
        api_session: ApiSession, fake_api: FakeApiServer, status):  # noqa: F811
    fake_api.fail_next(1, status=status, verb="watch", retry_after=None)
    async with running(api_session) as reflector:
        await eventually(lambda: fake_api.calls["watch", "resourceslices"] == 1)
        await asyncio.sleep(0.5)  # no second watch, no second list: it waits out the back-off
        assert fake_api.calls["watch", "resourceslices"] == 1
        assert (reflector.lists, reflector.watches) == (1, 0)
