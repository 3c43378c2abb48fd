"""Small builders of valid objects for tests (plain dicts, as the API carries them)."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
DRIVER = "gpu.nvidia.com"


def node(name: str = "node-1", uid: str | None = None) -> Obj:
    meta: Obj = {"name": name}
    if uid:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def device(name: str, **extra: Any) -> Obj:
    return {"name": name,
            "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"},
                           "driverVersion": {"version": "580.65.6"},
                           "index": {"int": int(name.rsplit("-", 1)[-1]) if name[-1].isdigit()
                                     else 0}},
            "capacity": {"memory": {"value": "80Gi"}},
            **extra}


def resource_slice(name: str | None = "node-1-gpu", node_name: str = "node-1",
                   devices: list[Obj] | None = None, *, pool: str | None = None,
                   generation: int = 0, count: int = 1, owner_uid: str | None = None,
                   **spec: Any) -> Obj:
    meta: Obj = {"name": name} if name else {"generateName": f"{node_name}-{DRIVER}-"}
    if owner_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name,
                                    "uid": owner_uid, "controller": True}]
    body: Obj = {"driver": DRIVER, "nodeName": node_name,
                 "pool": {"name": pool or node_name, "generation": generation,
                          "resourceSliceCount": count}}
    if devices is not None:
        body["devices"] = devices
    body.update(spec)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta,
            "spec": body}


def counters_slice(name: str, node_name: str = "node-1", gpus: int = 1, **kw: Any) -> Obj:
    """The counters-only slice of a partitionable (dynamic MIG) pool."""
    sets = [{"name": f"gpu-{i}-counters",
             "counters": {"memory-slices": {"value": "8"}, "compute-slices": {"value": "7"},
                          "memory": {"value": "81920Mi"}}} for i in range(gpus)]
    obj = resource_slice(name, node_name, None, count=2, **kw)
    obj["spec"]["sharedCounters"] = sets
    return obj


def mig_device(name: str, gpu: int, memory_slices: int, compute_slices: int) -> Obj:
    return device(name, consumesCounters=[{
        "counterSet": f"gpu-{gpu}-counters",
        "counters": {"memory-slices": {"value": str(memory_slices)},
                     "compute-slices": {"value": str(compute_slices)},
                     "memory": {"value": f"{memory_slices * 10}Gi"}}}])


def claim(name: str = "claim-1", namespace: str = "default") -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression":
                                       'device.attributes["gpu.nvidia.com"].productName != ""'}}],
            }}]}}}


def allocation(device_name: str = "gpu-0", pool: str = "node-1") -> Obj:
    return {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": pool,
                                     "device": device_name}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [pool]}]}]}}
