"""Preparing shares of a GPU (DRA consumable capacity): limits from the allocation, pure.

A share is an allocation result on a ``gpu-<minor>-shared`` device (published by
:mod:`gpudra.driver.gpu_shares`) with a ``shareID`` and ``consumedCapacity``. Its limits come
from ``consumedCapacity`` only; an opaque config whose numbers disagree is refused.

- **MPS** (the default): ONE control daemon per shared GPU (directory
  :func:`daemon_key`), started by the first share and stopped after the last. Each share's
  limits are MPS per-client limits, in its CDI device's environment:
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` = consumed ``memory`` and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = consumed ``multiprocessors`` / the GPU's x 100,
  rounded up. The daemon's defaults (``set_default_*``) are the largest share's, so a client
  that drops its environment still gets no more than any share on the GPU was allocated.
- **TimeSlicing** (``sharing.strategy: TimeSlicing``): the first share sets the GPU's time
  slice, the last one puts the baseline back.

Each share is recorded in its claim's ``restore["shares"][shareID]`` (:class:`ShareEntry`)
before anything changes, with the GPU's baseline (compute mode, time slice) copied from the
first share, so undo after an error, at unprepare or after a crash can tell whether it is
the last share of its GPU and what to put back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from gpudra.api.configs import TIME_SLICE_VALUES, ConfigError, GpuConfig
from gpudra.driver.checkpoint_model import Checkpoint, ClaimRecord
from gpudra.driver.claims import ClaimError, ClaimToPrepare
from gpudra.driver.devices import RequestPolicy
from gpudra.driver.gpu_shares import (
    MEMORY,
    MULTIPROCESSORS,
    SHARED_CAPACITIES,
    SHARES,
    thread_percentage,
)

MIB: Final = 1 << 20
DAEMON_PREFIX: Final = "shared-"
"""MPS directory of a shared GPU: ``<mps base>/shared-<GPU uuid>`` (claims use their uid)."""
Strategy = Literal["MPS", "TimeSlicing"]


@dataclass(frozen=True)
class ShareEntry:
    """One share as its claim record stores it (``restore["shares"][shareID]``)."""

    share_id: str
    gpu: str
    device: str
    strategy: Strategy
    memory_bytes: int
    multiprocessors: int
    shares: int
    thread_percentage: int
    interval: str = "Default"
    baseline_compute_mode: int | None = None
    """The GPU's compute mode before its first share (MPS); put back after the last."""

    @property
    def pinned_mib(self) -> int:
        return self.memory_bytes // MIB

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "device": self.device, "strategy": self.strategy,
                "memoryBytes": self.memory_bytes, "multiprocessors": self.multiprocessors,
                "shares": self.shares, "threadPercentage": self.thread_percentage,
                "interval": self.interval, "baselineComputeMode": self.baseline_compute_mode}

    @classmethod
    def from_json(cls, share_id: str, raw: Mapping[str, Any]) -> ShareEntry:
        strategy: Strategy = "TimeSlicing" if raw.get("strategy") == "TimeSlicing" else "MPS"
        baseline = raw.get("baselineComputeMode")
        return cls(share_id=share_id, gpu=str(raw["gpu"]), device=str(raw.get("device", "")),
                   strategy=strategy, memory_bytes=int(raw.get("memoryBytes", 0)),
                   multiprocessors=int(raw.get("multiprocessors", 0)),
                   shares=int(raw.get("shares", 0)),
                   thread_percentage=int(raw.get("threadPercentage", 100)),
                   interval=str(raw.get("interval", "Default")),
                   baseline_compute_mode=None if baseline is None else int(baseline))

    @property
    def time_slice(self) -> int:
        return TIME_SLICE_VALUES[self.interval]


def daemon_key(gpu_uuid: str) -> str:
    return f"{DAEMON_PREFIX}{gpu_uuid}"


def cdi_device_name(device: str, share_id: str | None) -> str:
    """``gpu-0-shared-<shareID>``: two shares of one GPU in one pod stay distinct."""
    return device if share_id is None else f"{device}-{share_id}"


# --- limits from the allocation ------------------------------------------------------------

def limits_for(  # noqa: PLR0917 - one share's facts, each a different kind
    claim: ClaimToPrepare, device: str, share_id: str | None, consumed: Mapping[str, int],
    capacity: Mapping[str, int], policies: Mapping[str, RequestPolicy], gpu: str,
    config: object,
) -> ShareEntry:
    """The share's limits, checked against the device's request policies and the config.

    Raises :class:`ClaimError` naming the claim and the field.
    """
    where = f"claim {claim.ref}: device {device!r}"
    if share_id is None:
        raise ClaimError(f"{where} is a shared device but the allocation result has no "
                         "shareID (status.allocation.devices.results[].shareID)")
    unknown = sorted(set(consumed) - set(SHARED_CAPACITIES))
    if unknown:
        raise ClaimError(f"{where}: consumedCapacity.{unknown[0]} is not a capacity of the "
                         f"shared device (it has {', '.join(SHARED_CAPACITIES)})")
    amounts = {}
    for name in SHARED_CAPACITIES:
        if name not in consumed:
            raise ClaimError(f"{where}: consumedCapacity.{name} is missing (every share "
                             "consumes all capacities of the shared device)")
        value, policy = consumed[name], policies.get(name)
        if policy is not None and not (
                policy.minimum <= value <= policy.maximum
                and (value - policy.minimum) % policy.step == 0):
            raise ClaimError(f"{where}: consumedCapacity.{name} {value} is outside the "
                             f"device's requestPolicy (validRange min {policy.minimum}, max "
                             f"{policy.maximum}, step {policy.step})")
        amounts[name] = value
    entry = ShareEntry(
        share_id=share_id, gpu=gpu, device=device, strategy="MPS",
        memory_bytes=amounts[MEMORY], multiprocessors=amounts[MULTIPROCESSORS],
        shares=amounts[SHARES],
        thread_percentage=thread_percentage(amounts[MULTIPROCESSORS],
                                            capacity.get(MULTIPROCESSORS, 0)))
    return _with_config(claim, entry, config)


def _with_config(claim: ClaimToPrepare, entry: ShareEntry, config: object) -> ShareEntry:
    """Apply the opaque config's strategy; refuse numbers that contradict the allocation."""
    where = f"claim {claim.ref}: device {entry.device!r} (share {entry.share_id})"
    if config is None:
        return entry
    if not isinstance(config, GpuConfig):
        raise ClaimError(f"{where}: a share takes a GpuConfig, not {type(config).__name__}")
    if config.compute_mode is not None:
        raise ClaimError(f"{where}: its config sets computeMode {config.compute_mode}; a "
                         "shared GPU's compute mode is the driver's (other claims use it too)")
    sharing = config.sharing
    if sharing is None or sharing.strategy == "MPS":
        mps = sharing.mps_config if sharing is not None else None
        if mps is None:
            return entry
        wanted = mps.default_active_thread_percentage
        if wanted is not None and wanted != entry.thread_percentage:
            raise ClaimError(
                f"{where}: sharing.mpsConfig.defaultActiveThreadPercentage {wanted} contradicts "
                f"the allocation: consumedCapacity.multiprocessors {entry.multiprocessors} is "
                f"{entry.thread_percentage}% of the GPU; drop it, the allocation sets it")
        try:
            pinned = mps.pinned_limits_mib([entry.gpu])
        except ConfigError as exc:
            raise ClaimError(f"{where}: {exc}") from exc
        for mib in pinned.values():
            if mib != entry.pinned_mib:
                raise ClaimError(
                    f"{where}: sharing.mpsConfig pinned device memory limit {mib}Mi "
                    f"contradicts the allocation: consumedCapacity.memory is "
                    f"{entry.pinned_mib}Mi; drop it, the allocation sets it")
        return entry
    interval = "Default"
    if sharing.time_slicing_config is not None:
        interval = sharing.time_slicing_config.interval
    return replace(entry, strategy="TimeSlicing", interval=interval)


# --- shares in the checkpoint --------------------------------------------------------------

def entries_of(record: ClaimRecord) -> list[ShareEntry]:
    return [ShareEntry.from_json(sid, raw)
            for sid, raw in record.restore.shares.items()]


def shared_gpus(cp: Checkpoint) -> dict[str, int]:
    """GPU UUID → how many prepared shares it holds, for the GPUs that hold any."""
    found: dict[str, int] = {}
    for record in cp.completed().values():
        for entry in entries_of(record):
            found[entry.gpu] = found.get(entry.gpu, 0) + 1
    return found


def shares_on_gpu(cp: Checkpoint, gpu: str, exclude_uid: str) -> list[ShareEntry]:
    """Shares of prepared claims on ``gpu`` (claims still being prepared are not counted:
    their rollback is reconcile's, under the same locks)."""
    return [e for r in cp.completed().values() if r.uid != exclude_uid
            for e in entries_of(r) if e.gpu == gpu]


def check_against_prepared(
    claim: ClaimToPrepare, entry: ShareEntry, cp: Checkpoint,
    capacity: Mapping[str, int], earlier: Iterable[ShareEntry] = (),
) -> None:
    """The node's last line of defence for shares: no share ID reused, one strategy (and
    time slice) per GPU, and the GPU's capacity never overcommitted."""
    where = f"claim {claim.ref}: device {entry.device!r} (share {entry.share_id})"
    for record in cp.claims.values():
        if record.uid != claim.uid and entry.share_id in record.restore.shares:
            raise ClaimError(f"{where}: share ID {entry.share_id} is already prepared for "
                             f"claim {record.ref}")
    others = [*shares_on_gpu(cp, entry.gpu, claim.uid), *earlier]
    for other in others:
        if other.strategy != entry.strategy:
            raise ClaimError(f"{where}: asks for {entry.strategy} but GPU {entry.gpu} already "
                             f"holds {other.strategy} shares; one GPU shares one way")
        if entry.strategy == "TimeSlicing" and other.interval != entry.interval:
            raise ClaimError(f"{where}: asks for time slice {entry.interval} but GPU "
                             f"{entry.gpu}'s shares run with {other.interval}")
    for name, field in ((MEMORY, "memory_bytes"), (MULTIPROCESSORS, "multiprocessors"),
                        (SHARES, "shares")):
        used = sum(getattr(o, field) for o in others) + getattr(entry, field)
        if name in capacity and used > capacity[name]:
            raise ClaimError(f"{where}: consumedCapacity.{name} would overcommit GPU "
                             f"{entry.gpu}: {used} of {capacity[name]} with the shares "
                             "already prepared")


# --- MPS ---------------------------------------------------------------------------------------

def mps_commands(gpu: str, entries: Iterable[ShareEntry]) -> list[str]:
    """The shared daemon's defaults: the largest share's limits (a ceiling for clients)."""
    mps = [e for e in entries if e.strategy == "MPS"]
    if not mps:
        return []
    return [f"set_default_active_thread_percentage {max(e.thread_percentage for e in mps)}",
            f"set_default_device_pinned_mem_limit {gpu} {max(e.pinned_mib for e in mps)}M"]


def client_env(entry: ShareEntry) -> tuple[str, ...]:
    """Per-client limits in the container (it sees one GPU: ordinal 0)."""
    return (f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={entry.pinned_mib}M",
            f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={entry.thread_percentage}")


def mps_gpus(cp: Checkpoint) -> dict[str, list[ShareEntry]]:
    """Shared GPUs that need an MPS daemon, with their prepared MPS shares."""
    found: dict[str, list[ShareEntry]] = {}
    for record in cp.completed().values():
        for entry in entries_of(record):
            if entry.strategy == "MPS":
                found.setdefault(entry.gpu, []).append(entry)
    return found
