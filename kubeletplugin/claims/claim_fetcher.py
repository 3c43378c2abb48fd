"""GET ResourceClaims from the API server, concurrently, as raw JSON.

Raw JSON (not the client's pydantic models) because client-37 models drop fields they do
not know, and an opaque config or a newer allocation field must reach us intact. The GETs go
through the Kubernetes layer's ``RawApi``: counted in ``gpudra_api_calls``, one deadline for
headers and body, and its typed errors turned here into one message per claim. The GETs of
one kubelet call overlap on the event loop (:meth:`ClaimFetcher.fetch_all`). A claim that
is there but was replaced (another uid) is :func:`~.claim_decoding.decode_claim`'s error.

On a cluster that serves only ``resource.k8s.io/v1beta2`` or ``v1beta1`` (Kubernetes 1.33,
1.32) the GET goes to that version and the claim comes back in v1's shape (``RawApi`` and
:mod:`gpudra.kube.resource_versions` convert it), so decoding knows one shape only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from gpudra.api.claims import claim_ref
from gpudra.driver.claims import ClaimError
from gpudra.kube.errors import ApiCallError, BadAnswer, NotFound, Unreachable
from gpudra.kube.raw_api import RESOURCE_CLAIMS, RawApi
from gpudra.kube.session import ApiSession


class ClaimFetchError(ClaimError):
    """The API server could not give us the claim (not found, forbidden, unreachable)."""


class ClaimFetcher:
    def __init__(self, session: ApiSession, *, timeout: float = 10.0) -> None:
        self._api = RawApi(session, timeout=timeout)

    @property
    def timeout(self) -> float:
        """Seconds one GET may take, headers and body."""
        return self._api.timeout

    async def fetch(self, namespace: str, name: str, uid: str) -> Mapping[str, Any]:
        try:
            return await self._api.get(RESOURCE_CLAIMS, name, namespace=namespace)
        except ApiCallError as error:
            raise ClaimFetchError(
                f"claim {claim_ref(namespace, name, uid)}: {_problem(error)}") from error

    async def fetch_all(
        self, refs: Sequence[tuple[str, str, str]]
    ) -> list[Mapping[str, Any] | ClaimError]:
        """Fetch many claims at once; each slot holds the claim or the error for it."""
        if len(refs) == 1:  # the kubelet's usual call: no task for gather to wrap it in
            try:
                return [await self.fetch(*refs[0])]
            except ClaimError as error:
                return [error]
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


def _problem(error: ApiCallError) -> str:
    """What went wrong, naming the API server (``driver.metrics.error_reason`` sorts
    prepare errors by these words: "not found in the API server", else "API server")."""
    if isinstance(error, NotFound):
        return "not found in the API server"
    if isinstance(error, Unreachable):
        return f"cannot reach the API server: {error.message}"
    if isinstance(error, BadAnswer):
        return f"bad answer from the API server: {error.message}"
    return f"API error {error.status} from the API server: {error.message or error.reason}"
