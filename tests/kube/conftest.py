"""The Kubernetes layer's tests talk real HTTP to the test API server."""

from tests.fakeapi.fixtures import aio_k8s_client, api_session, fake_api, k8s_client  # noqa: F401
