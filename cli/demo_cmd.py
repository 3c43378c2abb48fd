"""``gpudra demo``: the whole driver on a laptop, in one screen.

Starts the project's API-server stand-in and a ``gpudra node`` daemon on a simulated DGX
H100, lets the reference allocator place a few of the ``examples/`` claims the way the
scheduler would, has a kubelet stand-in prepare and unprepare them over the real gRPC
sockets, and prints what happened at each step. Everything it starts it stops; every file
it writes lives in a temporary directory. Works from an installed package: the stand-ins
ship as ``gpudra.testing``, the DeviceClasses and the claims as package data.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpudra.api.claims import ClaimRef
from gpudra.cli import package_data
from gpudra.cli.options import CliError
from gpudra.cli.output import plain_text
from gpudra.scheduling.allocator import Allocator
from gpudra.scheduling.explain_subjects import subjects
from gpudra.testing.kubelet_emulator import BackgroundKubelet, KubeletEmulator

DRIVER = "gpu.nvidia.com"
NODE = "demo-node"
DEMO_USAGE_INTERVAL = 0.2
"""Seconds between usage samples in the demo (10 s by default), so ``top`` has figures."""
DEMO_GPU_LOAD = (85, 2, 60, 40, 95, 15, 70, 0)
"""SM % the demo puts on each full GPU."""
# (example file, what it shows)
SCENARIOS = [
    ("single-gpu/gpu.yaml", "one full GPU"),
    ("mig-1g-dynamic/claim.yaml", "a 1g MIG slice, created on demand"),
    ("two-mig-same-gpu/claim.yaml", "two MIG slices on one GPU"),
    ("exclusive-compute/claim.yaml", "a GPU in exclusive-process mode"),
    ("mps/claim.yaml", "a GPU shared through MPS"),
]


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run the driver end to end on a simulated GPU node",
        description=plain_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="dgx-h100", help="simulated node profile")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.set_defaults(run=run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _say(text: str = "") -> None:
    print(text, flush=True)


@contextlib.contextmanager
def _process(args: list[str], *, log: Path) -> Iterator[subprocess.Popen[str]]:
    with log.open("w") as out:
        # run in the demo's temporary directory, so nothing depends on where it was started
        proc = subprocess.Popen(args, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT,
                                text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_for(check: Any, what: str, proc: subprocess.Popen[str], log: Path,
              timeout: float = 30.0) -> Any:
    """Poll ``check`` until it answers; give up at once, quoting its log, if ``proc`` dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc.poll() is not None:
            # the log goes with the temporary directory, so say what it said
            tail = "\n".join(log.read_text().splitlines()[-10:])
            raise CliError(f"the {log.stem} process exited with status {proc.returncode} "
                           f"before {what} appeared; the end of its log:\n{tail}")
        time.sleep(0.05)
    raise CliError(f"timed out waiting for {what}")


def _api(url: str, path: str, *, method: str = "GET", body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _slices(url: str) -> list[dict[str, Any]]:
    items = _api(url, "/apis/resource.k8s.io/v1/resourceslices")["items"]
    return [s for s in items if s["spec"]["driver"] == DRIVER]


def run(args: argparse.Namespace) -> int:
    base = Path(tempfile.mkdtemp(prefix="gd-demo-", dir="/tmp"))
    try:
        _demo(args.profile, base)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            _say(f"(kept {base})")
    return 0


def shared_gpu(profile: str) -> int | None:
    """The demo's shareable GPU (``--shareable-gpus``): the profile's last GPU not in MIG
    mode, as the whole-GPU scenarios take the first free ones; None when every GPU is in MIG
    mode (or the profile is unknown: the node daemon then says so)."""
    from gpudra.driver.sim import profiles

    if profile not in profiles.node_profiles():
        return None
    whole = [gpu.index for gpu in profiles.node_profile(profile).gpus if not gpu.mig_enabled]
    return whole[-1] if whole else None


def _demo(profile: str, base: Path) -> None:
    port = _free_port()
    shared = shared_gpu(profile)
    url = f"http://127.0.0.1:{port}"
    http = _free_port()
    _say(f"gpudra demo — simulated node '{NODE}' ({profile}), everything under {base}")
    _say()
    with _process([sys.executable, "-m", "gpudra.testing.fakeapi", "--port", str(port),
                   "--node", NODE], log=base / "apiserver.log") as apiserver:
        _wait_for(lambda: _reachable(url), "the API server stand-in", apiserver,
                  base / "apiserver.log")
        for path in package_data.device_class_files():
            _api(url, "/apis/resource.k8s.io/v1/deviceclasses", method="POST",
                 body=yaml.safe_load(path.read_text()))
        kubeconfig = base / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: demo, cluster: {{server: '{url}'}}}}]\n"
            "users: [{name: demo, user: {}}]\n"
            "contexts: [{name: demo, context: {cluster: demo, user: demo}}]\n"
            "current-context: demo\n")
        started = time.monotonic()
        node_args = [sys.executable, "-m", "gpudra.cli.main", "node", "--node-name", NODE,
                     "--simulate", profile, "--kubeconfig", str(kubeconfig),
                     "--registrar-dir", str(base / "registry"),
                     "--plugins-dir", str(base / "plugins"), "--cdi-root", str(base / "cdi"),
                     "--http-address", f"127.0.0.1:{http}", "--log-format", "json",
                     *(["--shareable-gpus", str(shared)] if shared is not None else []),
                     # One node: dynamic MIG's cluster-wide cost (README) does not arise.
                     "--dynamic-mig-gpus", "all",
                     "--usage-interval", f"{DEMO_USAGE_INTERVAL}s"]
        # A kubelet registers the daemon as its sockets appear: it publishes only then.
        with BackgroundKubelet(base / "registry"), \
                _process(node_args, log=base / "node.log") as daemon:
            slices = _wait_for(lambda: _published(url), "the ResourceSlices", daemon,
                               base / "node.log")
            elapsed = time.monotonic() - started
            _print_slices(slices, elapsed)
            asyncio.run(_claims(url, base, slices, http, shared))
            _print_metrics(http)
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(20)
            left = sorted(p.name for p in base.rglob("*.sock"))
            _say(f"node daemon stopped (exit {code}); sockets left behind: {left or 'none'}")


def _reachable(url: str) -> bool:
    try:
        _api(url, "/version")
    except OSError:
        return False
    return True


def _published(url: str) -> list[dict[str, Any]] | None:
    slices = _slices(url)
    if not slices:
        return None
    count = slices[0]["spec"]["pool"]["resourceSliceCount"]
    return slices if len(slices) == count else None


def _print_slices(slices: list[dict[str, Any]], elapsed: float) -> None:
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    kinds = Counter(str(d["attributes"]["type"]["string"]) for d in devices)
    full = [d for d in devices if d["attributes"]["type"]["string"] == "gpu"]
    counters = sum(len(s["spec"].get("sharedCounters", [])) for s in slices)
    product = full[0]["attributes"]["productName"]["string"] if full else "?"
    # By type: a GPU's shared device (gpu-share) is not a MIG placement.
    shares = kinds["gpu-share"]
    _say(f"1. published {len(slices)} ResourceSlices in {elapsed:.1f}s: {len(devices)} devices = "
         f"{kinds['gpu']} x {product} + {kinds['mig']} MIG placements"
         + (f" + {shares} shared GPU{'s' if shares != 1 else ''}" if shares else "")
         + f", {counters} shared counter set{'s' if counters != 1 else ''}"
         + (" (one per GPU, so placements never overlap)" if kinds["mig"] else ""))
    _say()


async def _claims(url: str, base: Path, slices: list[dict[str, Any]], http: int,
                  shared: int | None) -> None:
    classes = _api(url, "/apis/resource.k8s.io/v1/deviceclasses")["items"]
    allocations: list[dict[str, Any]] = []
    prepared: list[Any] = []
    _say("2. claims from examples/, allocated as the scheduler would, prepared by the kubelet:")
    async with await KubeletEmulator.discover(base / "registry") as kubelet:
        for path, what in SCENARIOS:
            documents = list(yaml.safe_load_all(package_data.example(path).read_text()))
            found, _ = subjects(documents)
            claim = dict(found[0].claims[0])
            allocation = Allocator(slices, classes, allocations).allocate(claim, NODE)
            if allocation.result is None:
                _say(f"   {what}: not allocatable: {allocation.blocking or allocation.error}")
                continue
            allocations.append(allocation.result)
            ref = _create_claim(url, claim, allocation.result,
                                _pods(path.split("/")[0], claim, found[0].title))
            response = (await kubelet.prepare([ref]))[ref.uid]
            devices = ", ".join(d["device_name"] for d in response["devices"])
            status = f"error: {response['error']}" if response["error"] else f"prepared {devices}"
            _say(f"   {what:<36} {path.split('/')[0]:<18} → {status}")
            prepared.append(ref)
        if shared is None:
            _say("   shares of a GPU: skipped, every GPU of this node is in MIG mode")
        else:
            prepared += await _share_scene(url, base, (slices, classes, allocations),
                                           kubelet, shared)
        _say(f"   → on the (simulated) hardware now: {_hardware(base)}")
        _print_cdi(base, prepared)
        _top(base, http)
        _say("4. unprepare (pods gone): MIG devices destroyed, settings restored, specs removed")
        for ref in prepared:
            await kubelet.unprepare([ref])
        left = sorted(p.name for p in (base / "cdi").glob("*.json"))
        _say(f"   → on the hardware now: {_hardware(base)}; CDI specs left: {len(left)}")
        _say()


def _top(base: Path, http: int) -> None:
    """Simulated load on every GPU and MIG device, then ``gpudra top`` of the claims."""
    from gpudra.cli import top_cmd
    from gpudra.driver.sim import SimControl

    sim = SimControl(base / "plugins" / DRIVER / "sim")
    for gpu in sim.snapshot()["gpus"]:
        index = gpu["index"]
        instances = [ci for gi in gpu["gpu_instances"] for ci in gi["compute_instances"]]
        for k, ci in enumerate(instances):
            sim.set_load(index, mig_uuid=ci["uuid"], sm_percent=(35 + 30 * k) % 100,
                         memory_bytes=(k + 2) * 2**30)
        if not gpu["mig_mode"]["current"]:
            sm = DEMO_GPU_LOAD[index % len(DEMO_GPU_LOAD)]
            sim.set_load(index, sm_percent=sm, memory_bytes=int(sm / 2) * 2**30)
    time.sleep(DEMO_USAGE_INTERVAL * 3)  # a few sampling passes (GPM compares two)
    snapshot = top_cmd.fetch([f"http://127.0.0.1:{http}"])
    _say("   gpudra top (with simulated load on the devices):")
    for line in top_cmd.render(snapshot, "table", "util").splitlines():
        _say(f"   {line}")
    _say()


async def _share_scene(
    url: str, base: Path,
    state: tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]],
    kubelet: KubeletEmulator, shared: int,
) -> list[ClaimRef]:
    """Two pods share one GPU by memory and SMs: one MPS daemon, each pod's own limits.
    ``state``: the slices, the classes and the allocations so far."""
    from gpudra.driver.sim.mps_daemon import read_limits

    slices, classes, allocations = state
    documents = list(yaml.safe_load_all(
        package_data.example("fractional-gpu/claims.yaml").read_text()))
    known = {c["metadata"]["name"] for c in classes}
    for doc in documents:  # the share class, if the chart's classes do not have it
        if doc.get("kind") == "DeviceClass" and doc["metadata"]["name"] not in known:
            classes.append(_api(url, "/apis/resource.k8s.io/v1/deviceclasses", method="POST",
                                body=doc))
    found, _ = subjects(documents)
    refs = []
    for subject in found:
        claim = dict(subject.claims[0])
        allocation = Allocator(slices, classes, allocations).allocate(claim, NODE)
        if allocation.result is None:
            _say(f"   share {claim['metadata']['name']}: not allocatable: "
                 f"{allocation.blocking or allocation.error}")
            continue
        allocations.append(allocation.result)
        ref = _create_claim(url, claim, allocation.result,
                            _pods("fractional-gpu", claim, subject.title))
        response = (await kubelet.prepare([ref]))[ref.uid]
        if response["error"]:
            _say(f"   share {ref.name}: error: {response['error']}")
            continue
        refs.append(ref)
        [result] = allocation.result["devices"]["results"]
        spec = json.loads((base / "cdi" / f"k8s.{DRIVER}-claim_{ref.uid}.json").read_text())
        env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
        consumed = result.get("consumedCapacity", {})
        what = f"a share of GPU {shared}"
        _say(f"   {what:<36} {ref.name:<18} → prepared "
             f"{result['device']} share {str(result.get('shareID'))[:8]}…: "
             f"{consumed.get('memory')} / {consumed.get('multiprocessors')} SMs → MPS limits "
             f"{env.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}, "
             f"{env.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')}% of the SMs")
    daemons = sorted((base / "plugins" / DRIVER / "mps").glob("shared-*"))
    for directory in daemons:
        limits = read_limits(directory / "log")
        _say(f"   → one MPS control daemon for the shared GPU ({directory.name[:20]}…), "
             f"defaults {limits.get('defaultActiveThreadPercentage')}% / "
             f"{next(iter(limits.get('defaultDevicePinnedMemLimit', {}).values()), '-')}")
    return refs


def _hardware(base: Path) -> str:
    from gpudra.driver.sim import SimControl

    gpus = SimControl(base / "plugins" / DRIVER / "sim").snapshot()["gpus"]
    mig = sum(len(g["gpu_instances"]) for g in gpus)
    on = [str(i) for i, g in enumerate(gpus) if g["mig_mode"]["current"]]
    exclusive = [str(i) for i, g in enumerate(gpus) if g["compute_mode"] == 3]
    return (f"{mig} MIG devices, MIG mode on for GPU [{', '.join(on)}], exclusive-process "
            f"compute mode on GPU [{', '.join(exclusive)}]")


def _pods(folder: str, claim: dict[str, Any], title: str) -> list[str]:
    """The example's pods that use this claim: the subject itself when it is a pod, else
    the pods of the example's folder naming the claim or its template."""
    if title.startswith("Pod "):
        return [title.removeprefix("Pod ").rpartition("/")[2]]
    name = claim["metadata"]["name"]
    pods = []
    for path in sorted(package_data.example(folder).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "Pod":
                continue
            for ref in (doc.get("spec") or {}).get("resourceClaims") or []:
                if name in (ref.get("resourceClaimName"), ref.get("resourceClaimTemplateName")):
                    pods.append(str(doc["metadata"]["name"]))
                    break
    return pods


def _create_claim(url: str, claim: dict[str, Any], allocation: dict[str, Any],
                  pods: list[str]) -> ClaimRef:
    body = {**claim, "metadata": {"name": claim["metadata"]["name"], "namespace": "default"}}
    created = _api(url, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
                   method="POST", body=body)
    # Reserved for the example's pods, as the scheduler does: prepare takes the pod names
    # from here, and `gpudra top` shows them in its POD column.
    created["status"] = {"allocation": allocation, "reservedFor": [
        {"resource": "pods", "name": pod, "uid": f"demo-pod-{pod}"} for pod in pods]}
    name = created["metadata"]["name"]
    _api(url, f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}/status",
         method="PUT", body=created)
    meta = created["metadata"]
    return ClaimRef(namespace="default", name=meta["name"], uid=meta["uid"])


def _print_cdi(base: Path, prepared: list[Any]) -> None:
    for ref in prepared:
        path = base / "cdi" / f"k8s.{DRIVER}-claim_{ref.uid}.json"
        if "mig" in ref.name and path.exists():
            spec = json.loads(path.read_text())
            device = spec["devices"][0]
            nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
            mounts = len(spec.get("containerEdits", {}).get("mounts", []))
            _say()
            _say(f"3. CDI spec for claim {ref.name} ({path.name}):")
            _say(f"   cdiVersion {spec['cdiVersion']}, kind {spec['kind']}, device "
                 f"{device['name']}")
            _say(f"   device nodes {nodes} + {mounts} driver library/binary mounts")
            _say()
            return


def _print_metrics(port: int) -> None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError as exc:
        _say(f"5. metrics unavailable: {exc}")
        return
    wanted = ("gpudra_prepare_seconds_count", "gpudra_unprepare_seconds_count",
              "gpudra_mig_operations_total", "gpudra_published_devices")
    lines = [line for line in text.splitlines() if line.startswith(wanted)]
    _say("5. metrics from /metrics:")
    for line in lines:
        _say(f"   {line}")
    _say()
