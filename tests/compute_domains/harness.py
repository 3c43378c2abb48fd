"""Simulated GB200 trays for ComputeDomain tests: real processes, real sockets, real HTTP.

A :class:`SimNode` runs ``gpudra compute-domain-node`` (and, when asked, the GPU driver's
``gpudra node`` beside it, on the same simulated hardware and the same kubelet), a kubelet
stand-in that registers both over their unix sockets, and a pod runner for the node's pods
whose environment tells ``gpudra compute-domain-daemon`` which simulated node it is on.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpudra.api.claims import ClaimRef
from gpudra.api.compute_domain import DRIVER_NAME
from gpudra.testing.kubelet_emulator import BackgroundKubelet, KubeletEmulator
from gpudra.testing.pod_runner import PodRunner
from tests.integration.daemon import write_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def until(check: Callable[[], T], what: str | Callable[[], str], timeout: float = 60.0) -> T:
    """``check()`` once it is truthy; AssertionError naming ``what`` (text, or a function
    giving it, for a message that shows the state at the time out) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what if isinstance(what, str) else what()}")


@dataclass
class SimNode:
    """One simulated GB200 tray; ``stop()`` ends every process and removes its files."""

    name: str
    address: str
    url: str
    network: Path
    profile: str = "gb200-nvl72"
    gpu_daemon: bool = False
    env: dict[str, str] = field(default_factory=dict)
    plugin_args: tuple[str, ...] = ()
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="cd-", dir="/tmp")))
    process: subprocess.Popen[str] | None = None
    gpu_process: subprocess.Popen[str] | None = None
    kubelet: BackgroundKubelet | None = None
    runner: PodRunner | None = None
    log_mark: int = 0
    """Length of the plugin's log when its current process started."""

    @property
    def registrar(self) -> Path:
        return self.base / "reg"

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def imex_root(self) -> Path:
        return self.data / "imex"

    @property
    def cdi_root(self) -> Path:
        return self.base / "cdi"

    @property
    def sim_state(self) -> Path:
        return self.base / "sim"

    @property
    def kubeconfig(self) -> Path:
        return self.base / "kubeconfig"

    def start(self, *, pods: bool = True) -> SimNode:
        write_kubeconfig(self.kubeconfig, self.url)
        if self.kubelet is None:
            self.kubelet = BackgroundKubelet(self.registrar).start()
        self.start_plugin()
        if self.gpu_daemon and self.gpu_process is None:
            with (self.base / "gpu-node.log").open("a") as out:
                self.gpu_process = subprocess.Popen(
                    [sys.executable, "-m", "gpudra.cli.main", "node", "--node-name", self.name,
                     "--simulate", self.profile, "--sim-state", str(self.sim_state),
                     "--kubeconfig", str(self.kubeconfig), "--registrar-dir",
                     str(self.registrar), "--plugins-dir", str(self.base / "plugins"),
                     "--cdi-root", str(self.cdi_root), "--http-address", "",
                     "--usage-interval", "0", "--log-format", "console"],
                    env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, text=True,
                    stdout=out, stderr=subprocess.STDOUT)
        if pods and self.runner is None:
            # What the daemon pods of this node need to find the simulated node: the
            # contract's command line stays as the controller writes it.
            self.runner = PodRunner(self.url, self.name, env={
                "PYTHONPATH": str(ROOT), "KUBECONFIG": str(self.kubeconfig),
                "SIMULATE": self.profile, "SIM_STATE": str(self.sim_state),
                "GPUDRA_SIM_IMEX_NETWORK": str(self.network),
                "GPUDRA_SIM_NODE_ADDRESS": self.address,
                "GPUDRA_IMEX_ROOT": str(self.imex_root), "LOG_FORMAT": "console"}).start()
        return self

    def start_plugin(self, extra: Sequence[str] = ()) -> None:
        self.log_mark = len(self.log())
        with (self.base / "node.log").open("a") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpudra.cli.main", "compute-domain-node",
                 "--node-name", self.name, "--simulate", self.profile,
                 "--sim-state", str(self.sim_state), "--kubeconfig", str(self.kubeconfig),
                 "--registrar-dir", str(self.registrar), "--plugins-dir",
                 str(self.base / "plugins"), "--data-dir", str(self.data),
                 "--cdi-root", str(self.cdi_root), "--log-format", "console",
                 *self.plugin_args, *extra],
                env={**os.environ, "PYTHONPATH": str(ROOT), **self.env}, cwd=ROOT, text=True,
                stdout=out, stderr=subprocess.STDOUT)

    def wait_plugin(self) -> None:
        until(lambda: "compute-domain node daemon running" in self.log()[self.log_mark:]
              or (self.process is not None and self.process.poll() is not None),
              f"{self.name}'s plugin to start")
        assert self.process is not None and self.process.poll() is None, self.log()

    def log(self) -> str:
        path = self.base / "node.log"
        return path.read_text() if path.exists() else ""

    def stop_plugin(self, sig: int = signal.SIGTERM) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.close()
        for proc in (self.process, self.gpu_process):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.kubelet is not None:
            self.kubelet.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    # --- the kubelet's calls ----------------------------------------------------------------

    def prepare(self, ref: ClaimRef, driver: str = DRIVER_NAME) -> dict[str, Any]:
        async def call() -> dict[str, Any]:
            kubelet = await KubeletEmulator.discover(self.registrar)
            try:
                return dict((await kubelet.prepare([ref], driver=driver))[ref.uid])
            finally:
                await kubelet.close()

        return asyncio.run(call())

    def unprepare(self, ref: ClaimRef) -> dict[str, Any]:
        async def call() -> dict[str, Any]:
            kubelet = await KubeletEmulator.discover(self.registrar)
            try:
                return dict((await kubelet.unprepare([ref], driver=DRIVER_NAME))[ref.uid])
            finally:
                await kubelet.close()

        return asyncio.run(call())


def published(api: Any, node: str, driver: str = DRIVER_NAME) -> dict[str, dict[str, Any]]:
    """The devices ``node`` publishes for ``driver``, by name."""
    found: dict[str, dict[str, Any]] = {}
    for s in api.list("ResourceSlice"):
        if s["spec"]["driver"] == driver and s["spec"]["pool"]["name"] == node:
            for device in s["spec"].get("devices") or []:
                found[device["name"]] = device
    return found


def allocated_claim(name: str, *, node: str, device: str, parameters: dict[str, Any] | None,
                    namespace: str = "default", request: str = "channel",
                    extra_result: dict[str, Any] | None = None) -> dict[str, Any]:
    """A claim as the scheduler leaves it, for one compute-domain device."""
    config = [] if parameters is None else [{"source": "FromClaim", "requests": [request],
                                             "opaque": {"driver": DRIVER_NAME,
                                                        "parameters": parameters}}]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": request, "exactly": {
            "deviceClassName": "compute-domain-default-channel.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": request, "driver": DRIVER_NAME, "pool": node,
                         "device": device, **(extra_result or {})}],
            "config": config},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                "key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}


def claim_ref(stored: dict[str, Any]) -> ClaimRef:
    meta = stored["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])
