"""A Kubernetes API server stand-in (shipped for the demo and tests): real HTTP on
127.0.0.1 that the real ``kubernetes`` client (sync and ``kubernetes.aio``) talks to.

    from gpudra.testing.fakeapi import FakeApiServer

    with FakeApiServer() as api:
        client = kubernetes.client.ApiClient(api.configuration())
        ...

Pytest fixtures are in ``tests.fakeapi.fixtures``; ``python -m gpudra.testing.fakeapi --port N``
runs one in its own process.
"""

from gpudra.testing.fakeapi.errors import ApiError, FieldError
from gpudra.testing.fakeapi.faults import RequestRecord
from gpudra.testing.fakeapi.server import FakeApiServer

__all__ = ["ApiError", "FakeApiServer", "FieldError", "RequestRecord"]
