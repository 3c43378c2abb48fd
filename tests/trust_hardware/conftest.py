"""Fixtures: the test API server over real HTTP."""

from tests.fakeapi.fixtures import aio_k8s_client, api_session, fake_api, k8s_client  # noqa: F401
