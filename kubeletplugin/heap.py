"""Give the C heap's free memory back to the kernel after a burst of large allocations.

glibc keeps what ``free()`` returns inside its heaps (one per thread that allocated) unless
it lies at a heap's top, so a burst of ~30 KB buffers (publishing a dgx-h100's slices: each
slice's JSON, request and answer) leaves the daemon ~0.3 MiB larger for good (issue 14:
idle RSS). ``malloc_trim`` returns those pages; it takes ~0.1 ms. Elsewhere than glibc
(musl, macOS) there is no such call, and nothing is done.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Return the C heap's free pages to the kernel (glibc), or do nothing."""
    if _TRIM is not None:
        _TRIM(0)
