"""MPS control daemons in pods of their own (:mod:`gpudra.driver.mps_pods`) through the
MPS manager, against the API stand-in over HTTP (our own session, on a loop of its own as in
the daemon) with the pod runner as the node's kubelet; the simulated control daemon."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from gpudra.driver import mps_process
from gpudra.driver.commands import CommandError
from gpudra.driver.mps import MpsClaim, MpsManager
from gpudra.driver.mps_pods import MpsPods, MpsPodSettings, pod_name
from gpudra.driver.sim.commands import SimulatedCommandRunner
from gpudra.driver.sim.mps_daemon import read_limits
from gpudra.kube.session import ApiSession
from gpudra.kubeletplugin.cluster.mps_pod_api import SessionPodApi
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.pod_runner import PodRunner
from tests.driver.test_mps import sim_daemons
from tests.mps_leaks import MARK_ENV

NS = "gpudra-system"
NODE = "node-a"
GPU = "GPU-11111111-2222-3333-4444-555555555555"
KEY = f"shared-{GPU}"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def pod_api(api: FakeApiServer) -> Iterator[SessionPodApi]:
    """Our pod client on a loop of its own, called from this (another) thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    session = ApiSession.for_url(api.url)
    try:
        yield SessionPodApi(session, NS, loop)
    finally:
        asyncio.run_coroutine_threadsafe(session.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def runner(api: FakeApiServer) -> Iterator[PodRunner]:
    mark = {MARK_ENV: os.environ[MARK_ENV]} if MARK_ENV in os.environ else {}
    with PodRunner(api.url, NODE, env=mark, max_grace=2.0) as pods:
        yield pods


def manager(tmp_path: Path, pod_api: SessionPodApi, **settings: object) -> MpsManager:
    pods = MpsPods(pod_api, MpsPodSettings(driver="gpu.nvidia.com", node=NODE,
                                           image="gpudra:test", **settings))  # type: ignore[arg-type]
    return MpsManager(SimulatedCommandRunner(tmp_path / "sim"), tmp_path / "mps", pods=pods)


def test_start_creates_a_pod_that_serves_and_stop_deletes_it(tmp_path, api, pod_api, runner):
    mps = manager(tmp_path, pod_api)
    daemon = mps.start(KEY, [GPU], ["set_default_active_thread_percentage 40"])
    name = pod_name(NODE, KEY)
    pod = api.get("Pod", name, NS)
    assert pod is not None
    pid = runner.pid(NS, name)
    assert pid is not None and mps.running_pid(KEY) == pid
    assert sim_daemons(daemon.directory) == [pid]
    assert read_limits(daemon.log_dir)["defaultActiveThreadPercentage"] == 40
    assert read_limits(daemon.log_dir)["devices"] == GPU  # CUDA_VISIBLE_DEVICES
    # In the pod, the daemon carries the pod's mark: the in-container checks never take it
    # for a daemon of their own (to adopt or to signal).
    assert not mps_process.is_control_daemon(pid, daemon.directory)
    labels = pod["metadata"]["labels"]
    assert labels["gpu.nvidia.com/gpu-uuid"] == GPU and labels["gpu.nvidia.com/node"] == NODE
    assert labels["gpu.nvidia.com/mps-daemon"] == KEY
    assert "securityContext" not in pod["spec"]["containers"][0]  # simulated: unprivileged
    assert mps.status(KEY) == {"runsIn": "pod", "pod": f"{NS}/{name}"}
    series = {"daemon": KEY, "gpu_uuid": GPU, "where": f"pod {NS}/{name}"}
    assert REGISTRY.get_sample_value("gpudra_mps_control_daemons", series) == 1
    # Starting again adopts what serves (a crash after the pod was made): nothing replaced.
    mps.start(KEY, [GPU], [])
    assert runner.pid(NS, name) == pid and api.get("Pod", name, NS)["metadata"]["uid"] == \
        pod["metadata"]["uid"]

    mps.stop(KEY)
    assert REGISTRY.get_sample_value("gpudra_mps_control_daemons", series) is None
    assert api.get("Pod", name, NS) is None
    runner.wait_gone(NS, name)
    assert not mps_process.alive(pid) and not daemon.directory.exists()
    mps.stop(KEY)  # idempotent


def test_reconcile_adopts_a_serving_pod_restarts_a_dead_one_and_deletes_strays(
        tmp_path, api, pod_api, runner):
    mps = manager(tmp_path, pod_api)
    other_gpu = "GPU-99999999-2222-3333-4444-555555555555"
    stray_gpu = "GPU-77777777-2222-3333-4444-555555555555"
    mps.start(KEY, [GPU], [])
    mps.start(f"shared-{other_gpu}", [other_gpu], [])
    mps.start(f"shared-{stray_gpu}", [stray_gpu], [])
    kept = runner.pid(NS, pod_name(NODE, KEY))
    # A pod whose daemon was told to quit ends (Succeeded): it is dead, not adopted.
    dead = mps.daemon_for(f"shared-{other_gpu}")
    SimulatedCommandRunner(tmp_path / "sim").run(
        ["nvidia-cuda-mps-control"], env=dead.env(), stdin="quit\n")
    runner.wait_gone(NS, pod_name(NODE, f"shared-{other_gpu}"))

    again = manager(tmp_path, pod_api)  # the node daemon restarted
    report = again.reconcile({
        KEY: MpsClaim(ref="shared GPU", uuids=(GPU,), commands=()),
        f"shared-{other_gpu}": MpsClaim(ref="other", uuids=(other_gpu,), commands=())})
    assert report.adopted == {KEY: kept}
    assert report.restarted == [f"shared-{other_gpu}"]
    assert report.stopped == [f"shared-{stray_gpu}"]
    assert api.get("Pod", pod_name(NODE, f"shared-{stray_gpu}"), NS) is None
    assert runner.pid(NS, pod_name(NODE, KEY)) == kept
    assert again.running_pid(f"shared-{other_gpu}") is not None
    for key in (KEY, f"shared-{other_gpu}"):
        again.stop(key)
    assert [p["metadata"]["name"] for p in api.list("Pod", NS)] == []


def test_a_pod_that_fails_is_an_error_naming_it_and_is_not_left(tmp_path, api, pod_api,
                                                                  runner):
    # A real node's pod whose driver root is not there: the kubelet cannot start it, as
    # with a driver root that the admin named wrong.
    mps = manager(tmp_path, pod_api, host_driver_root=tmp_path / "no-driver",
                  start_timeout=20.0)
    name = pod_name(NODE, KEY)
    with pytest.raises(CommandError, match=rf"pod {NS}/{name} ended \(Failed, exit code"):
        mps.start(KEY, [GPU], [])
    assert api.get("Pod", name, NS) is None
    assert [e for e in runner.errors if "no-driver" in e and "is not a directory" in e]


def test_a_real_nodes_pod_mounts_the_driver_root_and_is_privileged(tmp_path, pod_api):
    pods = MpsPods(pod_api, MpsPodSettings(driver="gpu.nvidia.com", node=NODE,
                                           image="gpudra:1", host_driver_root=Path("/")))
    pod = pods.pod_for(KEY, tmp_path / KEY, [GPU])
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["/usr/bin/tini", "--", "gpudra"]
    assert container["args"] == [
        "mps-control-daemon", f"--pipe-dir={tmp_path / KEY / 'pipe'}",
        f"--log-dir={tmp_path / KEY / 'log'}", f"--gpu-uuid={GPU}",
        "--driver-root=/driver-root"]
    assert container["securityContext"] == {"privileged": True}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}
    assert mounts == {"mps": str(tmp_path / KEY), "shm": "/dev/shm",
                      "driver-root": "/driver-root"}
    assert volumes == {"mps": str(tmp_path / KEY), "shm": str(tmp_path / KEY / "shm"),
                       "driver-root": "/"}
    assert pod["spec"]["nodeName"] == NODE and pod["spec"]["restartPolicy"] == "OnFailure"
    assert "ownerReferences" not in pod["metadata"]
    assert pod["spec"]["tolerations"] == [{"operator": "Exists"}]


def test_a_long_node_name_still_makes_valid_names_and_labels(pod_api):
    node = "n" * 200
    pods = MpsPods(pod_api, MpsPodSettings(driver="gpu.nvidia.com", node=node, image="x"))
    assert len(pods.name(KEY)) <= 63
    value = pods.labels(KEY, [GPU])["gpu.nvidia.com/node"]
    assert len(value) <= 63 and value != node
    assert pods.name(KEY) != MpsPods(pod_api, MpsPodSettings(
        driver="gpu.nvidia.com", node=node + "x", image="x")).name(KEY)


def test_an_api_server_that_does_not_answer_at_start_up_stops_nothing(tmp_path, api, pod_api,
                                                                      runner):
    mps = manager(tmp_path, pod_api)
    mps.start(KEY, [GPU], [])
    name = pod_name(NODE, KEY)
    pid = runner.pid(NS, name)
    api.fail_next(2, 500, resource="pods")  # the start-up list, then the pod's get
    again = manager(tmp_path, pod_api)
    report = again.reconcile({KEY: MpsClaim(ref="shared GPU", uuids=(GPU,), commands=())})
    assert report.failed == [KEY] and not report.stopped and not report.restarted
    assert runner.pid(NS, name) == pid  # nothing stopped, nothing made
    later = manager(tmp_path, pod_api).reconcile(
        {KEY: MpsClaim(ref="shared GPU", uuids=(GPU,), commands=())})
    assert later.adopted == {KEY: pid}
    again.stop(KEY)


def test_a_daemon_left_in_the_container_by_an_earlier_mode_gives_way_to_a_pod(
        tmp_path, api, pod_api, runner):
    old = MpsManager(SimulatedCommandRunner(tmp_path / "sim"), tmp_path / "mps")
    daemon = old.start(KEY, [GPU], [])
    local = old.running_pid(KEY)
    assert local is not None
    mps = manager(tmp_path, pod_api)  # the node daemon now runs with --mps-daemons pod
    report = mps.reconcile({KEY: MpsClaim(ref="shared GPU", uuids=(GPU,), commands=())})
    assert report.restarted == [KEY]
    assert not mps_process.alive(local)  # quit: one daemon per pipe directory
    pid = runner.pid(NS, pod_name(NODE, KEY))
    assert pid is not None and sim_daemons(daemon.directory) == [pid]
    assert "get_server_list" in (daemon.log_dir / "control.log").read_text()  # it answered
    mps.stop(KEY)
