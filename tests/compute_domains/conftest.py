"""ComputeDomain tests: the API stand-in over real HTTP."""

from tests.fakeapi.fixtures import fake_api  # noqa: F401
