"""``gpudra controller``'s process: one API session, leader election, and the controller
while this process leads.

A standby does nothing but try for the Lease. A leader that cannot renew stops acting and
the process ends with an error (its Deployment starts it again, as a standby): it must not
go on writing next to a new leader. A clean stop releases the Lease first.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import structlog

from gpudra.controller.compute_domains.leader import LeaderElector, LeaseSettings
from gpudra.controller.compute_domains.objects import Settings
from gpudra.controller.compute_domains.reconcile import Controller
from gpudra.kube.raw_api import RawApi
from gpudra.kube.session import ApiSession, ConnectionSource

log = structlog.get_logger(__name__)


class LeadershipLost(Exception):
    """The Lease could not be renewed in time; this process must stop acting."""


@dataclass(frozen=True)
class ControllerConfig:
    settings: Settings
    connection: ConnectionSource
    identity: str
    lease: LeaseSettings | None
    """None: no leader election (one replica only)."""
    workers: int = 4
    api_timeout: float = 10.0


async def _first(*aws: asyncio.Task[object]) -> set[asyncio.Task[object]]:
    done, _ = await asyncio.wait(aws, return_when=asyncio.FIRST_COMPLETED)
    return done


async def serve(config: ControllerConfig, stop: asyncio.Event) -> None:
    """Run until ``stop`` is set; :class:`LeadershipLost` if the Lease is lost."""
    async with ApiSession(config.connection) as session:
        api = RawApi(session, timeout=config.api_timeout)
        elector = LeaderElector(api, config.lease) if config.lease else None
        stopping: asyncio.Task[object] = asyncio.create_task(stop.wait())
        tasks: list[asyncio.Task[object]] = [stopping]
        try:
            if elector is not None:
                log.info("waiting for the lease", lease=config.lease.name if config.lease
                         else "", identity=config.identity)
                acquiring: asyncio.Task[object] = asyncio.create_task(elector.acquire())
                tasks.append(acquiring)
                if stopping in await _first(stopping, acquiring):
                    return
            controller = Controller(api, config.settings, instance=config.identity,
                                    workers=config.workers)
            running: asyncio.Task[object] = asyncio.create_task(controller.run())
            tasks.append(running)
            watched = [stopping, running]
            if elector is not None:
                holding: asyncio.Task[object] = asyncio.create_task(elector.hold())
                tasks.append(holding)
                watched.append(holding)
            done = await _first(*watched)
            if running in done:
                running.result()  # a bug: raise it
                raise RuntimeError("the controller stopped by itself")
            if stopping not in done:
                raise LeadershipLost(f"lease {config.lease.name if config.lease else ''}: "
                                     "not renewed in time; stopping")
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if elector is not None and stop.is_set():
                await elector.release()
