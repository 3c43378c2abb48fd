"""NVML event sets: XID events raised by ``SimControl.raise_xid`` in any process.

Events live in the shared state file with increasing sequence numbers; an event set is
private to this process and remembers the next sequence number it has not looked at, so a
wait polls the (stat-cached) state until a matching event appears or the timeout passes.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cabi import as_int, invalid, put, put_handle, put_pointer_field, target
from .codes import (
    EVENT_XID_CRITICAL,
    SUPPORTED_EVENTS,
    VALUE_NOT_AVAILABLE_UINT,
    NvmlFailure,
    Return,
)
from .core import EVENT_SET, LibraryCore, symbol
from .state import NodeState, XidEvent

POLL_SECONDS = 0.005
"""How often a waiting event set looks at the state file (XID delivery latency)."""


@dataclass
class _Registration:
    mask: int
    since: int
    """First event sequence number this registration may see."""


@dataclass
class _EventSet:
    next_seq: int
    registrations: dict[int, _Registration] = field(default_factory=dict)


class EventApi(LibraryCore):
    def __init__(self, profile: str, state_dir: Path) -> None:
        super().__init__(profile, state_dir)
        self._event_sets: dict[int, _EventSet] = {}
        self._event_serials = itertools.count(1)
        self._event_lock = threading.Lock()

    def _event_set(self, handle: object) -> _EventSet:
        _, _, serial = self._key(handle, EVENT_SET)
        found = self._event_sets.get(serial)
        if found is None:
            raise invalid()  # freed
        return found

    @symbol
    def nvmlEventSetCreate(self, event_set: object) -> None:
        with self._event_lock:
            serial = next(self._event_serials)
            self._event_sets[serial] = _EventSet(next_seq=self.state().next_event_seq)
        put_handle(event_set, self.handles.address((EVENT_SET, 0, serial)))

    @symbol
    def nvmlEventSetFree(self, event_set: object) -> None:
        _, _, serial = self._key(event_set, EVENT_SET)
        with self._event_lock:
            if self._event_sets.pop(serial, None) is None:
                raise invalid()

    @symbol
    def nvmlDeviceGetSupportedEventTypes(self, device: object, types: object) -> None:
        self.full_gpu(device)
        put(types, SUPPORTED_EVENTS)

    @symbol
    def nvmlDeviceRegisterEvents(self, device: object, types: object, event_set: object) -> None:
        slot, _ = self.full_gpu(device)
        mask = as_int(types)
        if mask & ~SUPPORTED_EVENTS:
            raise NvmlFailure(Return.ERROR_NOT_SUPPORTED)
        evset = self._event_set(event_set)
        since = self.state().next_event_seq
        old = evset.registrations.get(slot.index)
        evset.registrations[slot.index] = _Registration(mask | (old.mask if old else 0),
                                                        old.since if old else since)

    def _next_event(self, evset: _EventSet, state: NodeState) -> XidEvent | None:
        start = bisect.bisect_left(state.events, evset.next_seq, key=lambda e: e.seq)
        for event in state.events[start:]:
            evset.next_seq = event.seq + 1
            reg = evset.registrations.get(event.gpu)
            if reg is not None and event.seq >= reg.since and reg.mask & EVENT_XID_CRITICAL:
                return event
        evset.next_seq = max(evset.next_seq, state.next_event_seq)
        return None

    @symbol
    def nvmlEventSetWait_v2(self, event_set: object, data: object, timeout_ms: object) -> None:
        """TIMEOUT when nothing arrives; GPU_IS_LOST while a registered GPU is lost."""
        evset = self._event_set(event_set)
        out = target(data)
        deadline = time.monotonic() + as_int(timeout_ms) / 1000
        while True:
            state = self.state()
            event = self._next_event(evset, state)
            if event is not None:
                put_pointer_field(out, "device", self.gpu_handle(event.gpu))
                out.eventType = EVENT_XID_CRITICAL
                out.eventData = event.xid
                out.gpuInstanceId = (VALUE_NOT_AVAILABLE_UINT if event.gpu_instance_id is None
                                     else event.gpu_instance_id)
                out.computeInstanceId = (VALUE_NOT_AVAILABLE_UINT
                                         if event.compute_instance_id is None
                                         else event.compute_instance_id)
                return
            if any(state.gpus[i].lost or not state.gpus[i].enumerated
                   for i in evset.registrations):
                raise NvmlFailure(Return.ERROR_GPU_IS_LOST)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NvmlFailure(Return.ERROR_TIMEOUT)
            time.sleep(min(remaining, POLL_SECONDS))
