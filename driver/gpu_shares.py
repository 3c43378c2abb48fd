"""Fractional GPUs: the shared device published per shareable GPU (DRA consumable capacity).

What is published (the contract the prepare side reads; README "Fractional GPUs"):

- For every shareable full GPU ``gpu-<minor>``, one more device ``gpu-<minor>-shared`` with
  ``allowMultipleAllocations: true``. Its attributes are the full GPU's (same ``uuid``,
  ``productName`` …) except ``type: "gpu-share"``; the DeviceClass ``gpu-share.nvidia.com``
  selects it (``gpu.nvidia.com`` keeps selecting whole GPUs only, so a claim written for
  NVIDIA's driver never silently gets a share).
- Capacities, each with a ``requestPolicy`` ``validRange`` (the scheduler rounds a request up
  to ``min + n*step``; a request that names no amount consumes ``default``):

  ==================  ===================  =====  ======  ======================  =========
  capacity            value                min    step    max                     default
  ==================  ===================  =====  ======  ======================  =========
  ``memory``          the GPU's memory     1Gi    1Gi     whole GiB of memory     1/8 (GiB)
  ``multiprocessors`` the GPU's SM count   1      1       SM count                1/8
  ``shares``          ``SHARES_PER_GPU``   1      1       ``SHARES_PER_GPU``      1
  ==================  ===================  =====  ======  ======================  =========

  Every allocation consumes all three (named or default), so the defaults let eight
  default-sized shares onto one GPU and ``shares`` caps the number of allocations.
  One eighth is the GPU's own granularity (a ``1g`` MIG slice is an eighth of its memory).
- An allocation result carries ``shareID`` and ``consumedCapacity``; the prepare side sets
  MPS limits from ``consumedCapacity`` only: pinned device memory = ``memory``, active
  thread percentage = :func:`thread_percentage` of ``multiprocessors``. Time-slicing shares
  use ``shares`` (the device plugin's ``replicas``).

Why full GPU, MIG and shares never overlap (KEP-4815 counters + KEP-5075):

- Every shareable GPU has a counter set: the dynamic-MIG one (``gpu-<minor>-counter-set``),
  or for a GPU without dynamic MIG a one-counter set ``{gpu: 1}`` under the same name.
  The full GPU consumes all of it, each MIG placement a part, the shared device all of it.
- A multi-allocatable device's ``consumesCounters`` count while the device has any
  allocation, ONCE, not once per share: KEP-5075 tracks shares by ``consumedCapacity`` and
  the device as allocated (``IsDeviceAllocated``: exclusive, shared-ID or consumed-capacity
  state; upstream fix kubernetes#139040). Hence: the first share takes the whole GPU's
  counters, so no full GPU and no MIG placement fits while any share exists; a full GPU or
  any MIG placement holds some counters, so the first share does not fit; and further
  shares of the same device only need capacity. A per-allocation reading could not work at
  all: with linear counters, two groups that each coexist many times cannot exclude each
  other (7 MIGs and N shares fitting means one MIG plus one share fits too).
- Caveat, upstream: schedulers before #139040 did not count shared allocations in counters
  at all (a MIG could be placed beside shares across scheduling cycles), and the in-flight
  path of some versions charges a second share of one device in the same cycle again
  (refusing it: safe). The node refuses to prepare an overlap whatever the scheduler did.
  ``gpudra.scheduling.allocator`` implements the once-per-device rule and
  ``tests/scheduling/test_shares.py`` proves, exhaustively over sequences of full-GPU, MIG
  and share allocations on one GPU, that whatever it accepts is physically possible.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from gpudra.driver.devices import CounterConsumption, CounterSet, Device, RequestPolicy
from gpudra.driver.gpu_list import parse_gpu_list
from gpudra.driver.mig import counter_set_name

SHARED_TYPE: Final = "gpu-share"
SHARE_CLASS: Final = "gpu-share.nvidia.com"
"""The DeviceClass that selects shared devices (``type == "gpu-share"``)."""
SHARED_SUFFIX: Final = "-shared"
MEMORY: Final = "memory"
MULTIPROCESSORS: Final = "multiprocessors"
SHARES: Final = "shares"
SHARED_CAPACITIES: Final = (MEMORY, MULTIPROCESSORS, SHARES)
SHARES_PER_GPU: Final = 16
"""Most allocations one shared GPU takes (``shares`` capacity value)."""
DEFAULT_FRACTION: Final = 8
"""A request that names no amount gets 1/8 of the GPU's memory and multiprocessors."""
GIB: Final = 1 << 30
PLAIN_COUNTER: Final = "gpu"
"""The one counter of a shareable GPU without dynamic MIG: full GPU and shares both take it."""
_NAME_RE: Final = re.compile(r"gpu-(\d+)-shared")


def shared_device_name(minor: int) -> str:
    return f"gpu-{minor}{SHARED_SUFFIX}"


def shared_device_minor(name: str) -> int | None:
    """``gpu-3-shared`` → 3; None for any other device name."""
    match = _NAME_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def thread_percentage(multiprocessors: int, total: int) -> int:
    """MPS ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for a share of ``multiprocessors`` SMs:
    rounded up, so a share never gets fewer SMs than the scheduler counted for it."""
    if total <= 0:
        return 100
    return max(1, min(100, math.ceil(100 * multiprocessors / total)))


class ShareableError(ValueError):
    """``--shareable-gpus`` is not ``all``, ``none`` or a list of minors / UUIDs."""


@dataclass(frozen=True)
class ShareableGpus:
    """Which GPUs publish a shared device: ``all``, ``none`` or listed minors / UUIDs."""

    everything: bool = False
    minors: frozenset[int] = frozenset()
    uuids: frozenset[str] = frozenset()

    def covers(self, minor: int, uuid: str) -> bool:
        return self.everything or minor in self.minors or uuid in self.uuids

    @property
    def any(self) -> bool:
        return self.everything or bool(self.minors or self.uuids)


NONE: Final = ShareableGpus()
ALL: Final = ShareableGpus(everything=True)


def keeping(shareable: ShareableGpus, in_use: Iterable[str]) -> ShareableGpus:
    """``shareable`` plus the GPUs (UUIDs) that hold prepared shares.

    A shared device must stay published while shares of it are prepared, whatever
    ``--shareable-gpus`` now says: the scheduler counts a live share's counters only
    through the device it was allocated from, so withdrawing the device would let it place
    a whole GPU or a MIG device over running shares (the node would refuse that prepare, and
    the pod would retry forever).
    """
    if shareable.everything:
        return shareable
    return ShareableGpus(minors=shareable.minors, uuids=shareable.uuids | frozenset(in_use))


def parse_shareable(text: str | None) -> ShareableGpus:
    """``all`` | ``none`` | ``0,2,GPU-…``; empty means none."""
    gpus = parse_gpu_list(text, "--shareable-gpus", ShareableError)
    if gpus.every:
        return ALL
    if not (gpus.minors or gpus.uuids):
        return NONE
    return ShareableGpus(minors=gpus.minors, uuids=gpus.uuids)


def policies(memory_bytes: int, multiprocessors: int) -> dict[str, RequestPolicy]:
    """The three request policies of one GPU's shared device (table in the module doc)."""
    whole_gib = memory_bytes // GIB
    memory_default = max(1, whole_gib // DEFAULT_FRACTION) * GIB
    return {
        MEMORY: RequestPolicy(default=memory_default, minimum=GIB, step=GIB,
                              maximum=whole_gib * GIB),
        MULTIPROCESSORS: RequestPolicy(default=max(1, multiprocessors // DEFAULT_FRACTION),
                                       minimum=1, step=1, maximum=multiprocessors),
        SHARES: RequestPolicy(default=1, minimum=1, step=1, maximum=SHARES_PER_GPU),
    }


def can_share(memory_bytes: int, multiprocessors: int) -> bool:
    """The policies need room for ``min + step`` of each capacity (apiserver rule)."""
    return memory_bytes >= 2 * GIB and multiprocessors >= 2


def plain_counter_set(minor: int) -> CounterSet:
    """The counter set of a shareable GPU without dynamic MIG."""
    return CounterSet(counter_set_name(minor), {PLAIN_COUNTER: 1})


def whole_gpu(counter_set: CounterSet) -> tuple[CounterConsumption, ...]:
    """Everything of the GPU's counter set: what the full GPU and the shared device take."""
    return (CounterConsumption(counter_set.name, dict(counter_set.counters)),)


def shared_device(full: Device, minor: int, memory_bytes: int, multiprocessors: int,
                  counter_set: CounterSet) -> Device:
    """The shared twin of a full GPU device (same attributes but ``type``)."""
    attributes = dict(full.attributes)
    attributes["type"] = SHARED_TYPE
    return Device(
        name=shared_device_name(minor),
        group=full.group,
        attributes=attributes,
        capacity={MEMORY: memory_bytes, MULTIPROCESSORS: multiprocessors,
                  SHARES: SHARES_PER_GPU},
        consumes_counters=whole_gpu(counter_set),
        taints=full.taints,
        allow_multiple_allocations=True,
        request_policies=policies(memory_bytes, multiprocessors),
    )


def shared_names(devices: Iterable[Device]) -> list[str]:
    return [d.name for d in devices if d.allow_multiple_allocations]
