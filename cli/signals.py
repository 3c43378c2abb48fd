"""How the long-running commands stop: SIGTERM (the kubelet, a rollout) or SIGINT (a user)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable


def stop_on_signals() -> asyncio.Event:
    """An event that SIGTERM or SIGINT sets; call it inside the running event loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def run_until_signalled(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``serve(stop)`` on a new event loop, ``stop`` set by SIGTERM or SIGINT."""

    async def main() -> None:
        await serve(stop_on_signals())

    asyncio.run(main())
