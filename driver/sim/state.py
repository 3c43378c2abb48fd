"""The simulated node's mutable state, kept on disk so every process sees the same GPUs.

One JSON file (``state.json``) per state directory, replaced atomically (temp file, fsync,
rename, directory fsync) under an ``fcntl.flock`` on ``state.lock``, so two processes never
interleave a read-modify-write. Readers take no lock: the rename makes every version of the
file complete. A reader re-parses only when the file's (inode, mtime, size) changed, so a
call that finds nothing new costs one ``stat``. Each write stamps the file with an mtime
strictly above the previous one, so two versions written within one clock tick (file times
come from a coarse clock) never share a key even if the inode number is reused.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpudra.driver import files

SCHEMA = 1
MAX_EVENTS = 1024
"""Oldest XID events are dropped beyond this; an event set that lags further misses them."""


@dataclass
class ComputeInstanceState:
    id: int
    profile_id: int
    start: int
    size: int
    serial: int
    """Creation counter value: tells a re-created CI with the same id from the old one."""
    uuid: str
    compute_mode: int = 0


@dataclass
class GpuInstanceState:
    id: int
    profile_id: int
    start: int
    size: int
    serial: int
    compute_instances: list[ComputeInstanceState] = field(default_factory=list)


@dataclass
class ProcessState:
    pid: int
    mig_uuid: str | None = None
    used_memory_mib: int = 0


@dataclass
class LoadState:
    """Simulated work on a GPU (``mig_uuid`` None) or on one MIG device, until ``until``
    (Unix seconds; None: until cleared)."""

    mig_uuid: str | None = None
    sm_percent: float = 0.0
    memory_bytes: int = 0
    until: float | None = None

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until


@dataclass
class GpuState:
    mig_current: int = 0
    mig_pending: int = 0
    compute_mode: int = 0
    lost: bool = False
    present: bool = True
    """False while the board is pulled out of its slot: NVML does not enumerate it."""
    board: int = 0
    """Which board sits in the slot: 0 is the profile's own, each replacement counts up
    (a new board has a new UUID)."""
    pci_driver: str | None = "nvidia"
    """The kernel driver bound to the GPU's PCI function (``gpudra.driver.sim.pci``): NVML
    enumerates only GPUs the ``nvidia`` driver holds, as on a real node."""
    gpu_instances: list[GpuInstanceState] = field(default_factory=list)
    processes: list[ProcessState] = field(default_factory=list)
    loads: list[LoadState] = field(default_factory=list)
    recovery_action: int | None = 0
    """``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (0: none needed); None: the driver does not
    offer the field (older drivers), so NVML answers NOT_SUPPORTED for it."""

    @property
    def enumerated(self) -> bool:
        """In its slot and driven by ``nvidia``: what NVML sees."""
        return self.present and self.pci_driver == "nvidia"

    def gpu_instance(self, gi_id: int) -> GpuInstanceState | None:
        return next((gi for gi in self.gpu_instances if gi.id == gi_id), None)

    def mig_device(self, uuid: str) -> tuple[GpuInstanceState, ComputeInstanceState] | None:
        for gi in self.gpu_instances:
            for ci in gi.compute_instances:
                if ci.uuid == uuid:
                    return gi, ci
        return None


@dataclass
class XidEvent:
    seq: int
    gpu: int
    xid: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass
class NodeState:
    profile: str
    gpus: list[GpuState]
    serial: int = 0
    """Last value handed out by :meth:`next_serial`."""
    next_event_seq: int = 0
    events: list[XidEvent] = field(default_factory=list)
    schema: int = SCHEMA

    def next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def add_event(self, event: XidEvent) -> None:
        self.events.append(event)
        del self.events[:-MAX_EVENTS]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeState:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"simulator state schema {data.get('schema')!r}, expected {SCHEMA}")
        gpus = []
        for g in data["gpus"]:
            gis = [
                GpuInstanceState(
                    **{k: v for k, v in gi.items() if k != "compute_instances"},
                    compute_instances=[ComputeInstanceState(**ci)
                                       for ci in gi["compute_instances"]],
                )
                for gi in g["gpu_instances"]
            ]
            gpus.append(GpuState(
                **{k: v for k, v in g.items()
                   if k not in ("gpu_instances", "processes", "loads")},
                gpu_instances=gis,
                processes=[ProcessState(**p) for p in g["processes"]],
                # Absent in state written before loads were modelled.
                loads=[LoadState(**load) for load in g.get("loads", [])],
            ))
        return cls(
            profile=data["profile"], gpus=gpus, serial=data["serial"],
            next_event_seq=data["next_event_seq"],
            events=[XidEvent(**e) for e in data["events"]],
        )


_StatKey = tuple[int, int, int]


def _stat_key(st: os.stat_result) -> _StatKey:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class StateStore:
    """Reads (cached) and updates (locked, atomic) the state file of one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / "state.json"
        self._lock_path = self.dir / "state.lock"
        self._cache_key: _StatKey | None = None
        self._cache: NodeState | None = None
        self._mutex = threading.Lock()  # flock does not exclude threads sharing a process

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> NodeState:
        """The current state; treat it as read-only (it is shared with other readers)."""
        key = _stat_key(self.path.stat())
        cached = self._cache
        if cached is not None and key == self._cache_key:
            return cached
        key, state = self._load()
        self._cache_key, self._cache = key, state
        return state

    def _load(self) -> tuple[_StatKey, NodeState]:
        # fstat the descriptor we read from: the path may be replaced in between.
        with self.path.open("rb") as f:
            key = _stat_key(os.fstat(f.fileno()))
            data = json.loads(f.read())
        return key, NodeState.from_json(data)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        files.make_dirs(self.dir, files.DIR_MODE)  # the simulated hardware: ours to change
        with self._mutex:
            fd = files.open_created(self._lock_path, os.O_RDWR, files.FILE_MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the flock

    @contextmanager
    def update(self) -> Iterator[NodeState]:
        """Yield a private copy of the state; write it back if the body changed it."""
        with self._locked():
            key, state = self._load()
            before = state.to_json()
            yield state
            if state.to_json() != before:
                self._write(state, after_mtime_ns=key[1])

    def seed(self, make: Callable[[], NodeState]) -> None:
        """Create the state file with ``make()`` unless it exists (first install on a dir)."""
        with self._locked():
            if not self.path.exists():
                self._write(make(), after_mtime_ns=0)

    def replace(self, make: Callable[[NodeState], NodeState]) -> None:
        """Write ``make(current)`` as the whole new state (the node's hardware changed)."""
        with self._locked():
            key, state = self._load()
            self._write(make(state), after_mtime_ns=key[1])

    def _write(self, state: NodeState, *, after_mtime_ns: int) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        payload = json.dumps(state.to_json(), indent=1, sort_keys=True).encode()
        with os.fdopen(files.open_created(tmp, os.O_WRONLY | os.O_TRUNC, 0o640), "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        stamp = max(time.time_ns(), after_mtime_ns + 1000)
        os.utime(tmp, ns=(stamp, stamp))
        tmp.replace(self.path)
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        # Re-stat rather than trust our copy: it becomes the cache only under the new key.
        self._cache_key, self._cache = _stat_key(self.path.stat()), state
