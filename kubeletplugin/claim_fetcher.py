"""GET ResourceClaims from the API server, concurrently, as raw JSON.

Raw JSON (not the client's pydantic models) because client-37 models drop fields they do
not know, and an opaque config or a newer allocation field must reach us intact.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.aio import client

from gpudra.driver.claims import ClaimError


class ClaimFetchError(ClaimError):
    """The API server could not give us the claim (not found, forbidden, unreachable)."""


class ClaimFetcher:
    def __init__(self, api_client: client.ApiClient, *, timeout: float = 10.0) -> None:
        self._api = client.ResourceV1Api(api_client)
        self._timeout = timeout

    async def fetch(self, namespace: str, name: str, uid: str) -> Mapping[str, Any]:
        ref = f"{namespace}/{name}:{uid}"
        try:
            # One deadline for headers and body: a stalled body must not hang the call.
            status, body = await asyncio.wait_for(self._get(name, namespace), self._timeout)
        except TimeoutError as exc:
            raise ClaimFetchError(f"claim {ref}: API server did not answer within "
                                  f"{self._timeout:g}s") from exc
        except client.ApiException as exc:
            raise ClaimFetchError(f"claim {ref}: API error {exc.status}: {exc.reason}") from exc
        except Exception as exc:  # aiohttp connection and payload errors and the like
            raise ClaimFetchError(f"claim {ref}: cannot reach the API server: {exc}") from exc
        if status == 404:
            raise ClaimFetchError(f"claim {ref}: not found in the API server")
        if status >= 400:
            raise ClaimFetchError(f"claim {ref}: API error {status}: {_status_message(body)}")
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ClaimFetchError(f"claim {ref}: API server sent invalid JSON") from exc
        if not isinstance(data, dict):
            raise ClaimFetchError(f"claim {ref}: API server sent {type(data).__name__}")
        return data

    async def _get(self, name: str, namespace: str) -> tuple[int, bytes]:
        response = await self._api.read_namespaced_resource_claim_without_preload_content(
            name, namespace)
        try:
            return int(response.status), await response.read()
        finally:
            response.release()

    async def fetch_all(
        self, refs: Sequence[tuple[str, str, str]]
    ) -> list[Mapping[str, Any] | ClaimError]:
        """Fetch many claims at once; each slot holds the claim or the error for it."""
        results = await asyncio.gather(*(self.fetch(*ref) for ref in refs),
                                       return_exceptions=True)
        out: list[Mapping[str, Any] | ClaimError] = []
        for result in results:
            if isinstance(result, ClaimError):
                out.append(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                out.append(result)
        return out


def _status_message(body: bytes) -> str:
    try:
        status = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace")
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return str(status["message"])
    return body[:200].decode(errors="replace")
