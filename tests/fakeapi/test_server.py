"""The server itself: clean shutdown under load, concurrency, and the separate-process mode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import kubernetes.client as k8s
import kubernetes.watch
import urllib3
from kubernetes.client.exceptions import ApiException

from gpudra.testing.fakeapi import samples
from gpudra.testing.fakeapi.server import FakeApiServer

ROOT = Path(__file__).resolve().parents[2]


def fake_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fakeapi-")]


def test_shutdown_ends_watches_and_keepalive_connections_and_joins_threads():
    before = fake_threads()
    api = FakeApiServer().start()
    client = k8s.ApiClient(api.configuration())
    resource = k8s.ResourceV1Api(client)
    resource.list_resource_slice()  # leaves an idle keep-alive connection behind
    w = kubernetes.watch.Watch()
    ended = threading.Event()

    def watch() -> None:
        try:
            for _ in w.stream(resource.list_resource_slice):
                pass
        except (urllib3.exceptions.HTTPError, ApiException):
            pass
        ended.set()

    thread = threading.Thread(target=watch)
    thread.start()
    while api.open_watches == 0:
        threading.Event().wait(0.01)
    api.shutdown()
    assert fake_threads() == before
    w.stop()
    thread.join(5)
    assert ended.is_set()
    client.close()
    api.shutdown()  # idempotent


def test_concurrent_read_modify_write_loses_no_update(fake_api, k8s_client):
    resource = k8s.ResourceV1Api(k8s_client)
    body = samples.resource_slice(devices=[])
    body["metadata"]["labels"] = {"n": "0"}
    resource.create_resource_slice(body)
    conflicts = 0
    lock = threading.Lock()

    def bump(times: int) -> None:
        nonlocal conflicts
        with k8s.ApiClient(fake_api.configuration()) as own:
            api = k8s.ResourceV1Api(own)
            done = 0
            while done < times:
                current = api.read_resource_slice("node-1-gpu")
                current.metadata.labels["n"] = str(int(current.metadata.labels["n"]) + 1)
                try:
                    api.replace_resource_slice("node-1-gpu", current)
                    done += 1
                except ApiException as exc:
                    assert exc.status == 409
                    with lock:
                        conflicts += 1

    threads = [threading.Thread(target=bump, args=(10,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert resource.read_resource_slice("node-1-gpu").metadata.labels["n"] == "60"
    assert fake_api.calls["update", "resourceslices"] == 60 + conflicts


def test_runs_as_a_separate_process():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen([sys.executable, "-m", "gpudra.testing.fakeapi", "--port", "0", "--node",
                           "gpu-node-1"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          text=True) as proc:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with k8s.ApiClient(k8s.Configuration(host=url)) as client:
            node = k8s.CoreV1Api(client).read_node("gpu-node-1")
            assert node.metadata.uid
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
