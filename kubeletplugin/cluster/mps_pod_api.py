"""The MPS control daemons' pods through the daemon's API session
(:class:`gpudra.driver.mps_pods.PodApi`).

The driver calls it from worker threads (prepare and unprepare, start-up reconciliation);
each call runs on the daemon's event loop, where the session lives, and the thread waits for
it. The chart's Role grants exactly these calls on pods of the driver's namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

from gpudra.driver.mps_pods import Obj, PodApiError
from gpudra.kube.errors import ApiCallError, NotFound
from gpudra.kube.raw_api import RawApi, Resource
from gpudra.kube.session import ApiSession

PODS: Final = Resource("pods", "/api/v1", namespaced=True)
CALL_TIMEOUT: Final = 30.0
"""Seconds a worker thread waits for one call (the session has its own, shorter, deadlines)."""

T = TypeVar("T")


class SessionPodApi:
    """Pods of ``namespace``, called from threads other than ``loop``'s."""

    def __init__(self, session: ApiSession, namespace: str,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.namespace = namespace
        self._raw = RawApi(session)
        self._loop = loop

    def _wait(self, call: Coroutine[Any, Any, T], what: str) -> T:
        if _running_loop() is self._loop:  # waiting here would block the call forever
            call.close()
            raise PodApiError(f"{what}: called on the event loop's own thread")
        future = asyncio.run_coroutine_threadsafe(call, self._loop)
        try:
            return future.result(CALL_TIMEOUT)
        except TimeoutError as exc:
            future.cancel()
            raise PodApiError(f"{what}: no answer in {CALL_TIMEOUT:g}s") from exc
        except ApiCallError as exc:
            raise PodApiError(str(exc)) from exc

    def get(self, name: str) -> Obj | None:
        async def get() -> Obj | None:
            try:
                return await self._raw.get(PODS, name, namespace=self.namespace)
            except NotFound:
                return None
        return self._wait(get(), f"get pod {self.namespace}/{name}")

    def list_on_node(self, node: str) -> list[Obj]:
        answer = self._wait(self._raw.list(PODS, namespace=self.namespace,
                                           field_selector=f"spec.nodeName={node}"),
                            f"list pods of node {node} in {self.namespace}")
        items = answer.get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def create(self, body: Obj) -> Obj:
        return self._wait(self._raw.create(PODS, body, namespace=self.namespace),
                          f"create pod {self.namespace}/{body['metadata']['name']}")

    def delete(self, name: str) -> None:
        async def delete() -> None:
            with contextlib.suppress(NotFound):  # gone already: what was asked
                await self._raw.delete(PODS, name, namespace=self.namespace)
        self._wait(delete(), f"delete pod {self.namespace}/{name}")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
