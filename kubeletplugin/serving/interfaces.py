"""The seam between the kubelet gRPC face and the prepare/unprepare logic behind it.

The gRPC servicers only translate: kubelet requests become :class:`ClaimRef` lists, and a
:class:`ClaimPreparer`'s answers (:class:`PreparedDevice` s, as the driver returns them)
become kubelet responses. Nothing here knows about protobuf, so a preparer can be driven
and tested without gRPC.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpudra.api.claims import ClaimRef, PreparedDevice


@dataclass(frozen=True)
class PrepareOutcome:
    """The result of preparing one claim: its devices, or an error the kubelet will retry."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str | None = None


def always() -> bool:
    return True


class ClaimPreparer(Protocol):
    """Prepares and unprepares claims; must be idempotent (the kubelet retries).

    Called in the DRA socket's call threads (:mod:`.server`), several at once: it
    blocks until the answer is known and must be thread-safe. ``wanted`` says whether the
    kubelet still waits for the answer (its call deadline has not passed, the server is not
    stopping): a prepare it gave up on must not start device work, since the kubelet may
    already have unprepared the claim and would never undo it.
    """

    def prepare(self, claims: Sequence[ClaimRef], *,
                wanted: Callable[[], bool] = always) -> Mapping[str, PrepareOutcome]:
        """Prepare every claim; the result is keyed by claim uid."""
        ...

    def unprepare(self, claims: Sequence[ClaimRef], *,
                  wanted: Callable[[], bool] = always) -> Mapping[str, str | None]:
        """Unprepare every claim; the result maps claim uid to an error or None."""
        ...
