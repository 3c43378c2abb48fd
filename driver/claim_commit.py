"""One commit of claim changes: the records a call puts, the claims it removes, and the
MIG-mode baselines of the GPUs it holds, written to the checkpoint at once."""

from __future__ import annotations

from collections.abc import Mapping

from gpudra.driver.checkpoint_model import (
    Checkpoint,
    ClaimRecord,
    with_claim,
    with_mig_mode_baseline,
    without_claim,
)
from gpudra.driver.checkpoint_store import CheckpointStore


class ClaimCommit:
    """Collects changes, then :meth:`commit` merges them into a fresh read under the
    checkpoint's lock: never a blind overwrite, since calls on other GPUs (and the other
    daemon instance) commit their own claims meanwhile.

    What is put or removed here is authoritative for those claims; a MIG-mode baseline
    already on disk wins over the one given here (the first seen is the one to restore).
    """

    def __init__(self, store: CheckpointStore, *, lock_timeout: float) -> None:
        self._store = store
        self._lock_timeout = lock_timeout
        self._changes: dict[str, ClaimRecord | None] = {}
        """uid → the record to put, or ``None``: remove it. In order, the last one wins."""
        self._baselines: dict[str, bool] = {}

    def put(self, record: ClaimRecord) -> ClaimCommit:
        self._changes[record.uid] = record
        return self

    def remove(self, uid: str) -> ClaimCommit:
        self._changes[uid] = None
        return self

    def baselines(self, baselines: Mapping[str, bool]) -> ClaimCommit:
        for gpu, enabled in baselines.items():
            self._baselines.setdefault(gpu, enabled)
        return self

    def commit(self) -> None:
        """Write what was collected in one durable checkpoint commit, then start afresh.

        Nothing without a claim change: baselines are recorded with the claim that needed
        them, never on their own.
        """
        if not self._changes:
            return
        self._store.update(self._applied, self._lock_timeout)
        self._changes, self._baselines = {}, {}

    def _applied(self, cp: Checkpoint) -> Checkpoint:
        for gpu, enabled in self._baselines.items():
            cp = with_mig_mode_baseline(cp, gpu, enabled)
        for uid, record in self._changes.items():
            cp = without_claim(cp, uid) if record is None else with_claim(cp, record)
        return cp
