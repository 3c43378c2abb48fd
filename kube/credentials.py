"""The ``Authorization`` header of each request, kept current the way client-go keeps it.

In a pod, the service-account token file is re-read when its modification time changes and
at least once a minute (a projected token rotates). From a kubeconfig, the ``kubernetes``
package's loader holds the credential (a token, a token file, an exec plugin's answer,
user name and password) and refreshes it when it expires; its refresh may run the exec
plugin, so it is asked from a worker thread, at most every :data:`RECHECK` seconds and
after the server answered 401.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kubernetes.client import Configuration

TOKEN_FILE_MAX_AGE = 60.0
"""Seconds a token file's content is trusted without a re-read (client-go: one minute)."""
RECHECK = 10.0
"""Seconds a kubeconfig credential is used before its loader is asked again (it refreshes
five minutes before expiry, so this is early enough)."""


class Credentials(Protocol):
    """Where a session's ``Authorization`` header comes from."""

    async def header(self) -> str | None: ...

    def rejected(self) -> None:
        """The server answered 401: do not trust what is cached."""


class TokenFile:
    """A bearer token read from a file, again when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._token: str | None = None
        self._stamp: tuple[int, float] | None = None  # (mtime_ns, read at)

    async def header(self) -> str | None:
        return f"Bearer {self.read()}"

    def rejected(self) -> None:
        self._stamp = None

    def read(self) -> str:
        now = time.monotonic()
        try:
            mtime = self.path.stat().st_mtime_ns
            stamp = self._stamp
            if (self._token is None or stamp is None or stamp[0] != mtime
                    or now - stamp[1] > TOKEN_FILE_MAX_AGE):
                self._token = self.path.read_text().strip()
                self._stamp = (mtime, now)
        except OSError:
            if self._token is None:
                raise
        return self._token


class LoadedCredentials:
    """The credential the ``kubernetes`` kubeconfig loader put in a ``Configuration``."""

    def __init__(self, configuration: Configuration) -> None:
        self._configuration = configuration
        self._header: str | None = configuration.api_key.get("BearerToken")
        self._checked = time.monotonic()
        self._lock = asyncio.Lock()

    async def header(self) -> str | None:
        if time.monotonic() - self._checked >= RECHECK:
            async with self._lock:
                if time.monotonic() - self._checked >= RECHECK:
                    self._header = await asyncio.to_thread(self._current)
                    self._checked = time.monotonic()
        return self._header

    def rejected(self) -> None:
        self._checked = -RECHECK

    def _current(self) -> str | None:
        # Runs the loader's refresh hook: an expired exec credential is fetched again.
        return self._configuration.get_api_key_with_prefix("BearerToken")
