"""What speaking an older resource.k8s.io version costs (#30 item 3).

    python -m bench.api_versions

Per stand-in mode (v1 = 1.34+, v1beta2 = 1.33, v1beta1 = 1.32): the median of a claim GET
through ``RawApi`` (the read on the prepare path, converted to v1's shape on the older
versions), and in-process the conversion alone of that claim and of an 8-GPU pool's slices.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from gpudra.kube.raw_api import RESOURCE_CLAIMS, RawApi
from gpudra.kube.resource_versions import ResourceApi
from gpudra.kube.session import ApiSession
from gpudra.testing.fakeapi import FakeApiServer, samples

ROUNDS = 400


def _claim() -> dict[str, Any]:
    claim = samples.claim()
    claim["status"] = {"allocation": samples.allocation()}
    return claim


async def _gets(mode: str) -> float:
    with FakeApiServer(resource_api=mode) as api:
        api.put(_claim())
        async with ApiSession.for_url(api.url, resource_api="auto") as session:
            raw = RawApi(session)
            await raw.get(RESOURCE_CLAIMS, "claim-1", namespace="default")  # discovery
            took = []
            for _ in range(ROUNDS):
                start = time.perf_counter()
                await raw.get(RESOURCE_CLAIMS, "claim-1", namespace="default")
                took.append(time.perf_counter() - start)
    return statistics.median(took)


def _convert(version: str, plural: str, obj: dict[str, Any]) -> float:
    api = ResourceApi(version)
    sent = api.outgoing(plural, obj)
    took = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        api.incoming(plural, sent)
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def main() -> None:
    pool = [samples.resource_slice(f"node-1-gpu-{i}", devices=[samples.device(f"gpu-{i}")])
            for i in range(8)]
    print("| mode | claim GET, median µs | claim conversion µs | 8-GPU pool conversion µs |")
    print("|---|---|---|---|")
    for mode in ("v1", "v1beta2", "v1beta1"):
        get = asyncio.run(_gets(mode))
        claim = _convert(mode, "resourceclaims", _claim())
        slices = sum(_convert(mode, "resourceslices", s) for s in pool)
        print(f"| {mode} | {get * 1e6:.0f} | {claim * 1e6:.1f} | {slices * 1e6:.1f} |")


if __name__ == "__main__":
    main()
