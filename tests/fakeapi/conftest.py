"""The fake API server's own tests use its public fixtures."""

from tests.fakeapi.fixtures import aio_k8s_client, fake_api, k8s_client

__all__ = ["aio_k8s_client", "fake_api", "k8s_client"]
