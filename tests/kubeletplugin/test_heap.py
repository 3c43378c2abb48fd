"""Giving the C heap's free memory back to the kernel (issue 14: idle RSS)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from gpudra.kubeletplugin.heap import release_free_memory


def resident_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_blocks_between_live_ones_are_given_back():
    # ~30 KB blocks, as publishing a slice makes: malloc's, not pymalloc's (512 bytes max).
    # Every other one stays alive, so the freed ones cannot merge into the heap's top,
    # which is all glibc gives back by itself.
    blocks = [bytearray(30_000) for _ in range(400)]
    del blocks[::2]
    before = resident_kib()
    release_free_memory()
    assert before - resident_kib() > 2048  # 200 freed blocks: ~5 MiB
    assert len(blocks) == 200


def test_it_can_be_called_at_any_time():
    release_free_memory()
    release_free_memory()
