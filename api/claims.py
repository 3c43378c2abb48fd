"""How the kubelet names a ResourceClaim, and the one way every message names it."""

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
