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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from gpudra.driver.gpu_list import parse_gpu_list
from gpudra.driver.mig import MigProfile, Placement, placement_order

Placements = Literal["all", "disjoint"]
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

    def covers(self, minor: int, uuid: str) -> bool:
        return self.every_gpu or minor in self.minors or uuid in self.uuids

    def chosen_profiles(self, profiles: Sequence[MigProfile]) -> list[MigProfile]:
        """The GPU's profiles this offer publishes, in the GPU's order."""
        if self.profiles is None:
            return list(profiles)
        return [p for p in profiles if p.name in self.profiles]


EVERY: Final = MigOffer(every_gpu=True)
"""Every placement of every profile on every MIG-capable GPU: the exact layout."""
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


def parse_offer(gpus: str | None, profiles: str | None, placements: str | None) -> MigOffer:
    chosen = parse_gpu_list(gpus, "--dynamic-mig-gpus", MigOfferError)
    return MigOffer(every_gpu=chosen.every, minors=chosen.minors, uuids=chosen.uuids,
                    profiles=parse_profiles(profiles), placements=parse_placements(placements))


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
