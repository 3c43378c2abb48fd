"""How the kubelet names a ResourceClaim, what it gets back for one, and the one way every
message names a claim."""

from __future__ import annotations

from dataclasses import dataclass


def claim_ref(namespace: str, name: str, uid: str) -> str:
    """``namespace/name:uid``: how every message and log line names a claim."""
    return f"{namespace}/{name}:{uid}"


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it: all a request carries."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return claim_ref(self.namespace, self.name, self.uid)


@dataclass(frozen=True)
class PreparedDevice:
    """One prepared device of a claim, and the CDI devices a container needs for it."""

    request_names: tuple[str, ...]
    """Requests as allocated (``req`` or ``req/subrequest``); the kubelet's wire layer
    strips subrequests. Empty means "all requests of the claim" (kubelet semantics)."""
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    """Only for consumable-capacity allocations; the v1beta1 API cannot carry it."""
