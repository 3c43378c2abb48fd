"""A Kubernetes API server for tests (not shipped): real HTTP on 127.0.0.1 that the real
``kubernetes`` client (sync and ``kubernetes.aio``) talks to.

    from tests.fakeapi import FakeApiServer

    with FakeApiServer() as api:
        client = kubernetes.client.ApiClient(api.configuration())
        ...

Pytest fixtures are in ``tests.fakeapi.fixtures``; ``python -m tests.fakeapi --port N``
runs one in its own process.
"""

from tests.fakeapi.errors import ApiError, FieldError
from tests.fakeapi.faults import RequestRecord
from tests.fakeapi.server import FakeApiServer

__all__ = ["ApiError", "FakeApiServer", "FieldError", "RequestRecord"]
