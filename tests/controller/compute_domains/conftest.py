from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpudra.testing.fakeapi.server import FakeApiServer


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for ns in ("team", "other", "gpudra-system"):
            server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        yield server
