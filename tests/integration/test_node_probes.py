"""The daemon's /metrics, /healthz and /readyz over real HTTP."""

from __future__ import annotations

import asyncio
import shutil
import time

from gpudra.api.claims import ClaimRef
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon, claim_object, free_port
from tests.integration.daemon import http_get as get


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_probes_and_metrics(fake_api: FakeApiServer):
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    port = free_port()
    daemon = Daemon(fake_api.url, extra_args=["--http-address", f"127.0.0.1:{port}"],
                    kubelet=False)
    try:
        daemon.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                get(port, "/healthz")
                break
            except OSError:
                await asyncio.sleep(0.05)
        assert get(port, "/healthz") == (200, "ok\n")
        # the kubelet has not registered us yet, so nothing is published either
        status, body = get(port, "/readyz")
        assert status == 503
        assert "not registered with the kubelet yet\n" in body  # says why, line by line
        assert "ResourceSlices not published: waiting for the kubelet to register this " \
               "plugin\n" in body
        async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if get(port, "/readyz")[0] == 200:
                    break
                await asyncio.sleep(0.05)
            assert get(port, "/readyz") == (200, "ok\n")
            before = get(port, "/metrics")[1]
            stored = fake_api.put(claim_object("m", devices=["gpu-0-mig-1g10gb-19-0"]))
            meta = stored["metadata"]
            ref = ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
            assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
            assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
            after = get(port, "/metrics")[1]
        assert metric(after, "gpudra_prepare_seconds_count") == \
            metric(before, "gpudra_prepare_seconds_count") + 1
        assert metric(after, "gpudra_unprepare_seconds_count") >= 1
        assert 'gpudra_mig_operations_total{operation="create",outcome="ok"} 1.0' in after
        assert metric(after, "gpudra_checkpoint_write_seconds_count") > 0
        assert metric(after, "gpudra_published_devices") == 208
        assert get(port, "/nope")[0] == 404
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            assert daemon.stop() == 0
        shutil.rmtree(daemon.base, ignore_errors=True)
