"""Pytest fixtures for the fake API server. Import them into a ``conftest.py``::

    from tests.fakeapi.fixtures import aio_k8s_client, fake_api, k8s_client  # noqa: F401

* ``fake_api``: a started ``FakeApiServer``, shut down (threads joined) after the test;
* ``k8s_client``: a sync ``kubernetes.client.ApiClient`` pointing at it, closed afterwards;
* ``aio_k8s_client``: the same for ``kubernetes.aio`` (an async fixture);
* ``api_session``: our own :class:`~gpudra.kube.session.ApiSession` to it (what the daemon
  uses), closed afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import kubernetes.aio.client
import kubernetes.client
import pytest
import pytest_asyncio

from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi.server import FakeApiServer


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def k8s_client(fake_api: FakeApiServer) -> Iterator[kubernetes.client.ApiClient]:
    client = kubernetes.client.ApiClient(fake_api.configuration())
    try:
        yield client
    finally:
        client.close()  # type: ignore[no-untyped-call]


@pytest_asyncio.fixture
async def aio_k8s_client(
    fake_api: FakeApiServer,
) -> AsyncIterator[kubernetes.aio.client.ApiClient]:
    client = kubernetes.aio.client.ApiClient(fake_api.aio_configuration())
    try:
        yield client
    finally:
        await client.close()  # type: ignore[no-untyped-call]


@pytest_asyncio.fixture
async def api_session(fake_api: FakeApiServer) -> AsyncIterator[ApiSession]:
    async with ApiSession.for_url(fake_api.url) as session:
        yield session
