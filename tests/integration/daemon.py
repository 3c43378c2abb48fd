"""Run ``gpudra node`` as a real process against the test API server, as the kubelet sees it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudra.api.claims import ClaimRef
from gpudra.cli.node_cmd import FATAL_EVENT
from gpudra.testing.kubelet_emulator import BackgroundKubelet

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.nvidia.com"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(port: int, path: str) -> tuple[int, str]:
    """Status and body of a GET to the daemon's probe server; OSError while it is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def write_kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: fake, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: test, user: {}}]\n"
        "contexts: [{name: test, context: {cluster: fake, user: test}}]\n"
        "current-context: test\n")
    return path


@dataclass
class Daemon:
    """One ``gpudra node`` process; directories live in a short /tmp path (socket limits).

    With ``kubelet`` (the default) a kubelet emulator runs beside it, from ``start()`` to
    ``stop()``, and registers its sockets as they appear, as the kubelet's plugin watcher
    does: the daemon publishes only once registered. ``kubelet=False`` is a node whose
    kubelet is down (or a test that registers by itself).
    """

    url: str
    profile: str = "dgx-h100"
    node: str = "node-a"
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp")))
    kubelet: bool = True
    process: subprocess.Popen[str] | None = None
    background_kubelet: BackgroundKubelet | None = None
    log_mark: int = 0
    """Length of the log when the current process started (a base may be reused)."""
    python: str = sys.executable
    root: Path = ROOT
    """The checkout to run and its interpreter: another build's, for ``bench.ab_calls``."""
    dynamic_mig_flag: bool = True
    """Pass ``--dynamic-mig-gpus all`` (builds before issue 29 had no such flag: all were)."""

    @property
    def registrar(self) -> Path:
        return self.base / "reg"

    @property
    def plugins(self) -> Path:
        return self.base / "plugins"

    @property
    def cdi_root(self) -> Path:
        return self.base / "cdi"

    @property
    def sim_state(self) -> Path:
        return self.base / "sim"

    def sockets(self) -> list[Path]:
        return sorted(p for p in self.base.rglob("*.sock"))

    def start(self, *, wait: bool = True) -> Daemon:
        kubeconfig = write_kubeconfig(self.base / "kubeconfig", self.url)
        args = [
            self.python, "-m", "gpudra.cli.main", "node",
            "--node-name", self.node, "--simulate", self.profile,
            "--sim-state", str(self.sim_state), "--kubeconfig", str(kubeconfig),
            "--registrar-dir", str(self.registrar), "--plugins-dir", str(self.plugins),
            "--cdi-root", str(self.cdi_root), "--http-address", "",
            "--log-format", "json",
            *(("--dynamic-mig-gpus", "all") if self.dynamic_mig_flag else ()), *self.extra_args,
        ]
        env = {**os.environ, "PYTHONPATH": str(self.root), **self.env}
        for hook in ("GPUDRA_CRASH_AT", "GPUDRA_DELAY_AT", "GPUDRA_FAIL_AT"):
            if hook not in self.env:
                env.pop(hook, None)
        # A file, not a pipe: nobody reads a pipe while the daemon runs, and a full pipe
        # would block the daemon's logging (and so the daemon) after ~64 KiB.
        if self.kubelet and self.background_kubelet is None:
            self.background_kubelet = BackgroundKubelet(self.registrar).start()
        self.log_mark = len(self.output())
        with self.log_path.open("a") as out:
            self.process = subprocess.Popen(args, env=env, cwd=self.root, text=True, stdout=out,
                                            stderr=subprocess.STDOUT)
        if wait:
            self.wait_registered()
        return self

    def wait_registered(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        sock = self.registrar / f"{DRIVER}-reg.sock"
        while time.monotonic() < deadline:
            # Sockets come up first; "running" means the node state is ready too.
            if sock.exists() and "node daemon running" in self.output()[self.log_mark:]:
                return
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"daemon exited {self.process.returncode}:\n{self.output()}")
            time.sleep(0.02)
        raise AssertionError(f"no registration socket after {timeout}s:\n{self.output()}")

    @property
    def log_path(self) -> Path:
        return self.base / "node.log"

    def output(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        """The daemon's JSON log lines, parsed (other lines skipped)."""
        events = []
        for line in self.output().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    events.append(json.loads(line))
        return events

    def fatal_errors(self) -> list[str]:
        """The ``error`` of each fatal-error line (one per failed run)."""
        return [e["error"] for e in self.events() if e.get("event") == FATAL_EVENT]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        assert self.process is not None
        try:
            if self.process.poll() is None:
                self.process.send_signal(sig)
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        finally:
            self.stop_kubelet()
        return code

    def stop_kubelet(self) -> None:
        """The kubelet goes down (``start()`` brings a new one up)."""
        if self.background_kubelet is not None:
            self.background_kubelet.stop()
            self.background_kubelet = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    @property
    def log(self) -> str:
        return self.output()


def claim_object(
    name: str, *, devices: Sequence[str] = ("gpu-0",), request: str = "gpu", node: str = "node-a",
    driver: str = DRIVER, configs: Sequence[dict[str, Any]] = (), allocated: bool = True,
    namespace: str = "default", admin_access: bool = False,
) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it: spec plus status.allocation."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [
            {"name": request, "exactly": {"deviceClassName": "gpu.nvidia.com",
                                          "count": len(devices)}}]}},
    }
    if allocated:
        obj["status"] = {"allocation": {"devices": {
            "results": [{"request": request, "driver": driver, "pool": node, "device": d,
                         **({"adminAccess": True} if admin_access else {})}
                        for d in devices],
            "config": list(configs),
        }, "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    return obj


def create_claim(api: Any, name: str, **kwargs: Any) -> ClaimRef:
    """Store :func:`claim_object` on the test API server; its reference, uid included."""
    meta = api.put(claim_object(name, **kwargs))["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


@contextlib.contextmanager
def node_daemon(api: Any, **kwargs: Any) -> Iterator[Daemon]:
    """A (not yet started) ``Daemon`` on the test API server ``api``, whose Node object it
    creates; stopped (its kubelet too) and its directories removed afterwards."""
    daemon = Daemon(api.url, **kwargs)
    api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": daemon.node}})
    try:
        yield daemon
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
        daemon.stop_kubelet()
        shutil.rmtree(daemon.base, ignore_errors=True)
