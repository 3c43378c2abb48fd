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


# A second claim for the batched calls: a MIG device on a GPU of its own.
PAIR_UID = "44444444-4444-4444-8444-444444444444"
PAIR_DEVICE = "gpu-3-mig-1g10gb-19-0"


def main() -> None:
    root, action, uid, *devices = sys.argv[1:]
    node = start_node(Path(root))
    if action == "prepare":
        node.state.prepare(crash_claim(uid, *devices))
    elif action == "prepare-plain":  # no config, no MIG: only the CDI spec is written
        node.state.prepare(claim(uid, *devices))
    elif action == "prepare-pair":  # two claims in one kubelet call
        results = node.state.prepare_many([crash_claim(uid, *devices),
                                           claim(PAIR_UID, PAIR_DEVICE)])
        assert all(isinstance(r, tuple) for r in results.values()), results
    elif action == "unprepare-pair":
        errors = node.state.unprepare_many([uid, PAIR_UID])
        assert errors == {uid: None, PAIR_UID: None}, errors
    else:
        node.state.unprepare(uid)
    node.close()


if __name__ == "__main__":
    main()
