"""``gpudra controller`` as a real process against the API stand-in, and the cluster around
it written the way its other actors would: claims allocated by "the scheduler", node entries
written by "the daemons", pod states by "the kubelet"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpudra.api import compute_domain as cd
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.integration.daemon import write_kubeconfig

ROOT = Path(__file__).resolve().parents[3]
DRIVER_NS = "gpudra-system"
T = TypeVar("T")
CD_PATH = "/apis/resource.nvidia.com/v1beta1/namespaces/{ns}/computedomains"


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Poll until ``probe`` gives something truthy; the assertion is on the end state, the
    timeout only stops a broken run."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class ControllerProcess:
    url: str
    base: Path
    identity: str = "controller-a"
    extra: tuple[str, ...] = ()
    process: subprocess.Popen[str] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.base / f"{self.identity}.log"

    def start(self) -> ControllerProcess:
        kubeconfig = write_kubeconfig(self.base / "kubeconfig", self.url)
        args = [sys.executable, "-m", "gpudra.cli.main", "controller",
                "--kubeconfig", str(kubeconfig), "--namespace", DRIVER_NS,
                "--daemon-image", "gpudra:test", "--daemon-service-account", "imex",
                "--identity", self.identity, "--log-format", "json",
                "--ready-timeout", "1h", "--restart-delay", "1h", *self.extra]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log.open("a") as out:
            self.process = subprocess.Popen(args, env=env, cwd=ROOT, text=True, stdout=out,
                                            stderr=subprocess.STDOUT)
        return self

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def events(self) -> list[str]:
        out = []
        for line in self.output().splitlines():
            try:
                out.append(str(json.loads(line).get("event")))
            except ValueError:
                continue
        return out

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


@contextmanager
def running(api: FakeApiServer, base: Path, **kwargs: Any) -> Iterator[ControllerProcess]:
    proc = ControllerProcess(api.url, base, **kwargs).start()
    try:
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"controller exited {code}:\n{proc.output()[-4000:]}"


# --- the cluster's other actors -------------------------------------------------------

def http(api: FakeApiServer, method: str, path: str, body: Any = None,
         content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(api.url + path, method=method, data=data,
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def create_domain(api: FakeApiServer, name: str, *, namespace: str = "team",
                  num_nodes: int = 0, template: str | None = None,
                  mode: str = "Single") -> dict[str, Any]:
    code, body = http(api, "POST", CD_PATH.format(ns=namespace), {
        "apiVersion": cd.API_VERSION, "kind": cd.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"numNodes": num_nodes, "channel": {
            "resourceClaimTemplate": {"name": template or f"{name}-channel"},
            "allocationMode": mode}}})
    assert code == 201, body
    return body


def delete_domain(api: FakeApiServer, name: str, namespace: str = "team") -> None:
    code, body = http(api, "DELETE", CD_PATH.format(ns=namespace) + f"/{name}")
    assert code == 200, body


def allocate_channel(api: FakeApiServer, domain: dict[str, Any], node: str, *,
                     name: str | None = None, device: str = "channel-0") -> dict[str, Any]:
    """A channel claim of ``domain`` as the scheduler leaves it after allocating it on
    ``node`` (binding conditions copied from the device)."""
    meta = domain["metadata"]
    uid = meta["uid"]
    params = cd.channel_config(uid, domain["spec"]["channel"].get("allocationMode", "Single"))
    return api.put({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name or f"{meta['name']}-{node}", "namespace": meta["namespace"]},
        "spec": {"devices": {
            "requests": [{"name": "channel", "exactly": {
                "deviceClassName": cd.CHANNEL_DEVICE_CLASS}}],
            "config": [{"requests": ["channel"], "opaque": {"driver": cd.DRIVER_NAME,
                                                           "parameters": params}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "channel", "driver": cd.DRIVER_NAME, "pool": node,
                         "device": device,
                         "bindingConditions": [cd.CONDITION_READY],
                         "bindingFailureConditions": [cd.CONDITION_FAILED]}],
            "config": [{"source": "FromClaim", "requests": ["channel"],
                        "opaque": {"driver": cd.DRIVER_NAME, "parameters": params}}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}})


def daemon_pods(api: FakeApiServer, uid: str) -> dict[str, dict[str, Any]]:
    """node → daemon pod of domain ``uid``."""
    return {p["metadata"]["annotations"][cd.LABEL_NODE]: p
            for p in api.list("Pod", DRIVER_NS)
            if p["metadata"].get("labels", {}).get(cd.LABEL_DOMAIN) == uid}


def condition(api: FakeApiServer, claim: dict[str, Any], kind: str) -> dict[str, Any] | None:
    meta = claim["metadata"]
    stored = api.get("ResourceClaim", meta["name"], meta["namespace"]) or {}
    for entry in (stored.get("status") or {}).get("devices") or []:
        for c in entry.get("conditions") or []:
            if c["type"] == kind:
                return dict(c)
    return None


def upsert_node_entry(api: FakeApiServer, domain: dict[str, Any], node: str, *,
                      status: str, index: int = 0, clique: str = "uuid.0") -> int:
    """What a node's daemon does: read, change only its own entry, write with the
    resourceVersion read; on 409 start over. Returns the number of conflicts met."""
    meta = domain["metadata"]
    path = CD_PATH.format(ns=meta["namespace"]) + f"/{meta['name']}"
    conflicts = 0
    while True:
        code, current = http(api, "GET", path)
        assert code == 200, current
        status_obj = dict(current.get("status") or {})
        nodes = [n for n in status_obj.get("nodes") or [] if n["name"] != node]
        nodes.append(cd.node_entry(node, ip_address=f"10.0.0.{index % 250}", clique_id=clique,
                                   index=index, status=status))  # type: ignore[arg-type]
        status_obj["nodes"] = nodes
        code, answer = http(api, "PUT", path + "/status", {**current, "status": status_obj})
        if code == 409:
            conflicts += 1
            continue
        assert code == 200, answer
        return conflicts


def concurrently(jobs: list[Callable[[], T]]) -> list[T]:
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []
    gate = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        try:
            gate.wait()
            results[i] = jobs[i]()
        except BaseException as exc:  # re-raised below, in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
