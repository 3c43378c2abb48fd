"""What prepared claims do with their devices: usage samples and idle detection.

Pure data and arithmetic, no NVML and no I/O: the sampler
(:mod:`gpudra.driver.usage_sampler`) builds :class:`DeviceUsage` rows once per interval and
feeds them to an :class:`IdleTracker`; metrics, ``gpudra top``, claim status and Kubernetes
Events read the same rows and subscribe to the tracker's transitions.

A claim is *quiet* while every one of its devices is under the SM threshold; it is *idle*
once it has been quiet for ``idle_after`` seconds. One sample over the threshold on any of
its devices makes it active again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog

DEFAULT_IDLE_THRESHOLD_PERCENT = 5.0
DEFAULT_IDLE_AFTER_SECONDS = 30 * 60.0


@dataclass(frozen=True)
class DeviceUsage:
    """One prepared device of one claim, as sampled at ``sampled_at`` (Unix seconds).

    ``sm_percent`` is 0-100. For a MIG device it is the MIG instance's own figure where the
    GPU can tell (GPM on Hopper and later) and otherwise an estimate; ``sm_exact`` says which.
    ``power_watts`` is None where NVML has no per-device figure (MIG devices, shares).
    """

    claim_uid: str
    namespace: str
    claim: str
    pods: tuple[str, ...]
    device: str
    gpu_uuid: str
    sm_percent: float
    memory_used_bytes: int
    memory_total_bytes: int
    sampled_at: float
    power_watts: float | None = None
    mig_profile: str | None = None
    mig_uuid: str | None = None
    share_id: str | None = None
    sm_exact: bool = True


@dataclass(frozen=True)
class IdleTransition:
    """A claim became idle (``idle`` true) or active again (``idle`` false) at ``at``.

    ``since`` is when the claim went quiet; ``sm_low``/``sm_high`` the range of SM % seen
    over the quiet period and ``devices`` the samples that decided the transition.
    """

    claim_uid: str
    namespace: str
    claim: str
    pods: tuple[str, ...]
    idle: bool
    at: float
    since: float | None
    sm_low: float
    sm_high: float
    devices: tuple[DeviceUsage, ...]

    @property
    def memory_used_bytes(self) -> int:
        return sum(d.memory_used_bytes for d in self.devices)


@dataclass
class _ClaimIdle:
    quiet_since: float | None = None
    idle: bool = False
    sm_low: float = 0.0
    sm_high: float = 0.0


@dataclass(frozen=True)
class ClaimIdleState:
    """A claim's idle state as of the last sample."""

    quiet_since: float | None
    idle: bool
    sm_low: float
    sm_high: float

    def idle_seconds(self, now: float) -> float:
        """Seconds the claim has been quiet (0 while active); the ``idle_seconds`` gauge."""
        return 0.0 if self.quiet_since is None else max(0.0, now - self.quiet_since)


Listener = Callable[[IdleTransition], None]


@dataclass
class IdleTracker:
    """Per-claim idle state fed by sampling passes; tells ``listeners`` about transitions.

    Listeners are called on the thread that calls :meth:`observe` (the sampler's thread), after
    the tracker's state is updated; an asyncio consumer hops with ``loop.call_soon_threadsafe``.
    A listener that raises does not stop the others.
    """

    threshold_percent: float = DEFAULT_IDLE_THRESHOLD_PERCENT
    idle_after: float = DEFAULT_IDLE_AFTER_SECONDS
    clock: Callable[[], float] = time.time
    listeners: list[Listener] = field(default_factory=list)
    _claims: dict[str, _ClaimIdle] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def observe(self, samples: Iterable[DeviceUsage], *, complete: bool = True
                ) -> list[IdleTransition]:
        """Take one sampling pass; with ``complete``, claims absent from it are forgotten."""
        now = self.clock()
        by_claim: dict[str, list[DeviceUsage]] = {}
        for sample in samples:
            by_claim.setdefault(sample.claim_uid, []).append(sample)
        transitions: list[IdleTransition] = []
        with self._lock:
            if complete:
                for uid in set(self._claims) - set(by_claim):
                    del self._claims[uid]
            for uid, devices in by_claim.items():
                transition = self._step(self._claims.setdefault(uid, _ClaimIdle()), devices, now)
                if transition is not None:
                    transitions.append(transition)
        for transition in transitions:
            self._notify(transition)
        return transitions

    def forget(self, claim_uid: str) -> None:
        """Drop a claim (unprepared); no transition is reported for it."""
        with self._lock:
            self._claims.pop(claim_uid, None)

    def state(self, claim_uid: str) -> ClaimIdleState | None:
        with self._lock:
            entry = self._claims.get(claim_uid)
            if entry is None:
                return None
            return ClaimIdleState(entry.quiet_since, entry.idle, entry.sm_low, entry.sm_high)

    def idle_since(self, claim_uid: str) -> float | None:
        """When the claim went quiet, if it is idle now; None while active or not quiet long."""
        state = self.state(claim_uid)
        return state.quiet_since if state is not None and state.idle else None

    def is_idle(self, claim_uid: str) -> bool:
        state = self.state(claim_uid)
        return state is not None and state.idle

    def idle_seconds(self, claim_uid: str) -> float:
        state = self.state(claim_uid)
        return 0.0 if state is None else state.idle_seconds(self.clock())

    def _step(self, entry: _ClaimIdle, devices: list[DeviceUsage], now: float
              ) -> IdleTransition | None:
        busiest = max(d.sm_percent for d in devices)
        first = devices[0]

        def transition(idle: bool) -> IdleTransition:
            return IdleTransition(
                claim_uid=first.claim_uid, namespace=first.namespace, claim=first.claim,
                pods=first.pods, idle=idle, at=now, since=entry.quiet_since,
                sm_low=entry.sm_low, sm_high=entry.sm_high, devices=tuple(devices))

        if busiest >= self.threshold_percent:
            was_idle = entry.idle
            result = transition(False) if was_idle else None
            entry.quiet_since, entry.idle = None, False
            return result
        quietest = min(d.sm_percent for d in devices)
        if entry.quiet_since is None:
            entry.quiet_since, entry.sm_low, entry.sm_high = now, quietest, busiest
        else:
            entry.sm_low, entry.sm_high = min(entry.sm_low, quietest), max(entry.sm_high, busiest)
        if not entry.idle and now - entry.quiet_since >= self.idle_after:
            entry.idle = True
            return transition(True)
        return None

    def _notify(self, transition: IdleTransition) -> None:
        for listener in list(self.listeners):
            try:
                listener(transition)
            except Exception:  # one bad subscriber must not silence the rest
                structlog.get_logger().exception("idle listener failed",
                                                 claim=transition.claim_uid)
