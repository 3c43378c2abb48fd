"""The node daemon's health hook: XID watcher + health policy + metrics, behind one object.

Wiring (the daemon runs an asyncio loop; the watcher runs in its own thread)::

    loop = asyncio.get_running_loop()

    def refresh() -> None:                      # on the loop
        publisher.update(monitor.apply(devices))
        health_service.notify()

    monitor = HealthMonitor(nvml, gpu_uuids, policy,
                            on_change=lambda: loop.call_soon_threadsafe(refresh))
    monitor.start()
    ...
    monitor.stop()
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from types import TracebackType

import structlog

from gpudra.driver.devices import NodeDevices
from gpudra.driver.health import (
    DeviceHealth,
    GpuLostChanged,
    HealthEvent,
    HealthPolicy,
    HealthState,
    XidObserved,
)
from gpudra.driver.health_store import RecoveryStore
from gpudra.driver.health_watcher import DEFAULT_PROBE_INTERVAL, DEFAULT_WAIT_MS, XidWatcher
from gpudra.driver.metrics import DEVICE_TAINTS, GPU_RECOVERY_REQUIRED, XID_EVENTS
from gpudra.driver.nvml import Nvml

log = structlog.get_logger(__name__)

TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


class HealthMonitor:
    """Keeps a :class:`HealthState` current from NVML and says when its taints change.

    ``on_change`` is called from the watcher thread, after the new state is in place, each
    time the taints (not merely the quiet-period clock) change; make it thread-safe and
    quick, e.g. ``lambda: loop.call_soon_threadsafe(refresh)``. Reading :attr:`state` is
    safe from any thread: states are immutable and swapped whole.
    """

    def __init__(
        self,
        nvml: Nvml,
        gpu_uuids: Iterable[str],
        policy: HealthPolicy,
        on_change: Callable[[], None],
        *,
        wait_ms: int = DEFAULT_WAIT_MS,
        probe_interval: float = DEFAULT_PROBE_INTERVAL,
        clock: Callable[[], float] = time.time,
        store: RecoveryStore | None = None,
        away: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """``store``: GPUs waiting for recovery are loaded from it and kept in it, so a
        restart does not forget them (``gpudra.driver.health_store``). ``away``: GPUs
        passed through to VMs now, reported unmonitored rather than lost."""
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()  # serialises transitions, not reads
        self._store = store
        self._state = HealthState(policy)
        if store is not None:
            self._state = self._state.with_recoveries(store.load())
            _record_recovery({}, self._state.recovering())
        known = {gpu: r.action for gpu, r in self._state.recoveries().items() if r.from_driver}
        self._checked_at = clock()
        self._watcher = XidWatcher(nvml, gpu_uuids, self.observe, on_tick=self._tick,
                                   wait_ms=wait_ms, probe_interval=probe_interval,
                                   known_actions=known, away=away)

    @property
    def state(self) -> HealthState:
        return self._state

    @property
    def checked_at(self) -> float:
        """Unix seconds of the watcher's last completed wait: its heartbeat."""
        return self._checked_at

    def start(self) -> None:
        self._watcher.start()

    def stop(self) -> None:
        self._watcher.stop()

    def __enter__(self) -> HealthMonitor:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # --- views for the daemon ---------------------------------------------------------------

    def apply(self, devices: NodeDevices) -> NodeDevices:
        """``devices`` with the current taints; records ``gpudra_device_taints``."""
        tainted = self._state.apply(devices)
        counts: Counter[str] = Counter(t.effect for d in tainted.devices for t in d.taints)
        for effect in TAINT_EFFECTS:
            DEVICE_TAINTS.labels(effect=effect).set(counts[effect])
        return tainted

    def device_health(self, devices: NodeDevices) -> tuple[DeviceHealth, ...]:
        """Every device's health for the kubelet, stamped with the watcher's heartbeat (a
        stuck watcher goes stale, and the kubelet then reports the devices as Unknown)."""
        return self._state.device_health(devices, self._checked_at)

    # --- inputs -----------------------------------------------------------------------------

    def observe(self, event: HealthEvent) -> None:
        """Feed one event (the watcher does; other health sources may too). Thread-safe."""
        if isinstance(event, XidObserved):
            XID_EVENTS.labels(gpu=event.gpu_uuid, xid=str(event.xid)).inc()
            critical = self._state.policy.is_critical(event.xid)
            (log.warning if critical else log.info)(
                "XID event", gpu=event.gpu_uuid, xid=event.xid, mig=event.mig_uuid,
                critical=critical)
        elif isinstance(event, GpuLostChanged):
            log.info("GPU lost state changed", gpu=event.gpu_uuid, lost=event.lost)
        now = self._clock()
        self._transition(lambda state: state.observe(event, now))

    def _tick(self) -> None:
        now = self._clock()
        self._checked_at = now
        self._transition(lambda state: state.expire(now))

    def _transition(self, step: Callable[[HealthState], HealthState]) -> None:
        with self._lock:
            old = self._state
            new = self._state = step(old)
            if self._store is not None and new.recoveries() != old.recoveries():
                self._store.save(new.recoveries())  # under the lock: saves stay in order
        if new is not old and new.fingerprint() != old.fingerprint():
            _record_recovery(old.recovering(), new.recovering())
            self._on_change()


def _record_recovery(before: Mapping[str, str], after: Mapping[str, str]) -> None:
    """``gpudra_gpu_recovery_required`` and a log line for each GPU whose recovery changed."""
    for gpu, action in before.items():
        if after.get(gpu) != action:
            GPU_RECOVERY_REQUIRED.remove(gpu, action)
            if gpu not in after:
                log.warning("GPU recovered: the driver reports it healthy again", gpu=gpu,
                            was=action)
    for gpu, action in after.items():
        if before.get(gpu) != action:
            GPU_RECOVERY_REQUIRED.labels(gpu=gpu, action=action).set(1)
            log.error("GPU needs recovery before it is scheduled again", gpu=gpu,
                      action=action)
