"""One node's ``Allocate`` (the real 1.36 scheduler's Filter) as the cluster grows, per layout.

    python -m bench.scheduler_scale [--nodes 1,10,100,1000] [--runs 3] [--repeat 5]
                                    [--layouts a,b] [--counter-nodes-max 100]
    python -m bench.scheduler_scale --properties --nodes 10,100 [--runs 3] [--repeat 20]

N simulated DGX H100 nodes publish the slices of one layout (what ``gpudra node`` with the
layout's flags publishes); ``dra-allocate`` (``../shared/tools/dra-allocate/dra-allocate``
or ``$DRA_ALLOCATE``; skipped with the reason when absent) times node-0's ``Allocate`` for
one claim at a time: a full GPU, a 1g MIG device, a share (16Gi, 33 SMs), two MIG devices
on one GPU (a 1g and any other). On an
empty cluster, and on one where every node holds an allocated claim on half of it (the
odd-numbered GPUs whole where they are published whole, else half of each GPU's MIG
devices, and a share on each shareable GPU left). Each cell: median of ``--repeat``
calls, per run; ``-`` = the layout does not offer that kind (unschedulable, as the
scheduler answers).

Layouts whose every node publishes a counter set cost O(N) per Filter (see
``gpudra.controller.slices``); they stop at ``--counter-nodes-max`` nodes (their files
alone reach 250 MB at 1,000 nodes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DRIVER = "gpu.nvidia.com"
CLASSES = sorted((ROOT / "deploy" / "deviceclasses").glob("*.yaml"))


def dra_allocate() -> tuple[str | None, str]:
    """The binary, or None and why not."""
    given = os.environ.get("DRA_ALLOCATE")
    path = Path(given) if given else ROOT.parent / "shared" / "tools" / "dra-allocate" / \
        "dra-allocate"
    if path.is_file() and os.access(path, os.X_OK):
        return str(path), ""
    return None, (f"dra-allocate not found at {path} (build it, or set $DRA_ALLOCATE to the "
                  "binary)")


@dataclass(frozen=True)
class Layout:
    name: str
    flags: str
    """What the node daemon is given (documentation, and the options below)."""
    gpus: str = "none"
    profiles: str = "all"
    placements: str = "all"
    shareable: str = "none"


LAYOUTS = (
    Layout("full-gpu", "--feature-gates DynamicMIG=false"),
    Layout("default", "(no flags)"),
    Layout("dynamic-all", "--dynamic-mig-gpus all", gpus="all"),
    Layout("dynamic-gpu0-small", "--dynamic-mig-gpus 0 --dynamic-mig-profiles "
           "1g.10gb,2g.20gb", gpus="0", profiles="1g.10gb,2g.20gb"),
    Layout("shares-all", "--shareable-gpus all", shareable="all"),
    Layout("disjoint-1g-all", "--dynamic-mig-gpus all --dynamic-mig-placements disjoint "
           "--dynamic-mig-profiles 1g.10gb", gpus="all", profiles="1g.10gb",
           placements="disjoint"),
    Layout("disjoint-gpu0-1", "--dynamic-mig-gpus 0,1 --dynamic-mig-placements disjoint "
           "--dynamic-mig-profiles 2g.20gb,1g.10gb", gpus="0,1", profiles="2g.20gb,1g.10gb",
           placements="disjoint"),
)


def node_slices(layout: Layout, node: str) -> list[dict[str, Any]]:
    """One simulated DGX H100's slices under the layout, as ``gpudra inventory -o json``."""
    from gpudra.controller.slices import build_slices
    from gpudra.driver import sim
    from gpudra.driver.device_model import ModelOptions, build_devices
    from gpudra.driver.gpu_shares import parse_shareable
    from gpudra.driver.inventory import read_inventory, simulated_pcie_root
    from gpudra.driver.mig_offer import parse_offer
    from gpudra.driver.nvml import open_nvml

    with tempfile.TemporaryDirectory(prefix="gpudra-bench-sim-") as state:
        nvml = open_nvml(simulate="dgx-h100", sim_state=Path(state))
        try:
            inventory = read_inventory(nvml, pcie_root=simulated_pcie_root)
        finally:
            nvml.shutdown()
            sim.uninstall()
    options = ModelOptions(dynamic_mig=layout.name != "full-gpu",
                           mig=parse_offer(layout.gpus, layout.profiles, layout.placements),
                           shareable=parse_shareable(layout.shareable))
    built = build_slices(build_devices(inventory, options), driver=DRIVER, node_name=node)
    return json.loads(json.dumps(built))  # plain JSON: no shared leaves


def renamed(slices: Sequence[dict[str, Any]], old: str, new: str) -> Iterator[dict[str, Any]]:
    for obj in slices:
        spec = dict(obj["spec"], nodeName=new, pool=dict(obj["spec"]["pool"], name=new))
        name = obj["metadata"]["name"]
        yield {**obj, "metadata": {**obj["metadata"], "name": new + name[len(old):]},
               "spec": spec}


def half_allocation(slices: Sequence[dict[str, Any]], node: str) -> dict[str, Any] | None:
    """One allocated claim holding half of the node (module docstring)."""
    results = []
    for obj in slices:
        devices = obj["spec"].get("devices", [])
        whole = [d["name"] for d in devices if d["attributes"]["type"]["string"] == "gpu"]
        migs = [d["name"] for d in devices if d["attributes"]["type"]["string"] == "mig"]
        shared = [d for d in devices if d.get("allowMultipleAllocations")]
        gpu = obj["metadata"]["name"].rsplit("-", 1)[-1]
        taken = whole and gpu.isdigit() and int(gpu) % 2 == 1
        if taken:
            results.append({"request": "r", "driver": DRIVER, "pool": node,
                            "device": whole[0]})
        elif migs and not whole:
            results += [{"request": "r", "driver": DRIVER, "pool": node, "device": m}
                        for m in migs[: (len(migs) + 1) // 2]]
        for device in shared if not taken else []:
            results.append({"request": "r", "driver": DRIVER, "pool": node,
                            "device": device["name"],
                            "shareID": "00000000-0000-0000-0000-0000000000aa",
                            "consumedCapacity": {"memory": "16Gi", "multiprocessors": "33",
                                                 "shares": "1"}})
    if not results:
        return None
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"half-{node}", "namespace": "default",
                         "uid": f"00000000-0000-0000-0000-{abs(hash(node)) % 10**12:012d}"},
            "spec": {"devices": {"requests": [
                {"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
            "status": {"allocation": {"devices": {"results": results}}}}


def _claim(name: str, requests: list[dict[str, Any]],
           constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default",
                         "uid": "00000000-0000-0000-0000-000000000001"},
            "spec": {"devices": devices}}


_ONE_G = ('device.attributes["gpu.nvidia.com"].profile.startsWith("1g.") && '
          '!device.attributes["gpu.nvidia.com"].profile.endsWith("+me")')


def _mig(name: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "mig.nvidia.com",
                                      "selectors": [{"cel": {"expression": _ONE_G}}]}}


CLAIMS = {
    "full GPU": _claim("full", [{"name": "gpu",
                                 "exactly": {"deviceClassName": "gpu.nvidia.com"}}]),
    "1g MIG": _claim("mig", [_mig("mig")]),
    "share": _claim("share", [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu-share.nvidia.com",
        "capacity": {"requests": {"memory": "16Gi", "multiprocessors": "33"}}}}]),
    "2 MIG, 1 GPU": _claim("two", [_mig("a"), {"name": "b", "exactly": {
        "deviceClassName": "mig.nvidia.com"}}], [
        {"requests": ["a", "b"], "matchAttribute": "gpu.nvidia.com/parentUUID"}]),
}


def cluster_file(directory: Path, layout: Layout, nodes: int, allocated: bool) -> Path:
    path = directory / f"{layout.name}-{nodes}-{int(allocated)}.json"
    if path.exists():
        return path
    first = node_slices(layout, "node-0")
    with path.open("w") as out:
        out.write('{"apiVersion": "v1", "kind": "List", "items": [')
        sep = ""
        for i in range(nodes):
            name = f"node-{i}"
            items = first if i == 0 else list(renamed(first, "node-0", name))
            claim = half_allocation(items, name) if allocated else None
            for obj in [*items, *([claim] if claim else [])]:
                out.write(sep + json.dumps(obj, separators=(",", ":")))
                sep = ","
        out.write("]}")
    return path


def allocate_ms(binary: str, cluster: Path, claim: Path, repeat: int) -> float | None:
    """node-0's median ``allocateMs``; None when the claim does not fit (not offered)."""
    done = subprocess.run([binary, "-node", "node-0", "-repeat", str(repeat),
                           *map(str, CLASSES), str(cluster), str(claim)],
                          capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1) or not done.stdout:
        raise RuntimeError(f"dra-allocate failed ({done.returncode}): {done.stderr.strip()}")
    report = json.loads(done.stdout)
    if report["outcome"] == "error":
        raise RuntimeError(f"dra-allocate: {report.get('error')}")
    if report["outcome"] != "allocated":
        return None
    return float(report["allocateMs"]["median"])


# --- --properties: which property of the slices makes other nodes cost (item 1) ----------


def _devices(node: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for obj in node:
        yield from obj["spec"].get("devices", [])


def _no_attributes(node: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for device in _devices(node):
        device["attributes"] = {"type": device["attributes"]["type"]}
    return node


def _one_counter(node: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for obj in node:
        for counter_set in obj["spec"].get("sharedCounters", []):
            counter_set["counters"] = {"memory-slice-0": {"value": "1"}}
    for device in _devices(node):
        for used in device.get("consumesCounters", []):
            used["counters"] = {"memory-slice-0": {"value": "1"}}
    return node


def _full_gpus_consume(node: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for obj in node:
        if "devices" in obj["spec"]:
            obj["spec"]["devices"] = [d for d in obj["spec"]["devices"]
                                      if d["attributes"]["type"]["string"] == "gpu"]
    return node


def _fewer_slices(node: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same devices in chunks of 64 (the limit with counters): 1 + 4 slices, not 1 + 8."""
    counters = [o for o in node if "sharedCounters" in o["spec"]]
    devices = list(_devices(node))
    template = next(o for o in node if "devices" in o["spec"])
    chunks = [devices[i:i + 64] for i in range(0, len(devices), 64)]
    out = counters + [{**template, "metadata": {**template["metadata"],
                                                "name": f"{template['metadata']['name']}-c{i}"},
                       "spec": {**template["spec"], "devices": chunk}}
                      for i, chunk in enumerate(chunks)]
    for obj in out:
        obj["spec"]["pool"] = {**obj["spec"]["pool"], "resourceSliceCount": len(out)}
    return out


def _per_device_nodes(node: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Device slices select their node per device (no slice nodeName)."""
    for obj in node:
        if "devices" in obj["spec"]:
            name = obj["spec"].pop("nodeName")
            obj["spec"]["perDeviceNodeSelection"] = True
            for device in obj["spec"]["devices"]:
                device["nodeName"] = name
    return node


PROPERTIES: dict[str, tuple[str, str, Any]] = {
    # name: (layout of node-0, layout of the others, transformation of the others' slices)
    "full-GPU layout everywhere": ("full-gpu", "full-gpu", None),
    "dynamic MIG everywhere (today)": ("dynamic-all", "dynamic-all", None),
    "node-0 dynamic, others full-GPU": ("dynamic-all", "full-gpu", None),
    "node-0 full-GPU, others dynamic": ("full-gpu", "dynamic-all", None),
    "others: attributes cut to `type`": ("full-gpu", "dynamic-all", _no_attributes),
    "others: one counter per set": ("full-gpu", "dynamic-all", _one_counter),
    "others: counters, 8 full GPUs consume them, no MIG": (
        "full-gpu", "dynamic-all", _full_gpus_consume),
    "others: 1 + 4 slices per pool (not 1 + 8)": ("full-gpu", "dynamic-all", _fewer_slices),
    "others: per-device node selection": ("full-gpu", "dynamic-all", _per_device_nodes),
    "others: one GPU dynamic (2 profiles)": ("full-gpu", "dynamic-gpu0-small", None),
    "others: shares on all GPUs (counters)": ("full-gpu", "shares-all", None),
    "others: disjoint 1g on all GPUs": ("full-gpu", "disjoint-1g-all", None),
}


def properties(binary: str, sizes: Sequence[int], runs: int, repeat: int) -> None:
    layouts = {layout.name: layout for layout in LAYOUTS}
    built: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="gpudra-bench-props-") as scratch:
        directory = Path(scratch)
        claim = directory / "claim.json"
        claim.write_text(json.dumps(CLAIMS["full GPU"]))
        print("| node-0 / other nodes | " + " | ".join(f"N={n}" for n in sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        for name, (own, others, change) in PROPERTIES.items():
            for layout in (own, others):
                if layout not in built:
                    built[layout] = node_slices(layouts[layout], "node-0")
            cells = []
            for nodes in sizes:
                path = directory / "cluster.json"
                items = list(json.loads(json.dumps(built[own])))
                for i in range(1, nodes):
                    other = json.loads(json.dumps(list(renamed(built[others], "node-0",
                                                               f"node-{i}"))))
                    items += change(other) if change else other
                path.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                            "items": items}, separators=(",", ":")))
                times = [allocate_ms(binary, path, claim, repeat) for _ in range(runs)]
                cells.append(" / ".join(f"{t:.3g}" for t in times if t is not None))
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="1,10,100,1000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layouts", default=",".join(layout.name for layout in LAYOUTS))
    parser.add_argument("--counter-nodes-max", type=int, default=100,
                        help="largest N for layouts where every node publishes counters")
    parser.add_argument("--properties", action="store_true",
                        help="instead: a full GPU on node-0 while the other nodes' slices "
                             "change one property at a time")
    args = parser.parse_args()
    binary, why = dra_allocate()
    if binary is None:
        print(f"skipped: {why}")
        return
    if args.properties:
        properties(binary, [int(n) for n in args.nodes.split(",")], args.runs, args.repeat)
        return
    wanted = args.layouts.split(",")
    sizes = [int(n) for n in args.nodes.split(",")]
    with tempfile.TemporaryDirectory(prefix="gpudra-bench-scale-") as scratch:
        directory = Path(scratch)
        claims = {}
        for kind, claim in CLAIMS.items():
            claims[kind] = directory / f"claim-{len(claims)}.json"
            claims[kind].write_text(json.dumps(claim))
        print("| layout | N | cluster | " + " | ".join(CLAIMS) + " |")
        print("|---|---|---|" + "---|" * len(CLAIMS))
        for layout in (x for x in LAYOUTS if x.name in wanted):
            counters = bool(node_slices(layout, "node-0")[0]["spec"].get("sharedCounters"))
            for nodes in sizes:
                if counters and nodes > args.counter_nodes_max:
                    print(f"| {layout.name} | {nodes} | | skipped: counters on every node "
                          f"(--counter-nodes-max {args.counter_nodes_max}) |")
                    continue
                for allocated in (False, True):
                    cluster = cluster_file(directory, layout, nodes, allocated)
                    cells = []
                    for kind in CLAIMS:
                        runs = [allocate_ms(binary, cluster, claims[kind], args.repeat)
                                for _ in range(args.runs)]
                        cells.append("-" if None in runs else " / ".join(
                            f"{ms:.3g}" for ms in runs if ms is not None))
                    state = "50% allocated" if allocated else "empty"
                    print(f"| {layout.name} | {nodes} | {state} | " + " | ".join(cells) + " |",
                          flush=True)
                    cluster.unlink()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
