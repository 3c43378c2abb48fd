"""Seeded allocation cases for the differential test against the real 1.36 allocator.

A *scenario* is one simulated node profile under one set of feature gates, its slices made by
our own slice building (``collect_devices`` + ``build_slices``, exactly what ``gpudra
inventory`` and the node daemon publish), in a few *variants*: untouched, with device taints,
with a second node's pool beside it, and with that second pool incomplete (a slice missing).
A *case* is a scenario variant, the claims already allocated on it, and the claims of one pod
to allocate together on node ``n1``. Everything is drawn from one ``random.Random`` seeded per
case, so a failing case is reproduced by its index and the seed alone.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DRIVER = "gpu.nvidia.com"
NODE = "n1"
OTHER_NODE = "n2"
ROOT = Path(__file__).resolve().parents[2]

SCENARIOS: tuple[tuple[str, ...], ...] = (
    # `gpudra explain --simulate PROFILE` flags of each simulated node: the command's own
    # parser fills in every flag not named (so new layout flags get their defaults).
    ("dgx-h100",),
    ("dgx-h100", "--dynamic-mig-gpus", "all"),
    ("dgx-h100", "--dynamic-mig-gpus", "0,3", "--dynamic-mig-profiles", "1g.10gb,3g.40gb"),
    ("dgx-h100", "--dynamic-mig-gpus", "all", "--dynamic-mig-placements", "disjoint"),
    ("dgx-h100", "--feature-gates", "DynamicMIG=false"),
    ("dgx-h100", "--dynamic-mig-gpus", "all", "--shareable-gpus", "all"),
    ("dgx-h100", "--feature-gates", "DynamicMIG=false", "--shareable-gpus", "0,1,2"),
    # A100/A30 MIG mode is off: their placements need the admin's opt-in (#30 item 5)
    ("dgx-a100", "--dynamic-mig-gpus", "all", "--allow-mig-mode-change", "all"),
    # Without the opt-in: 8 full GPUs, two per NUMA node, where the 1.36 distinctAttribute
    # bookkeeping (allocation_state.Constraint) shows; it must stay covered.
    ("dgx-a100", "--dynamic-mig-gpus", "all"),
    ("dgx-a100", "--feature-gates", "DynamicMIG=false", "--shareable-gpus", "all"),
    ("dgx-a100-static-mig", "--dynamic-mig-gpus", "all", "--allow-mig-mode-change", "all"),
    ("dgx-a100-static-mig", "--shareable-gpus", "all"),
    ("a30-x4", "--dynamic-mig-gpus", "all", "--allow-mig-mode-change", "all"),
    ("a30-x4", "--dynamic-mig-gpus", "1,3", "--dynamic-mig-placements", "disjoint",
     "--allow-mig-mode-change", "all",
     "--shareable-gpus", "0,1"),
    ("l4-x4",),
    ("l4-x4", "--feature-gates", "ConsumableCapacity=false", "--shareable-gpus", "all"),
    ("h100-nvl-x2", "--shareable-gpus", "all"),
)

VARIANTS = ("plain", "taints", "two-nodes", "other-incomplete")

TEST_CLASSES: tuple[dict[str, Any], ...] = (
    {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
     "metadata": {"name": "any.test"},
     "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}],
              "config": [{"opaque": {"driver": DRIVER, "parameters": {
                  "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}}}]}},
)

TAINT_KEYS = ("gpu.nvidia.com/xid", "gpu.nvidia.com/maintenance")
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "NoSchedule")


@dataclass
class Scenario:
    """One profile under one set of gates: its slice variants and what claims can ask for."""

    name: str
    variants: dict[str, list[dict[str, Any]]]
    devices: list[dict[str, Any]]
    """Node n1's devices, as published."""
    other_devices: list[dict[str, Any]]
    files: dict[str, Path] = field(default_factory=dict)
    """Variant -> the oracle's input file (slices in a shuffled order)."""
    reversed_files: dict[str, Path] = field(default_factory=dict)
    """Variant -> the same slices in another order (to tell order-dependent choices)."""

    def types(self) -> set[str]:
        return {_attr(d, "type") for d in self.devices}

    def values(self, name: str) -> list[Any]:
        found = {_attr(d, name) for d in self.devices} - {None}
        return sorted(found, key=str)


@dataclass
class Case:
    index: int
    scenario: Scenario
    variant: str
    allocated: list[dict[str, Any]]
    claims: list[dict[str, Any]]

    @property
    def slices(self) -> list[dict[str, Any]]:
        return self.scenario.variants[self.variant]

    def claims_document(self) -> str:
        """The oracle's stdin: allocated claims, then the pod's claims, as one List.

        Results with admin access are left out of the allocated claims: the scheduler's
        claim tracker skips them (``foreachAllocatedDevice``: "is not considered as
        allocated"), dra-allocate's own gathering does not. Our side gets them as they are.
        """
        allocated = []
        for claim in self.allocated:
            results = claim["status"]["allocation"]["devices"]["results"]
            kept = [r for r in results if not r.get("adminAccess")]
            allocated.append({**claim, "status": {"allocation": {"devices": {"results": kept}}}})
        return json.dumps({"apiVersion": "v1", "kind": "List",
                           "items": allocated + self.claims})

    def describe(self) -> str:
        return (f"case {self.index}: {self.scenario.name} [{self.variant}]\n"
                f"allocated: {json.dumps(self.allocated)}\nclaims: {json.dumps(self.claims)}")


def _attr(device: Mapping[str, Any], name: str) -> Any:
    value = (device.get("attributes") or {}).get(name)
    if not isinstance(value, Mapping) or not value:
        return None
    return next(iter(value.values()))


def device_classes() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in sorted((ROOT / "deploy" / "deviceclasses").glob("*.yaml")):
        found.extend(d for d in yaml.safe_load_all(path.read_text())
                     if isinstance(d, dict) and d.get("kind") == "DeviceClass")
    return found + [copy.deepcopy(c) for c in TEST_CLASSES]


# --- scenarios ------------------------------------------------------------------------------

def _node_slices(words: Sequence[str]) -> Callable[[str], Any]:
    """Our own slice building for a simulated node, as ``gpudra explain --simulate``."""
    from gpudra.cli.inventory_cmd import collect_devices
    from gpudra.cli.main import build_parser
    from gpudra.controller.slices import build_slices

    profile, *flags = words
    defaults = ["--feature-gates", "", "--shareable-gpus", "none", "--dynamic-mig-gpus", "none",
                "--dynamic-mig-profiles", "all", "--dynamic-mig-placements", "all"]
    known = {w for w in flags if w.startswith("--")}
    unset = [w for i in range(0, len(defaults), 2) if defaults[i] not in known
             for w in defaults[i:i + 2]]
    # Explicit values for every flag with an environment fallback: the environment of the
    # test run must not change the layout.
    args = build_parser("explain").parse_args(
        ["explain", "-", "--simulate", profile, *unset, *flags])
    devices = collect_devices(args)

    def build(node: str) -> Any:
        # A JSON round trip: plain, unshared dicts as the API server would hand them out.
        return json.loads(json.dumps(build_slices(devices, driver=DRIVER, node_name=node)))

    return build


def _all_devices(slices: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in (s.get("spec") or {}).get("devices") or []]


def _tainted(slices: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Taints on some whole GPUs' slices and on some single devices."""
    out = copy.deepcopy(slices)
    device_slices = [s for s in out if s["spec"].get("devices")]
    whole = set(rng.sample(range(len(device_slices)), max(1, len(device_slices) // 4)))
    for i, obj in enumerate(device_slices):
        for device in obj["spec"]["devices"]:
            if i in whole or rng.random() < 0.15:
                device["taints"] = [{"key": rng.choice(TAINT_KEYS),
                                     "value": rng.choice(("79", "48")),
                                     "effect": rng.choice(TAINT_EFFECTS)}]
    return out


def build_scenarios(seed: int) -> list[Scenario]:
    rng = random.Random(seed)
    scenarios = []
    for words in SCENARIOS:
        build = _node_slices(words)
        own = build(NODE)
        other = build(OTHER_NODE)
        incomplete = [s for s in other if s["spec"].get("devices")][1:] + [
            s for s in other if not s["spec"].get("devices")]
        if len(incomplete) == len(other):  # one slice only: drop nothing, claim one more
            for s in incomplete:
                s["spec"]["pool"]["resourceSliceCount"] += 1
        variants = {
            "plain": own,
            "taints": _tainted(own, rng),
            "two-nodes": own + other,
            "other-incomplete": _tainted(own, rng) + incomplete,
        }
        name = " ".join(words)
        scenarios.append(Scenario(name, variants, _all_devices(own), _all_devices(other)))
    return scenarios


def write_inputs(scenarios: Sequence[Scenario], directory: Path, seed: int) -> Path:
    """The oracle's input files: one per scenario variant (two slice orders), and the classes."""
    rng = random.Random(seed)
    classes = directory / "classes.json"
    classes.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                   "items": device_classes()}))
    for si, scenario in enumerate(scenarios):
        for variant, slices in scenario.variants.items():
            # The informer lists slices in no particular order: neither should the oracle.
            shuffled = list(slices)
            rng.shuffle(shuffled)
            for files, order, tag in ((scenario.files, shuffled, "a"),
                                      (scenario.reversed_files, shuffled[::-1], "b")):
                path = directory / f"s{si}-{variant}-{tag}.json"
                path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": order}))
                files[variant] = path
    return classes


# --- claims ---------------------------------------------------------------------------------

QUANTITIES = ("1Gi", "4Gi", "5Gi", "10Gi", "20Gi", "40Gi", "79Gi", "80Gi", "100Gi")


def _selector(rng: random.Random, scenario: Scenario) -> str:
    a = f"device.attributes['{DRIVER}']"
    c = f"device.capacity['{DRIVER}']"
    products = [*scenario.values("productName"), "NVIDIA T4"]
    profiles = [*scenario.values("profile"), "1g.10gb", "3g.40gb"]
    numa = [*scenario.values("numaNode"), 9]
    roots = [_attr(d, "resource.kubernetes.io/pcieRoot") for d in scenario.devices]
    roots = sorted({r for r in roots if r}) or ["pci0000:00"]
    q = rng.choice(QUANTITIES)
    version = rng.choice(("535.0.0", "580.95.5", "580.126.20", "600.0.0"))
    choices: list[Callable[[], str]] = [
        lambda: f"{a}.productName == '{rng.choice(products)}'",
        lambda: f"{a}.productName.startsWith('NVIDIA {rng.choice(('A', 'H', 'L'))}')",
        lambda: f"{c}.memory.compareTo(quantity('{q}')) >= 0",
        lambda: f"{c}.memory.isLessThan(quantity('{q}'))",
        lambda: f"{a}.driverVersion.isGreaterThan(semver('{version}'))",
        lambda: f"{a}.driverVersion.compareTo(semver('{version}')) <= 0",
        # A MIG-only attribute: a runtime error ("no such key") on any other device.
        lambda: f"{a}.profile == '{rng.choice(profiles)}'",
        lambda: f"has({a}.profile) && {a}.profile.startsWith('{rng.choice(('1g', '2g', '3g'))}')",
        lambda: f"!has({a}.profile)",
        lambda: f"{a}.numaNode == {rng.choice(numa)}",
        lambda: f"{a}.numaNode > 1",
        lambda: f"device.attributes['resource.kubernetes.io'].pcieRoot == '{rng.choice(roots)}'",
        lambda: f"{a}.type in ['gpu', 'mig']",
        # A type error at run time (int against string).
        lambda: f"{a}.numaNode == '1'",
        lambda: f"'{DRIVER}' in device.attributes && {c}.multiprocessors.isGreaterThan("
                f"quantity('{rng.choice(('10', '20', '60', '100'))}'))",
    ]
    return rng.choice(choices)()


def _classes_for(scenario: Scenario) -> list[str]:
    types = scenario.types()
    classes = ["gpu.nvidia.com", "any.test"]
    if "mig" in types:
        classes += ["mig.nvidia.com", "mig.nvidia.com"]
    if "gpu-share" in types:
        classes += ["gpu-share.nvidia.com", "gpu-share.nvidia.com"]
    return classes


def _capacity(rng: random.Random, device_class: str) -> dict[str, Any] | None:
    if device_class == "gpu-share.nvidia.com":
        if rng.random() < 0.2:
            return None
        wanted: dict[str, str] = {}
        for name, values in (("memory", ("1Gi", "1500Mi", "9Gi", "20Gi", "40Gi", "79Gi", "90Gi")),
                             ("multiprocessors", ("1", "16", "66", "132", "200")),
                             ("shares", ("1", "2", "8", "16", "17"))):
            if rng.random() < 0.5:
                wanted[name] = rng.choice(values)
        return {"requests": wanted} if wanted else None
    if rng.random() < 0.1:
        name = rng.choice(("memory", f"{DRIVER}/memory", "multiprocessors", "shares"))
        return {"requests": {name: rng.choice(("4Gi", "20Gi", "40Gi", "100", "1"))}}
    return None


def _tolerations(rng: random.Random) -> list[dict[str, Any]] | None:
    if rng.random() < 0.7:
        return None
    pick = rng.random()
    if pick < 0.4:
        return [{"key": rng.choice(TAINT_KEYS), "operator": "Exists"}]
    if pick < 0.7:
        return [{"key": rng.choice(TAINT_KEYS), "operator": "Equal", "value": "79",
                 "effect": rng.choice(("NoSchedule", "NoExecute"))}]
    return [{"operator": "Exists"}]


def _exact(rng: random.Random, scenario: Scenario, *, sub: bool) -> dict[str, Any]:
    device_class = rng.choice(_classes_for(scenario))
    spec: dict[str, Any] = {"deviceClassName": device_class}
    mode = rng.random()
    if mode < 0.08:
        spec["allocationMode"] = "All"
    else:
        count = rng.choice((1, 1, 1, 1, 2, 2, 3, 4, 8))
        if count > 4 and device_class != "gpu.nvidia.com":
            count = 4  # 8 of a node's hundreds of MIG devices under a constraint: see make_case
        if count != 1 or rng.random() < 0.3:
            spec["count"] = count
    n = rng.choice((0, 0, 1, 1, 1, 2))
    if spec.get("allocationMode") == "All" and n == 0:
        n = 1  # All of a class on a big node is past the 32-result limit: mostly narrow it
    if n:
        spec["selectors"] = [{"cel": {"expression": _selector(rng, scenario)}} for _ in range(n)]
    capacity = _capacity(rng, device_class)
    if capacity:
        spec["capacity"] = capacity
    tolerations = _tolerations(rng)
    if tolerations:
        spec["tolerations"] = tolerations
    if not sub and rng.random() < 0.06:
        spec["adminAccess"] = True
    return spec


def _request(rng: random.Random, scenario: Scenario, name: str) -> dict[str, Any]:
    if rng.random() < 0.2:
        subs = [{"name": f"s{i}", **_exact(rng, scenario, sub=True)}
                for i in range(rng.choice((2, 2, 3)))]
        return {"name": name, "firstAvailable": subs}
    return {"name": name, "exactly": _exact(rng, scenario, sub=False)}


CONSTRAINT_ATTRIBUTES = (f"{DRIVER}/productName", f"{DRIVER}/parentUUID", f"{DRIVER}/numaNode",
                         "resource.kubernetes.io/pcieRoot", f"{DRIVER}/uuid", "numaNode")


def _claim(rng: random.Random, scenario: Scenario, name: str) -> dict[str, Any]:
    requests = [_request(rng, scenario, f"r{i}") for i in range(rng.choice((1, 1, 1, 2, 2, 3)))]
    devices: dict[str, Any] = {"requests": requests}
    if rng.random() < 0.3:
        constraint: dict[str, Any] = {}
        key = "distinctAttribute" if rng.random() < 0.3 else "matchAttribute"
        constraint[key] = rng.choice(CONSTRAINT_ATTRIBUTES)
        if len(requests) > 1 and rng.random() < 0.5:
            constraint["requests"] = [r["name"] for r in rng.sample(requests, 2)]
        devices["constraints"] = [constraint]
    if rng.random() < 0.2:
        names = [r["name"] for r in requests]
        names += [f"{r['name']}/{s['name']}" for r in requests for s in r.get("firstAvailable", ())]
        devices["config"] = [{"requests": rng.sample(names, 1) if rng.random() < 0.6 else [],
                              "opaque": {"driver": DRIVER, "parameters": {"kind": "GpuConfig",
                                         "apiVersion": "resource.nvidia.com/v1beta1"}}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": devices}}


def _allocated_claim(rng: random.Random, scenario: Scenario, name: str,
                     variant: str) -> dict[str, Any]:
    pool_devices = [(NODE, d) for d in scenario.devices]
    if variant != "plain" and scenario.other_devices:
        pool_devices += [(OTHER_NODE, d) for d in scenario.other_devices]
    results = []
    for i in range(rng.choice((1, 1, 2, 3))):
        pool, device = rng.choice(pool_devices)
        result: dict[str, Any] = {"request": f"r{i}", "driver": DRIVER, "pool": pool,
                                  "device": device["name"]}
        if device.get("allowMultipleAllocations"):
            result["shareID"] = f"{rng.getrandbits(128):032x}"
            consumed = {"memory": rng.choice(("1Gi", "9Gi", "20Gi", "40Gi", "70Gi")),
                        "multiprocessors": rng.choice(("16", "32", "100")),
                        "shares": rng.choice(("1", "4", "15"))}
            result["consumedCapacity"] = {k: v for k, v in consumed.items()
                                          if k in (device.get("capacity") or {})}
        elif rng.random() < 0.1:
            result["adminAccess"] = True
        results.append(result)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [
                {"name": f"r{i}", "exactly": {"deviceClassName": "any.test"}}
                for i in range(len(results))]}},
            "status": {"allocation": {"devices": {"results": results}}}}


def _wanted(request: Mapping[str, Any]) -> int:
    """Devices a request asks for at most (All counts as one: it backtracks nothing)."""
    options = request.get("firstAvailable") or [request.get("exactly") or {}]
    return max(1 if o.get("allocationMode") == "All" else int(o.get("count", 1))
               for o in options)


MAX_SEARCH_DEVICES = 3
"""Devices a pod with several requests may ask for in all. Both allocators are a depth-first
search over combinations: a pod that cannot fit and asks for more (say 3 GPUs, a MIG device
and 8 GPUs, or 1 + 2 MIG devices and a GPU no selector matches, on a node with 208 devices)
takes the real allocator seconds and ours minutes, and tests nothing more than a smaller one
does. A single request may ask for up to 8."""


def make_case(index: int, seed: int, scenarios: Sequence[Scenario]) -> Case:
    rng = random.Random(seed * 1_000_003 + index)
    scenario = scenarios[index % len(scenarios)]
    variant = rng.choice(VARIANTS)
    allocated = [_allocated_claim(rng, scenario, f"a{i}", variant)
                 for i in range(rng.choice((0, 0, 1, 1, 2, 4)))]
    while True:
        claims = [_claim(rng, scenario, f"c{i}") for i in range(rng.choice((1, 1, 1, 2, 3)))]
        requests = [r for c in claims for r in c["spec"]["devices"]["requests"]]
        if len(requests) == 1 or sum(_wanted(r) for r in requests) <= MAX_SEARCH_DEVICES:
            return Case(index, scenario, variant, allocated, claims)


# --- pinned cases ---------------------------------------------------------------------------

PINNED_SCENARIO = " ".join(("dgx-a100", "--dynamic-mig-gpus", "all"))
"""8 full GPUs, two per NUMA node (the A100's MIG placements are off without the opt-in)."""
PINNED_COUNTS = ((4,), (2, 2), (2, 1), (1, 2), (3,), (1, 1, 1), (5,))
PINNED_HELD = ((), ("gpu-2",), ("gpu-2", "gpu-3"), ("gpu-1", "gpu-6"))
PINNED_ATTRIBUTES = (f"{DRIVER}/numaNode", "numaNode", "resource.kubernetes.io/numaNode")


def _held(devices: Sequence[str]) -> list[dict[str, Any]]:
    if not devices:
        return []
    results = [{"request": f"r{i}", "driver": DRIVER, "pool": NODE, "device": d}
               for i, d in enumerate(devices)]
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "a0", "namespace": "default"},
             "spec": {"devices": {"requests": [
                 {"name": r["request"], "exactly": {"deviceClassName": "any.test"}}
                 for r in results]}},
             "status": {"allocation": {"devices": {"results": results}}}}]


def pinned_cases(first_index: int, scenarios: Sequence[Scenario]) -> list[Case]:
    """Fixed cases besides the seeded ones: ``distinctAttribute`` on a NUMA attribute over
    several full GPUs of a DGX A100, some held. There the 1.36 allocator keeps one value per
    request name (``gpudra.scheduling.allocation_state.Constraint``), so its answers differ
    from the API's "unique across those devices"; the seeded draw reaches such claims rarely
    (a differential run once found one, then a scenario change hid it)."""
    scenario = next(s for s in scenarios if s.name == PINNED_SCENARIO)
    cases = []
    for attribute in PINNED_ATTRIBUTES:
        for counts in PINNED_COUNTS:
            for held in PINNED_HELD:
                requests = [{"name": f"r{i}", "exactly": {
                    "deviceClassName": "gpu.nvidia.com", "count": c}}
                    for i, c in enumerate(counts)]
                claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                         "metadata": {"name": "c0", "namespace": "default"},
                         "spec": {"devices": {"requests": requests, "constraints": [
                             {"distinctAttribute": attribute}]}}}
                cases.append(Case(first_index + len(cases), scenario, "plain", _held(held),
                                  [claim]))
    return cases
