"""Per-claim usage end to end: load in the simulator → the real daemon's ``/metrics``."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudra.api.claims import ClaimRef
from gpudra.cli.main import main
from gpudra.driver.sim import SimControl
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import Daemon, claim_object, free_port, http_get, node_daemon

GIB = 2**30
Sample = dict[str, str]


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    port = free_port()
    with node_daemon(fake_api, extra_args=("--http-address", f"127.0.0.1:{port}",
                                           "--usage-interval", "100ms",
                                           "--idle-after", "1s")) as d:
        d.port = port  # type: ignore[attr-defined]
        yield d


@pytest.fixture
async def kubelet(daemon: Daemon) -> AsyncIterator[KubeletEmulator]:
    daemon.start()
    emulator = await KubeletEmulator.discover(daemon.registrar)
    try:
        yield emulator
    finally:
        await emulator.close()


def create_claim(api: FakeApiServer, name: str, pod: str, **kwargs: object) -> ClaimRef:
    obj = claim_object(name, **kwargs)  # type: ignore[arg-type]
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": pod,
                                     "uid": "11111111-2222-4333-8444-555555555555"}]
    meta = api.put(obj)["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def series(daemon: Daemon, name: str) -> list[tuple[Sample, float]]:
    status, text = http_get(daemon.port, "/metrics")  # type: ignore[attr-defined]
    assert status == 200
    return [(dict(s.labels), s.value) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


def wait_for(daemon: Daemon, name: str, match: Callable[[Sample, float], bool],
             timeout: float = 10.0) -> tuple[Sample, float]:
    deadline = time.monotonic() + timeout
    while True:
        found = [(labels, value) for labels, value in series(daemon, name)
                 if match(labels, value)]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no {name} matched; have {series(daemon, name)}")
        time.sleep(0.05)


async def test_full_gpu_load_reaches_metrics_and_goes_with_the_claim(kubelet, daemon, fake_api):
    ref = create_claim(fake_api, "train", "trainer-0", devices=["gpu-2"])
    assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
    sim = SimControl(daemon.sim_state)
    sim.set_load(2, sm_percent=80, memory_bytes=20 * GIB)

    labels, _ = wait_for(daemon, "gpudra_claim_sm_utilization_percent",
                         lambda labels, value: value == 80)
    assert labels == {"namespace": "default", "claim": "train", "pod": "trainer-0",
                      "device": "gpu-2", "gpu_uuid": sim.gpu_uuid(2), "mig_profile": "",
                      "share_id": ""}
    assert [v for _, v in series(daemon, "gpudra_claim_memory_used_bytes")] == [20 * GIB]
    (total,) = [v for _, v in series(daemon, "gpudra_claim_memory_total_bytes")]
    assert 79 * GIB < total < 81 * GIB  # an H100 80GB (81559 MiB)
    power = [v for _, v in series(daemon, "gpudra_claim_power_watts")]
    assert len(power) == 1 and power[0] > 60
    assert [v for _, v in series(daemon, "gpudra_claim_idle_seconds")] == [0.0]

    assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    deadline = time.monotonic() + 10
    names = ("gpudra_claim_sm_utilization_percent", "gpudra_claim_memory_used_bytes",
             "gpudra_claim_memory_total_bytes", "gpudra_claim_power_watts",
             "gpudra_claim_idle_seconds")
    while any(series(daemon, n) for n in names):
        assert time.monotonic() < deadline, "series of an unprepared claim stayed"
        await asyncio.sleep(0.05)


async def test_idle_after_shortened_time_and_activity_clears_it(kubelet, daemon, fake_api):
    ref = create_claim(fake_api, "notebook", "jupyter-0", devices=["gpu-1"])
    assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
    sim = SimControl(daemon.sim_state)
    sim.set_load(1, sm_percent=2, memory_bytes=GIB)  # under the 5 % default threshold
    _, idle = wait_for(daemon, "gpudra_claim_idle_seconds",
                       lambda labels, value: value >= 1.0)
    assert idle >= 1.0
    sim.set_load(1, sm_percent=50)
    wait_for(daemon, "gpudra_claim_idle_seconds", lambda labels, value: value == 0)


async def test_mig_device_on_hopper_reports_its_own_sm_through_gpm(kubelet, daemon, fake_api):
    ref = create_claim(fake_api, "small", "infer-0", devices=["gpu-0-mig-1g10gb-19-6"],
                       request="mig")
    assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
    sim = SimControl(daemon.sim_state)
    (gi,) = sim.snapshot()["gpus"][0]["gpu_instances"]
    mig_uuid = gi["compute_instances"][0]["uuid"]
    sim.set_load(0, mig_uuid=mig_uuid, sm_percent=40, memory_bytes=3 * GIB)

    labels, _ = wait_for(daemon, "gpudra_claim_sm_utilization_percent",
                         lambda labels, value: value == 40)
    assert labels["mig_profile"] == "1g.10gb"
    assert labels["device"] == "gpu-0-mig-1g10gb-19-6"
    assert [v for _, v in series(daemon, "gpudra_claim_memory_used_bytes")] == [3 * GIB]
    assert series(daemon, "gpudra_claim_power_watts") == []  # no per-MIG power in NVML



async def test_top_shows_the_claims_of_a_live_daemon_and_names_an_unreachable_one(
        kubelet, daemon, fake_api, capsys):
    busy = create_claim(fake_api, "train", "trainer-0", devices=["gpu-2"])
    quiet = create_claim(fake_api, "notebook", "jupyter-0", devices=["gpu-5"])
    answers = await kubelet.prepare([busy, quiet])
    assert [answers[r.uid]["error"] for r in (busy, quiet)] == ["", ""]
    sim = SimControl(daemon.sim_state)
    sim.set_load(2, sm_percent=90, memory_bytes=30 * GIB)
    sim.set_load(5, sm_percent=1, memory_bytes=GIB)
    wait_for(daemon, "gpudra_claim_idle_seconds", lambda labels, value: value >= 1.0)
    wait_for(daemon, "gpudra_claim_sm_utilization_percent", lambda labels, value: value == 90)
    live = f"http://127.0.0.1:{daemon.port}"  # type: ignore[attr-defined]
    dead = f"http://127.0.0.1:{free_port()}"

    assert main(["top", "--endpoint", live, "--endpoint", dead]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAMESPACE", "CLAIM", "POD", "DEVICE", "SM%", "MEMORY", "POWER",
                              "IDLE"]
    assert out[1].split()[:6] == ["default", "train", "trainer-0", "gpu-2", "90", "30.0/79.6Gi"]
    assert out[1].split()[7] == "-"
    assert out[2].split()[:5] == ["default", "notebook", "jupyter-0", "gpu-5", "1"]
    assert out[2].split()[7].endswith("s")  # idle for seconds
    assert out[3].startswith(f"{dead}: unreachable (") and "refused" in out[3]
    assert "Traceback" not in "\n".join(out)

    assert main(["top", "--endpoint", live, "--sort", "idle", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [c["claim"] for c in document["claims"]] == ["notebook", "train"]
    first = document["claims"][0]
    assert first["pods"] == ["jupyter-0"] and first["idleSeconds"] >= 1
    assert first["gpuUUID"] == sim.gpu_uuid(5) and first["migProfile"] is None
    assert document["unreachable"] == []

    assert main(["top", "--endpoint", live, "--watch", "--interval", "0.05", "--count", "2",
                 "-o", "yaml"]) == 0
    assert capsys.readouterr().out.count("claims:") == 2


def test_top_with_only_unreachable_daemons_fails_with_a_line_not_a_traceback(capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["top", "--endpoint", dead]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{dead}: unreachable (")
    assert captured.err == ""


async def test_mig_device_before_hopper_has_memory_and_no_sm_figure(fake_api):
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    port = free_port()
    daemon = Daemon(fake_api.url, profile="dgx-a100",
                    extra_args=("--allow-mig-mode-change", "all",  # A100: MIG mode is off
                                "--http-address", f"127.0.0.1:{port}",
                                "--usage-interval", "100ms", "--idle-after", "1s"))
    daemon.port = port  # type: ignore[attr-defined]
    daemon.start()
    kubelet = await KubeletEmulator.discover(daemon.registrar)
    try:
        ref = create_claim(fake_api, "small", "infer-0", devices=["gpu-1-mig-1g5gb-19-3"],
                           request="mig")
        assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
        sim = SimControl(daemon.sim_state)
        (gi,) = sim.snapshot()["gpus"][1]["gpu_instances"]
        sim.set_load(1, mig_uuid=gi["compute_instances"][0]["uuid"], sm_percent=60,
                     memory_bytes=GIB)
        labels, _ = wait_for(daemon, "gpudra_claim_memory_used_bytes",
                             lambda labels, value: value == GIB)
        assert labels["mig_profile"] == "1g.5gb"
        assert series(daemon, "gpudra_claim_sm_utilization_percent") == []  # NVML has none
        await asyncio.sleep(1.3)  # holding memory counts as busy: never idle on a guess
        assert [v for _, v in series(daemon, "gpudra_claim_idle_seconds")] == [0.0]
        sim.set_load(1, mig_uuid=gi["compute_instances"][0]["uuid"], sm_percent=0)
        wait_for(daemon, "gpudra_claim_idle_seconds", lambda labels, value: value >= 1.0)
    finally:
        await kubelet.close()
        daemon.stop()
        shutil.rmtree(daemon.base, ignore_errors=True)


def test_top_cluster_wide_reads_claim_status_and_joins_daemon_figures(fake_api, capsys, tmp_path):
    from tests.integration.daemon import write_kubeconfig

    claim = claim_object("notebook", devices=["gpu-3"])
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "jupyter-0",
                                       "uid": "11111111-2222-4333-8444-555555555555"}]
    claim["status"]["devices"] = [{
        "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-3",
        "data": {"uuid": "GPU-3"},
        "conditions": [{"type": "Idle", "status": "True", "reason": "BelowThreshold",
                        "message": "idle", "lastTransitionTime": "2020-01-01T00:00:00Z",
                        "observedGeneration": 1}]}]
    fake_api.put(claim)
    other = claim_object("train", devices=["gpu-0"], node="node-b")
    other["status"]["devices"] = [{"driver": "other.example.com", "pool": "node-b",
                                   "device": "gpu-0"}]
    fake_api.put(other)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake_api.url)
    dead = f"http://127.0.0.1:{free_port()}"

    assert main(["top", "--kubeconfig", str(kubeconfig), "--endpoint", dead]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAMESPACE", "CLAIM", "POD", "NODE", "DEVICE", "SM%", "MEMORY",
                              "POWER", "IDLE"]
    row = out[1].split()
    assert row[:8] == ["default", "notebook", "jupyter-0", "node-a", "gpu-3", "n/a", "-", "-"]
    assert row[8].endswith(("d", "h")) and "d" in row[8]  # idle since 2020: days
    assert out[2].startswith(f"{dead}: unreachable (")
    assert len(out) == 3  # another driver's entry is not ours
