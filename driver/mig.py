"""MIG math, pure: profile names, DRA device names, placements and shared counters.

Nothing here touches NVML; the inventory feeds it profile data and the device model uses
the results. Keeping it pure lets the tests check every (profile, placement) of every GPU
model against the real placement tables.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30

# NVML GPU-instance profile *indexes* (argument of nvmlDeviceGetGpuInstanceProfileInfo),
# which decide the name suffix; the profile *id* is product-specific and says nothing.
PROFILE_INDEX_1_SLICE_REV1 = 7
PROFILE_INDEX_2_SLICE_REV1 = 8
PROFILE_INDEX_1_SLICE_REV2 = 9
_SUFFIX_BY_INDEX = {
    PROFILE_INDEX_1_SLICE_REV1: "+me",
    PROFILE_INDEX_2_SLICE_REV1: "+me",
    10: "+gfx",
    11: "+gfx",
    12: "+gfx",
    13: "-me",
    14: "-me",
    15: "+me.all",
    16: "+me.all",
    17: "+gfx",
}

# Shared-counter names (DNS labels) for the per-GPU counter set of dynamic MIG.
COUNTER_NAMES = (
    "multiprocessors",
    "copy-engines",
    "decoders",
    "encoders",
    "jpeg-engines",
    "ofa-engines",
    "memory",
)
# Capacity names (C identifiers) published on MIG devices, as NVIDIA's driver does.
CAPACITY_NAMES = (
    "multiprocessors",
    "copyEngines",
    "decoders",
    "encoders",
    "jpegEngines",
    "ofaEngines",
    "memory",
)


@dataclass(frozen=True, order=True)
class Placement:
    """First memory slice and number of memory slices of a GPU instance."""

    start: int
    size: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one GPU model, as NVML reports it."""

    index: int
    """NVML profile index (``NVML_GPU_INSTANCE_PROFILE_*``)."""
    profile_id: int
    """NVML profile id, what create calls take and ``nvidia-smi`` prints."""
    slice_count: int
    """Compute (GPU) slices: the ``<N>g`` of the name."""
    instance_count: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[Placement, ...]
    name: str
    """Canonical name such as ``1g.10gb`` or ``1g.10gb+me``."""

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    def amounts(self) -> dict[str, int]:
        """Per-dimension amounts keyed by shared-counter name."""
        return {
            "multiprocessors": self.multiprocessors,
            "copy-engines": self.copy_engines,
            "decoders": self.decoders,
            "encoders": self.encoders,
            "jpeg-engines": self.jpeg_engines,
            "ofa-engines": self.ofa_engines,
            "memory": self.memory_bytes,
        }

    def capacities(self) -> dict[str, int]:
        """Per-dimension amounts keyed by published capacity name."""
        amounts = self.amounts()
        return dict(zip(CAPACITY_NAMES, (amounts[name] for name in COUNTER_NAMES), strict=True))


def memory_size_gb(memory_mib: int, device_total_bytes: int) -> int:
    """Rounded GB in a profile name, by the rule NVIDIA's tools use (go-nvlib).

    The profile's share of the device memory is rounded up to eighths, then scaled by the
    device memory in whole GiB (rounded up): 9856 MiB of 40960 MiB gives ``10``.
    """
    fraction = (memory_mib * MIB) / device_total_bytes
    fraction = math.ceil(fraction * 8) / 8
    total_gb = -(-device_total_bytes // GIB)
    # Go's math.Round: halves away from zero (Python's round() would give 70 for 70.5).
    return math.floor(fraction * total_gb + 0.5)


def profile_name(*, index: int, slice_count: int, memory_mib: int, device_total_bytes: int) -> str:
    """Canonical GPU-instance profile name, e.g. ``3g.40gb`` or ``1g.10gb+me``."""
    gb = memory_size_gb(memory_mib, device_total_bytes)
    return f"{slice_count}g.{gb}gb{_SUFFIX_BY_INDEX.get(index, '')}"


_NON_LABEL = re.compile(r"[^a-z0-9-]")


def device_name(parent_minor: int, profile: MigProfile, placement: Placement) -> str:
    """DRA device name of a MIG device: ``gpu-<minor>-mig-<profile>-<profileId>-<start>``.

    The same form as NVIDIA's driver, so the name alone identifies the physical
    configuration (parent, profile, placement) and orphans can be found from it.
    """
    label = _NON_LABEL.sub("", profile.name.lower().replace("+", "-").replace(".", ""))
    return f"gpu-{parent_minor}-mig-{label}-{profile.profile_id}-{placement.start}"


_DEVICE_NAME_RE = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")


@dataclass(frozen=True)
class MigDeviceRef:
    """What a MIG device name encodes."""

    parent_minor: int
    profile_id: int
    start: int


def parse_device_name(name: str) -> MigDeviceRef | None:
    """Inverse of :func:`device_name`; ``None`` for names that are not MIG devices."""
    match = _DEVICE_NAME_RE.match(name)
    if match is None:
        return None
    return MigDeviceRef(int(match[1]), int(match[3]), int(match[4]))


def counter_set_name(parent_minor: int) -> str:
    return f"gpu-{parent_minor}-counter-set"


def memory_slice_count(profiles: Sequence[MigProfile]) -> int:
    """Number of memory slices: the end of the furthest placement of any profile."""
    return max((p.start + p.size for prof in profiles for p in prof.placements), default=0)


def _capped_profiles(profiles: Sequence[MigProfile]) -> list[MigProfile]:
    """Profiles whose instance cap is tighter than what their placements alone allow."""
    return [p for p in profiles if p.instance_count < len(p.placements)]


def instance_counter_name(profile: MigProfile) -> str:
    return f"profile-{profile.profile_id}-instances"


def packings(profiles: Sequence[MigProfile]) -> Iterator[tuple[tuple[MigProfile, Placement], ...]]:
    """Every set of GPU instances the hardware accepts at once (non-empty, maximal or not).

    A set is valid when no two placements share a memory slice and no profile exceeds its
    instance count: the rules NVML enforces when creating GPU instances.
    """
    options = sorted(
        ((prof, pl) for prof in profiles for pl in prof.placements),
        key=lambda item: (item[1].start, item[1].size, item[0].profile_id),
    )

    def extend(
        start_at: int, chosen: tuple[tuple[MigProfile, Placement], ...]
    ) -> Iterator[tuple[tuple[MigProfile, Placement], ...]]:
        for i in range(start_at, len(options)):
            prof, pl = options[i]
            if any(pl.overlaps(other) for _, other in chosen):
                continue
            if sum(1 for p, _ in chosen if p is prof) >= prof.instance_count:
                continue
            new = (*chosen, (prof, pl))
            yield new
            yield from extend(i + 1, new)

    yield from extend(0, ())


@dataclass(frozen=True)
class GpuCounters:
    """The shared counter set of one partitionable GPU and what each device consumes."""

    name: str
    counters: Mapping[str, int]

    def full_gpu_consumption(self) -> dict[str, int]:
        """The full GPU takes everything, so it excludes (and is excluded by) any partition."""
        return dict(self.counters)


def gpu_counters(parent_minor: int, profiles: Sequence[MigProfile]) -> GpuCounters:
    """Counter values for one GPU.

    - ``memory-slice-<i>`` = 1 each: placements that share a slice exclude each other.
    - ``profile-<id>-instances``: only for profiles capped below their placement count
      (``+me``: one at a time).
    - capacity counters (SMs, engines, memory): the largest sum any valid packing reaches,
      so they never refuse a combination the hardware accepts; they let a claim's counters
      show what the partition takes.
    """
    return GpuCounters(counter_set_name(parent_minor), dict(_counter_values(tuple(profiles))))


@functools.cache
def _counter_values(profiles: tuple[MigProfile, ...]) -> tuple[tuple[str, int], ...]:
    # Every GPU of a model has the same profiles, so this runs once per model.
    vectors = {id(p): [p.amounts()[name] for name in COUNTER_NAMES] for p in profiles}
    maxima = [0] * len(COUNTER_NAMES)
    for packing in packings(profiles):
        for i in range(len(COUNTER_NAMES)):
            total = sum(vectors[id(prof)][i] for prof, _ in packing)
            maxima[i] = max(maxima[i], total)
    counters: dict[str, int] = dict(zip(COUNTER_NAMES, maxima, strict=True))
    for i in range(memory_slice_count(profiles)):
        counters[f"memory-slice-{i}"] = 1
    for prof in _capped_profiles(profiles):
        counters[instance_counter_name(prof)] = prof.instance_count
    return tuple(counters.items())


def consumption(profile: MigProfile, placement: Placement, counters: GpuCounters) -> dict[str, int]:
    """What one (profile, placement) device consumes from its GPU's counter set."""
    used = {name: amount for name, amount in profile.amounts().items() if amount > 0}
    for i in placement.slices:
        used[f"memory-slice-{i}"] = 1
    instances = instance_counter_name(profile)
    if instances in counters.counters:
        used[instances] = 1
    return used


def placement_order(profile: MigProfile) -> list[Placement]:
    """Placements in the order to publish them: highest start first.

    The scheduler takes the first free device in slice order, so small partitions fill a
    GPU from the top and leave the low slices contiguous for 3g/4g/7g profiles (the
    fragmentation NVIDIA's users hit, issue #933 upstream).
    """
    return sorted(profile.placements, key=lambda p: (-p.start, p.size))


def fits(requests: Iterable[tuple[MigProfile, Placement]], counters: GpuCounters) -> bool:
    """Whether these devices can be allocated together under the counter set."""
    left = dict(counters.counters)
    for prof, pl in requests:
        for name, amount in consumption(prof, pl, counters).items():
            left[name] -= amount
            if left[name] < 0:
                return False
    return True
