"""Hand-written MIG profile tables (from the MIG User Guide tables and real -lgip output).

Kept independent of the simulator's data files so the MIG math is checked against a
second copy of the facts.
"""

from __future__ import annotations

from gpudra.driver.mig import MigProfile, Placement, profile_name

H100_TOTAL_MIB = 81559
A100_40_TOTAL_MIB = 40960
A30_TOTAL_MIB = 24576

ONE_SLICE = tuple(Placement(s, 1) for s in range(7))
DOUBLE = tuple(Placement(s, 2) for s in (0, 2, 4, 6))
TWO = tuple(Placement(s, 2) for s in (0, 2, 4))
THREE = (Placement(0, 4), Placement(4, 4))
FOUR = (Placement(0, 4),)
SEVEN = (Placement(0, 8),)


def _profile(total_mib: int, index: int, pid: int, g: int, count: int, mem: int,
             sm: int, ce: int, dec: int, jpeg: int, ofa: int,
             placements: tuple[Placement, ...]) -> MigProfile:
    return MigProfile(
        index=index, profile_id=pid, slice_count=g, instance_count=count, memory_mib=mem,
        multiprocessors=sm, copy_engines=ce, decoders=dec, encoders=0, jpeg_engines=jpeg,
        ofa_engines=ofa, placements=placements,
        name=profile_name(index=index, slice_count=g, memory_mib=mem,
                          device_total_bytes=total_mib << 20),
    )


def h100() -> list[MigProfile]:
    t = H100_TOTAL_MIB
    return [
        _profile(t, 0, 19, 1, 7, 9984, 16, 1, 1, 1, 0, ONE_SLICE),
        _profile(t, 7, 20, 1, 1, 9984, 16, 1, 1, 1, 1, ONE_SLICE),
        _profile(t, 9, 15, 1, 4, 20096, 26, 1, 1, 1, 0, DOUBLE),
        _profile(t, 1, 14, 2, 3, 20096, 32, 2, 2, 2, 0, TWO),
        _profile(t, 2, 9, 3, 2, 40448, 60, 3, 3, 3, 0, THREE),
        _profile(t, 3, 5, 4, 1, 40448, 64, 4, 4, 4, 0, FOUR),
        _profile(t, 4, 0, 7, 1, 81152, 132, 8, 7, 7, 1, SEVEN),
    ]


def a100_40() -> list[MigProfile]:
    t = A100_40_TOTAL_MIB
    return [
        _profile(t, 0, 19, 1, 7, 4864, 14, 1, 0, 0, 0, ONE_SLICE),
        _profile(t, 7, 20, 1, 1, 4864, 14, 1, 1, 1, 1, ONE_SLICE),
        _profile(t, 9, 15, 1, 4, 9856, 14, 1, 1, 0, 0, DOUBLE),
        _profile(t, 1, 14, 2, 3, 9856, 28, 2, 1, 0, 0, TWO),
        _profile(t, 2, 9, 3, 2, 19968, 42, 3, 2, 0, 0, THREE),
        _profile(t, 3, 5, 4, 1, 19968, 56, 4, 2, 0, 0, FOUR),
        _profile(t, 4, 0, 7, 1, 40192, 98, 7, 5, 1, 1, SEVEN),
    ]


def a30() -> list[MigProfile]:
    t = A30_TOTAL_MIB
    quarter = tuple(Placement(s, 1) for s in range(4))
    half = (Placement(0, 2), Placement(2, 2))
    return [
        _profile(t, 0, 14, 1, 4, 5952, 14, 1, 1, 0, 0, quarter),
        _profile(t, 7, 21, 1, 1, 5952, 14, 1, 1, 1, 1, quarter),
        _profile(t, 1, 5, 2, 2, 11968, 28, 2, 2, 0, 0, half),
        _profile(t, 8, 6, 2, 1, 11968, 28, 2, 2, 1, 1, half),
        _profile(t, 4, 0, 4, 1, 24192, 56, 4, 4, 1, 1, (Placement(0, 4),)),
    ]
