"""Run one prepare or unprepare in a separate process (which a crash point may kill)."""

from __future__ import annotations

import sys
from pathlib import Path

from gpudra.driver.claims import OpaqueConfig
from tests.driver.node_fixture import claim, start_node

GV = "resource.nvidia.com/v1beta1"
# Settings that must be undone too: MPS on the MIG slice, exclusive mode on the full GPU.
CONFIGS = (
    OpaqueConfig(requests=("mig",), parameters={
        "apiVersion": GV, "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30}}}),
    OpaqueConfig(requests=("gpu",), parameters={
        "apiVersion": GV, "kind": "GpuConfig", "computeMode": "ExclusiveProcess"}),
)


def crash_claim(uid: str, *devices: str):
    base = claim(uid, *devices, configs=CONFIGS)
    allocated = tuple(
        type(d)(request="gpu" if d.device.count("-") == 1 else "mig", pool=d.pool,
                device=d.device)
        for d in base.devices)
    return type(base)(uid=base.uid, namespace=base.namespace, name=base.name,
                      devices=allocated, configs=CONFIGS)


def main() -> None:
    root, action, uid, *devices = sys.argv[1:]
    node = start_node(Path(root))
    if action == "prepare":
        node.state.prepare(crash_claim(uid, *devices))
    elif action == "prepare-plain":  # no config, no MIG: only the CDI spec is written
        node.state.prepare(claim(uid, *devices))
    else:
        node.state.unprepare(uid)
    node.close()


if __name__ == "__main__":
    main()
