"""The XID watcher: NVML events → :data:`~gpudra.driver.health.HealthEvent` s, in a thread.

One thread owns one NVML event set with every reachable GPU registered for XID critical
errors and waits on it in short slices (``wait_ms``), so ``stop()`` takes effect within one
slice and the wait never holds the NVML seam's lock (a prepare never queues behind it).

A lost GPU is found two ways: the wait fails with GPU_IS_LOST (NVML does not say which GPU,
so every GPU is probed), and a periodic cheap probe of every GPU (real NVML does not always
fail the wait). A lost GPU is taken out of the event set (it would fail every wait and
blind the watcher to the others) and put back once it answers again.

A GPU passed through to a VM (``away``: bound to ``vfio-pci`` for a claim) is gone from NVML
on purpose: it is neither probed nor registered, and is reported unmonitored (its health is
the VM's driver's business), never lost; it is watched again once it is back.

The same probe reads NVML's GPU recovery action (where the driver offers it) and reports each
change, at start too: a GPU the driver still wants reset after a daemon restart is reported
without an XID. A GPU waiting for recovery is re-read after every wait slice, so it is back
within one slice of the driver saying so. An XID carries the action read right after it, so
it is classified by what the driver says about this fault.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping

import structlog

from gpudra.driver.gpu_recovery import NONE
from gpudra.driver.health import (
    GpuLostChanged,
    HealthEvent,
    MigLocation,
    MonitoringChanged,
    RecoveryActionChanged,
    XidObserved,
)
from gpudra.driver.nvml import EventSet, GpuLostEvent, Nvml, NvmlError, XidEvent

log = structlog.get_logger(__name__)

DEFAULT_WAIT_MS = 250
DEFAULT_PROBE_INTERVAL = 5.0
_DRAIN_LIMIT = 64
"""Events read from a set being replaced, so none queued in it are lost."""
_MAX_RETRY_DELAY = 30.0


class XidWatcher:
    """Watches ``gpu_uuids`` and calls ``on_event`` (from its own thread) for each change.

    ``on_tick`` runs after every wait slice: a heartbeat, and the place for time-based work.
    Both callbacks must be quick and thread-safe; an exception in them is logged, not fatal.
    """

    def __init__(
        self,
        nvml: Nvml,
        gpu_uuids: Iterable[str],
        on_event: Callable[[HealthEvent], None],
        *,
        on_tick: Callable[[], None] | None = None,
        wait_ms: int = DEFAULT_WAIT_MS,
        probe_interval: float = DEFAULT_PROBE_INTERVAL,
        known_actions: Mapping[str, int] | None = None,
        away: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """``known_actions``: recovery actions the driver reported before a restart, so a
        GPU reset meanwhile is reported (a first read is compared with them, else NONE).
        ``away``: the GPUs passed through to VMs now (read at each probe)."""
        if wait_ms <= 0 or probe_interval <= 0:
            raise ValueError("wait_ms and probe_interval must be > 0")
        self._away = away
        self._gone: frozenset[str] = frozenset()
        """``away()`` at the last probe."""
        self._nvml = nvml
        self._gpus = tuple(dict.fromkeys(gpu_uuids))
        self._on_event = on_event
        self._on_tick = on_tick or (lambda: None)
        self._wait_ms = wait_ms
        self._probe_interval = probe_interval
        self._lost: set[str] = set()
        self._unmonitored: set[str] = set()
        # The last recovery action read, per GPU (what it was before a restart, at first).
        self._actions: dict[str, int | None] = dict(known_actions or {})
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("XidWatcher.start() called twice")
        # daemon: a forgotten stop() must not keep the process alive at exit.
        self._thread = threading.Thread(target=self._run, name="gpudra-xid-watcher",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop and join (within one wait slice, plus any NVML call in progress)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("XID watcher did not stop in time", timeout=timeout)

    # --- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        event_set: EventSet | None = None
        next_probe = time.monotonic() + self._probe_interval
        retry_delay = self._wait_ms / 1000
        try:
            self._probe()  # recovery actions pending from before we started
            while not self._stopping.is_set():
                try:
                    if event_set is None:
                        event_set = self._open()
                    event_set = self._wait_once(event_set)
                    self._recheck_recovering()
                    if time.monotonic() >= next_probe:
                        next_probe = time.monotonic() + self._probe_interval
                        if self._probe():
                            event_set = self._reopen(event_set)
                except NvmlError as exc:
                    # Start over with a fresh set after a growing pause; no tick, so the
                    # heartbeat goes stale (and the kubelet says Unknown) while NVML is broken.
                    log.warning("watching XID events failed; retrying", error=str(exc),
                                retry_in=retry_delay)
                    if event_set is not None:
                        self._free(event_set)
                        event_set = None
                    self._stopping.wait(retry_delay)
                    retry_delay = min(retry_delay * 2, _MAX_RETRY_DELAY)
                    continue
                retry_delay = self._wait_ms / 1000
                self._call(self._on_tick)
        except Exception:
            # Nothing is watched any more: say so rather than keep reporting a stale HEALTHY.
            log.exception("XID watcher failed; GPU health is no longer monitored")
            for uuid in self._gpus:
                self._emit(MonitoringChanged(uuid, False, "the XID watcher failed"))
        finally:
            if event_set is not None:
                self._free(event_set)

    def _wait_once(self, event_set: EventSet) -> EventSet:
        got = self._nvml.wait_event(event_set, self._wait_ms)
        if isinstance(got, GpuLostEvent):
            if not self._probe():
                # NVML says lost but every GPU answers: back off instead of spinning.
                self._stopping.wait(self._wait_ms / 1000)
            return self._reopen(event_set)
        if got is not None:
            self._emit(self._locate(got))
        return event_set

    def _open(self) -> EventSet:
        """A new event set with every GPU that is not lost registered for XIDs."""
        event_set = self._nvml.create_event_set()
        for uuid in self._gpus:
            if uuid in self._lost or uuid in self._gone:
                continue
            try:
                registered = self._nvml.register_xid_events(event_set, uuid)
                reason = "" if registered else "the GPU does not report XID events"
            except NvmlError as exc:
                if self._nvml.gpu_is_lost(uuid):
                    self._set_lost(uuid, True)
                    continue
                reason = f"registering for XID events failed: {exc}"
            self._set_monitored(uuid, not reason, reason)
        return event_set

    def _reopen(self, old: EventSet) -> EventSet:
        self._drain(old)
        self._free(old)
        return self._open()

    def _drain(self, event_set: EventSet) -> None:
        for _ in range(_DRAIN_LIMIT):
            try:
                got = self._nvml.wait_event(event_set, 0)
            except NvmlError:
                return
            if not isinstance(got, XidEvent):
                return
            self._emit(self._locate(got))

    def _free(self, event_set: EventSet) -> None:
        try:
            self._nvml.free_event_set(event_set)
        except NvmlError as exc:
            log.warning("freeing an NVML event set failed", error=str(exc))

    def _probe(self) -> bool:
        """Probe every GPU; report and return whether any GPU's lost state changed (or a GPU
        went to a VM or came back)."""
        changed = self._passed_through()
        for uuid in self._gpus:
            if uuid in self._gone:
                continue
            try:
                lost = self._nvml.gpu_is_lost(uuid)
            except Exception as exc:  # a probe must not kill the watcher
                log.warning("probing a GPU failed", gpu=uuid, error=str(exc))
                continue
            changed |= self._set_lost(uuid, lost)
            if not lost:
                self._read_action(uuid)
        return changed

    def _passed_through(self) -> bool:
        """Read which GPUs are with a VM; whether that changed."""
        try:
            gone = frozenset(self._away())
        except Exception as exc:  # a probe must not kill the watcher
            log.warning("reading the GPUs passed through to VMs failed", error=str(exc))
            return False
        if gone == self._gone:
            return False
        for uuid in gone - self._gone:
            if uuid in self._gpus:
                self._set_lost(uuid, False)  # not lost: given away
                self._set_monitored(uuid, False, "passed through to a VM (vfio-pci): its "
                                                 "health is the VM's driver's")
        self._gone = gone
        return True

    def _recheck_recovering(self) -> None:
        """Re-read the action of GPUs waiting for recovery after every wait slice, not only
        at the probe: a reset raises no XID, and the GPU should be back as soon as the
        driver says so. One field read per such GPU; healthy GPUs wait for the probe."""
        for uuid, action in list(self._actions.items()):
            if action is not None and action != NONE and uuid not in self._lost \
                    and uuid not in self._gone:
                self._read_action(uuid)

    def _read_action(self, uuid: str) -> int | None:
        """The GPU's recovery action now (None: not offered or unreadable); a change from the
        last read is reported."""
        try:
            action = self._nvml.gpu_recovery_action(uuid)
        except Exception as exc:  # a probe must not kill the watcher
            log.warning("reading a GPU's recovery action failed", gpu=uuid, error=str(exc))
            return None
        if action != self._actions.get(uuid, NONE):
            if action is not None:
                (log.info if action == NONE else log.error)(
                    "GPU recovery action changed", gpu=uuid, action=action)
            self._emit(RecoveryActionChanged(uuid, action))
        self._actions[uuid] = action
        return action

    def _locate(self, event: XidEvent) -> XidObserved:
        """Name the MIG device of a MIG-scoped XID by profile and placement, as its DRA device
        name does. If it is gone already, the whole GPU takes the blame (the safe side)."""
        action = self._read_action(event.gpu_uuid)
        if event.gpu_instance_id is None:
            return XidObserved(event.gpu_uuid, event.xid, recovery_action=action)
        try:
            for mig in self._nvml.mig_instances(event.gpu_uuid):
                if (mig.gpu_instance_id, mig.compute_instance_id) == (
                        event.gpu_instance_id, event.compute_instance_id):
                    return XidObserved(event.gpu_uuid, event.xid,
                                       MigLocation(mig.profile_id, mig.placement.start),
                                       mig.uuid, recovery_action=action)
        except NvmlError as exc:
            log.warning("cannot list MIG devices for an XID", gpu=event.gpu_uuid,
                        error=str(exc))
        log.warning("XID names a MIG device that no longer exists; tainting the whole GPU",
                    gpu=event.gpu_uuid, xid=event.xid, gpu_instance=event.gpu_instance_id,
                    compute_instance=event.compute_instance_id)
        return XidObserved(event.gpu_uuid, event.xid, recovery_action=action)

    # --- reporting ------------------------------------------------------------------------------

    def _set_lost(self, uuid: str, lost: bool) -> bool:
        if lost == (uuid in self._lost):
            return False
        if lost:
            self._lost.add(uuid)
            log.error("GPU is lost (NVML GPU_IS_LOST)", gpu=uuid)
        else:
            self._lost.discard(uuid)
            log.warning("lost GPU answers NVML again", gpu=uuid)
        self._emit(GpuLostChanged(uuid, lost))
        return True

    def _set_monitored(self, uuid: str, monitored: bool, reason: str) -> None:
        if monitored == (uuid not in self._unmonitored):
            return
        if monitored:
            self._unmonitored.discard(uuid)
        else:
            self._unmonitored.add(uuid)
            log.warning("GPU health is not monitored", gpu=uuid, reason=reason)
        self._emit(MonitoringChanged(uuid, monitored, reason))

    def _emit(self, event: HealthEvent) -> None:
        self._call(lambda: self._on_event(event))

    @staticmethod
    def _call(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("health callback failed")
