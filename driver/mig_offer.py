"""Which GPUs offer MIG devices made on demand, of which profiles, placed how.

The admin's three knobs (``gpudra node`` / ``gpudra inventory`` flags, chart values), and
what each costs the scheduler (layout contract: ``gpudra.controller.slices``):

- ``gpus``: ``none`` (the daemon's default), ``all``, or minors / UUIDs. A GPU not offered
  publishes its full GPU only, so a node without offered GPUs publishes no counter set.
- ``profiles``: ``all`` or profile names (``1g.10gb,3g.40gb``): fewer devices per GPU.
- ``placements``:

  - ``all``: every (profile, placement) beside the full GPU, kept apart by the GPU's
    shared counter set (KEP-4815 partitionable devices). Exact, and any mix the hardware
    accepts is schedulable; but under the 1.36 allocator every node's Filter pays for
    every node that publishes a counter set.
  - ``disjoint``: one fixed set of placements that never overlap (filled greedily in the
    order ``profiles`` names them, smallest first for ``all``), created when a claim is
    prepared and destroyed after. No counters and no full GPU on that GPU: every subset of
    the set is a packing the hardware accepts, so the scheduler needs no rule to keep them
    apart, and nothing in them reaches other nodes' Filters.

And one safety knob, ``mode_change`` (``--allow-mig-mode-change``): a GPU before Hopper
(A100, A30: compute capability 8.0) cannot switch MIG mode without a GPU reset, which
NVIDIA's driver stopped doing for good reason (it kills whatever runs there, and a reset
that fails leaves the GPU unusable until a reboot). Such a GPU whose MIG mode is off offers
its full GPU only, unless the admin names it here; with MIG mode on (the admin switched
it), it offers its placements as any other GPU. Hopper and newer switch without a reset and
need no opt-in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from gpudra.driver.gpu_list import GpuList, parse_gpu_list
from gpudra.driver.mig import MigProfile, Placement, placement_order

Placements = Literal["all", "disjoint"]
NO_GPUS: Final = GpuList()
PLACEMENTS: Final[tuple[Placements, ...]] = ("all", "disjoint")


class MigOfferError(ValueError):
    """A ``--dynamic-mig-*`` value that names nothing this driver understands."""


@dataclass(frozen=True)
class MigOffer:
    """Which GPUs offer dynamic MIG devices, and which of them (see module docstring)."""

    every_gpu: bool = False
    minors: frozenset[int] = frozenset()
    uuids: frozenset[str] = frozenset()
    profiles: tuple[str, ...] | None = None
    """Profile names to publish, in the order given; None: every profile the GPU has."""
    placements: Placements = "all"
    mode_change: GpuList = NO_GPUS
    """GPUs whose MIG mode may be switched although that needs a GPU reset (see above)."""

    def covers(self, minor: int, uuid: str) -> bool:
        return self.every_gpu or minor in self.minors or uuid in self.uuids

    def mode_change_refused(self, minor: int, uuid: str, *, mig_on: bool,
                            architecture: int) -> bool:
        """Whether offering MIG on this GPU needs a MIG mode switch the node will not make:
        MIG mode off, a GPU that needs a reset to switch it, and no opt-in for it."""
        if mig_on or not needs_reset_to_switch(architecture):
            return False
        allowed = self.mode_change
        return not (allowed.every or minor in allowed.minors or uuid in allowed.uuids)

    def chosen_profiles(self, profiles: Sequence[MigProfile]) -> list[MigProfile]:
        """The GPU's profiles this offer publishes, in the GPU's order."""
        if self.profiles is None:
            return list(profiles)
        return [p for p in profiles if p.name in self.profiles]


EVERY: Final = MigOffer(every_gpu=True, mode_change=GpuList(every=True))
"""Every placement of every profile on every MIG-capable GPU, MIG mode switched wherever
needed: the exact layout (tests, tools). The daemon's flags never default to it."""
NOTHING: Final = MigOffer()
"""No GPU offers dynamic MIG: the daemon's default, whose cost does not grow with the cluster."""


def parse_profiles(text: str | None) -> tuple[str, ...] | None:
    """``all`` (or empty) | ``1g.10gb,3g.40gb``: names as ``gpudra inventory`` prints them."""
    value = (text or "").strip()
    if value.lower() in ("", "all"):
        return None
    names = [item.strip() for item in value.split(",")]
    for name in names:
        if not name or not name[0].isdigit() or "g." not in name:
            raise MigOfferError(f"--dynamic-mig-profiles: {name!r} is not a MIG profile name "
                                "(expected all, or a comma-separated list such as "
                                "1g.10gb,3g.40gb)")
    return tuple(dict.fromkeys(names))


def parse_placements(text: str | None) -> Placements:
    value = (text or "all").strip().lower()
    for known in PLACEMENTS:
        if value == known:
            return known
    raise MigOfferError(f"--dynamic-mig-placements: {text!r} is not one of "
                        f"{', '.join(PLACEMENTS)}")


HOPPER: Final = 9
"""``nvmlDeviceArchitecture_t`` of Hopper: from here on MIG mode switches without a reset."""


def needs_reset_to_switch(architecture: int) -> bool:
    """Ampere (A100, A30; compute capability 8.0) needs a GPU reset to switch MIG mode."""
    return architecture < HOPPER


def parse_offer(gpus: str | None, profiles: str | None, placements: str | None,
                mode_change: str | None = None) -> MigOffer:
    chosen = parse_gpu_list(gpus, "--dynamic-mig-gpus", MigOfferError)
    return MigOffer(every_gpu=chosen.every, minors=chosen.minors, uuids=chosen.uuids,
                    profiles=parse_profiles(profiles), placements=parse_placements(placements),
                    mode_change=parse_gpu_list(mode_change, "--allow-mig-mode-change",
                                               MigOfferError))


def profile_order(offer: MigOffer, profiles: Sequence[MigProfile]) -> list[MigProfile]:
    """The offered profiles, smallest first: the order devices are published in (the
    scheduler takes the first that fits, so small ones are tried first)."""
    return sorted(offer.chosen_profiles(profiles),
                  key=lambda p: (p.slice_count, p.memory_mib, p.index))


def disjoint_order(offer: MigOffer, profiles: Sequence[MigProfile]) -> list[MigProfile]:
    """The order ``disjoint`` fills a GPU in: as ``profiles`` names them, else smallest first."""
    ordered = profile_order(offer, profiles)
    if offer.profiles is None:
        return ordered
    rank = {name: i for i, name in enumerate(offer.profiles)}
    return sorted(ordered, key=lambda p: rank[p.name])


def disjoint_set(profiles: Iterable[MigProfile]) -> list[tuple[MigProfile, Placement]]:
    """Greedily, profile by profile in the order given, every placement that overlaps none
    taken so far and keeps the profile under its instance count (the rules NVML enforces)."""
    chosen: list[tuple[MigProfile, Placement]] = []
    for profile in profiles:
        taken = 0
        for placement in sorted(placement_order(profile), key=lambda p: p.start):
            if taken >= profile.instance_count:
                break
            if any(placement.overlaps(other) for _, other in chosen):
                continue
            chosen.append((profile, placement))
            taken += 1
    return chosen
