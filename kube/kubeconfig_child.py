"""The node daemon's kubeconfig, loaded by the ``kubernetes`` package in a child process.

Importing the package costs a process much memory and CPU time (measured in
``bench/RESULTS.md``, "Kubernetes client layer"); the daemon needs what it loads, not the
package. So the daemon starts this module as
a child when it has checked the kubeconfig (:func:`gpudra.kube.kubeconfig.plan`), before
it serves the kubelet sockets, and reads the child's answer on its first API call: the
:class:`~gpudra.kube.kubeconfig.Settings` as JSON on standard output. An exec plugin's
expiring credential is fetched again the same way, by a new child.

Run as ``python -m gpudra.kube.kubeconfig_child`` with the checked kubeconfig as JSON on
standard input; it answers ``{"settings": {...}}`` or ``{"error": "one line"}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudra.kube.connection import Connection, KubeconfigError
from gpudra.kube.credentials import Credentials, TokenFile

if TYPE_CHECKING:
    from gpudra.kube.kubeconfig import Plan, Settings

CHILD_TIMEOUT = 60.0
"""Seconds the child may take (importing, and an exec plugin's run)."""
REFRESH_EARLY = 300.0
"""Seconds before an exec credential expires that it is fetched again (the package's own
margin)."""


class ChildLoad:
    """One child loading ``plan``, started at once; calling it waits for the answer and
    gives the connection (a :class:`KubeconfigError` for a failure)."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._process: subprocess.Popen[bytes] | None = _start()
        self._connection: Connection | None = None
        # The first API calls (publisher, claim fetch, status writer) may ask at once; one
        # of them reads the child's answer, the others wait for it. Two communicate() calls
        # on one process race on its pipes ("flush of closed file").
        self._lock = threading.Lock()

    def __call__(self) -> Connection:
        with self._lock:
            return self._loaded()

    def _loaded(self) -> Connection:
        if self._connection is None:
            # A child answers once: after a failure the next call asks a new one.
            process, self._process = self._process or _start(), None
            settings = _answer(process, self._plan)
            credentials: Credentials | None = None
            if self._plan.token_file is not None:
                credentials = TokenFile(self._plan.token_file)
            elif settings.authorization:
                credentials = ChildCredentials(self._plan, settings)
            self._connection = settings.connection(credentials, self._plan.environ)
        return self._connection


class ChildCredentials:
    """The ``Authorization`` a child loaded; fetched again by a new child once an exec
    plugin's credential is about to expire, or after the server answered 401."""

    def __init__(self, plan: Plan, settings: Settings) -> None:
        self._plan = plan
        self._header = settings.authorization
        self._expires = settings.expires
        self._lock = asyncio.Lock()

    async def header(self) -> str | None:
        if self._due():
            async with self._lock:
                if self._due():
                    settings = await asyncio.to_thread(_answer, _start(), self._plan)
                    self._header, self._expires = settings.authorization, settings.expires
        return self._header

    def rejected(self) -> None:
        self._expires = 0.0

    def _due(self) -> bool:
        return self._expires is not None and time.time() >= self._expires - REFRESH_EARLY


def _start() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gpudra.kube.kubeconfig_child"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _answer(process: subprocess.Popen[bytes], plan: Plan) -> Settings:
    from gpudra.kube.kubeconfig import Settings

    request = json.dumps({"documents": [[str(p), d] for p, d in plan.documents],
                          "context": plan.context}, default=str).encode()
    try:
        out, err = process.communicate(request, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        process.kill()
        process.communicate()
        raise KubeconfigError(f"loading {plan.files} took more than {CHILD_TIMEOUT:g}s"
                              ) from exc
    try:
        answer = json.loads(out)
    except ValueError:
        detail = " ".join(err.decode(errors="replace").split())[-300:]
        raise KubeconfigError(f"loading {plan.files} failed (exit status "
                              f"{process.returncode}): {detail}") from None
    if "error" in answer:
        raise KubeconfigError(str(answer["error"]))
    return Settings(**answer["settings"])


def main() -> int:
    # Second to the daemon's own start-up, which it overlaps: the kubelet waits on that.
    os.nice(10)
    # The package first: its import is most of the time.
    import kubernetes.config.kube_config  # noqa: F401

    from gpudra.kube.kubeconfig import Plan, loaded_settings

    request: dict[str, Any] = json.load(sys.stdin)
    plan = Plan(documents=tuple((Path(p), d) for p, d in request["documents"]),
                context=str(request["context"]), namespace=None, environ={})
    try:
        settings, _ = loaded_settings(plan)
    except KubeconfigError as exc:
        json.dump({"error": str(exc)}, sys.stdout)
        return 0
    json.dump({"settings": dataclasses.asdict(settings)}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
