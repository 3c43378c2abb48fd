"""Publish only what the kubelet can prepare: the first publication waits for the kubelet's
``NotifyRegistrationStatus(plugin_registered=true)``.

A slice published before that lets the scheduler place a pod whose prepare the kubelet
fails with "DRA driver … is not registered", and retries only after its back-off: 13.6 s
instead of under one, measured on a real kubelet. The wait is bounded only in what it
says: after ``timeout`` seconds one warning names the likely causes (the kubelet is down,
or watches another directory) and ``/readyz`` says so too; publication goes on waiting.
Once open the gate stays open: a restarted kubelet registers us again (or refuses to)
without anything being unpublished.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from gpudra.kubeletplugin.serving.registration import RegistrationState

log = structlog.get_logger("gpudra.node")


class PublishGate:
    """Opens at the kubelet's first "registered"; see the module docstring."""

    def __init__(self, registration: RegistrationState, timeout: float,
                 registration_socket: Path, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._registration = registration
        self._timeout = timeout
        self._socket = registration_socket
        self._clock = clock
        self._since = clock()  # the registration socket is being served from now on

    @property
    def open(self) -> bool:
        return self._registration.confirmed.is_set()

    async def wait(self) -> None:
        """Return once the kubelet has registered us (at once if it ever did)."""
        confirmed = self._registration.confirmed
        if confirmed.is_set():
            return
        try:
            await asyncio.wait_for(confirmed.wait(), max(0.0, self._timeout - self._waited()))
        except TimeoutError:
            log.warning("the kubelet has not registered this plugin; publishing nothing "
                        "until it does (is the kubelet running, and does it watch the "
                        "registration socket's directory?)",
                        waited_seconds=round(self._waited(), 1),
                        registration_socket=str(self._socket))
            await confirmed.wait()
            log.info("the kubelet registered this plugin at last; publishing",
                     waited_seconds=round(self._waited(), 1))

    def problems(self) -> list[str]:
        """For ``/readyz`` (any thread): why the kubelet cannot call us, and what that
        holds back; empty once it is registered."""
        registration = self._registration
        if registration.registered.is_set():
            return []
        if registration.error is not None:
            problems = [f"the kubelet refused the registration: {registration.error}"]
        elif self._waited() >= self._timeout:
            problems = [f"not registered with the kubelet after {self._timeout:g} s: is the "
                        f"kubelet running, and does it watch {self._socket.parent}?"]
        else:
            problems = ["not registered with the kubelet yet"]
        if not self.open:
            problems.append("ResourceSlices not published: waiting for the kubelet to "
                            "register this plugin")
        return problems

    def _waited(self) -> float:
        return self._clock() - self._since
