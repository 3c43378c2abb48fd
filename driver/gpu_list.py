"""The GPU lists node flags take (``--shareable-gpus``, ``--dynamic-mig-gpus``): ``all``,
``none`` (or empty), or minors and UUIDs separated by commas."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuList:
    """``every``: the list said ``all``; else the minors and UUIDs it names."""

    every: bool = False
    minors: frozenset[int] = frozenset()
    uuids: frozenset[str] = frozenset()


def parse_gpu_list(text: str | None, flag: str, error: type[ValueError]) -> GpuList:
    """Parse ``text``; an item that is neither a minor nor a UUID raises ``error`` naming
    ``flag`` and the item."""
    value = (text or "").strip()
    if value.lower() in ("", "none"):
        return GpuList()
    if value.lower() == "all":
        return GpuList(every=True)
    minors: set[int] = set()
    uuids: set[str] = set()
    for raw in value.split(","):
        item = raw.strip()
        if item.isdigit():
            minors.add(int(item))
        elif item.startswith(("GPU-", "gpu-")) and len(item) > 4:
            uuids.add(item)
        else:
            raise error(
                f"{flag}: {item!r} is not a GPU minor number or a GPU UUID "
                "(expected all, none, or a comma-separated list such as 0,1,GPU-…)")
    return GpuList(minors=frozenset(minors), uuids=frozenset(uuids))
