"""A shared GPU's MPS control daemon runs in a Pod of its own (``--mps-daemons pod``) and
survives the plugin: the node daemon (a real ``gpudra node`` process, the kubelet emulator
over real gRPC, the API stand-in over HTTP, the pod runner as the node's kubelet for
ordinary pods) is upgraded — stopped, then started again over the same directories — while
shares are prepared, and the clients' control daemon never stops: same process, its pipe
answers throughout, the new node daemon adopts it, and the last share's unprepare stops it.
A crash between creating the pod and committing the claim leaks nothing."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpudra.cli.main import main
from gpudra.driver import mps_process
from gpudra.driver.mps_pods import pod_name
from gpudra.driver.shares import daemon_key
from gpudra.driver.sim.commands import SimulatedCommandRunner
from gpudra.driver.sim.mps_daemon import read_limits
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from gpudra.testing.pod_runner import PodRunner
from tests.driver.test_mps import sim_daemons
from tests.integration.daemon import DRIVER, Daemon
from tests.integration.test_claim_status_daemon import entries, eventually
from tests.integration.test_shares import share_claim
from tests.mps_leaks import MARK_ENV

NAMESPACE = "gpudra-system"
POD_ARGS = ("--shareable-gpus", "all", "--mps-daemons", "pod", "--mps-image", "gpudra:test",
            "--namespace", NAMESPACE)


@pytest.fixture
def node(fake_api: FakeApiServer) -> Iterator[tuple[Daemon, PodRunner]]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    d = Daemon(fake_api.url, extra_args=POD_ARGS)
    mark = {MARK_ENV: os.environ[MARK_ENV]} if MARK_ENV in os.environ else {}
    runner = PodRunner(fake_api.url, "node-a", env=mark, max_grace=2.0).start()
    try:
        yield d, runner
    finally:
        if d.process is not None and d.process.poll() is None:
            d.stop()
        runner.close()
        for pid in sim_daemons(d.plugins):  # a failed test must not leave daemons running
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(d.base, ignore_errors=True)


def mps_pods(api: FakeApiServer) -> list[dict[str, Any]]:
    return [p for p in api.list("Pod", NAMESPACE)
            if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
            == "mps-control-daemon"]


def pipe_answers(daemon: Daemon, directory: Path) -> bool:
    """A client's look: a command through the pipe, answered by the daemon."""
    client = SimulatedCommandRunner(daemon.sim_state)
    client.run(["nvidia-cuda-mps-control"], env={
        "CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}, stdin="get_server_list\n")
    return True


def adoptions(daemon: Daemon) -> list[dict[str, Any]]:
    return [e for e in daemon.events()[-400:]
            if e.get("event") == "re-adopted MPS control daemon"]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_upgrading_the_node_daemon_never_stops_the_mps_daemon(node, fake_api, how,
                                                                   capsys):
    daemon, runner = node
    a, b = share_claim(fake_api, "share-a"), share_claim(fake_api, "share-b")
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        answer = await kubelet.prepare([a, b])
        assert all(r["error"] == "" for r in answer.values()), answer
    [pod] = mps_pods(fake_api)
    labels, meta = pod["metadata"]["labels"], pod["metadata"]
    gpu = labels[f"{DRIVER}/gpu-uuid"]
    directory = daemon.plugins / DRIVER / "mps" / daemon_key(gpu)
    assert meta["name"] == pod_name("node-a", daemon_key(gpu))
    assert labels[f"{DRIVER}/node"] == "node-a" and pod["spec"]["nodeName"] == "node-a"
    assert not meta.get("ownerReferences")  # nothing whose deletion would take it along
    pid = runner.pid(NAMESPACE, meta["name"])
    assert pid is not None
    # The pod's process is the control daemon, serving the pipe the clients' CDI specs name.
    assert mps_process.read_pid(directory / "pipe" / "nvidia-cuda-mps-control.pid") == pid
    assert sim_daemons(directory) == [pid]
    assert read_limits(directory / "log")["defaultActiveThreadPercentage"] == 50
    before = (f"\nbefore the upgrade: MPS pod {NAMESPACE}/{meta['name']} uid {meta['uid']}, "
              f"control daemon pid {pid}, node daemon pid {daemon.process.pid}")

    # The claims' status and `gpudra top` name the pod.
    where = {"runsIn": "pod", "pod": f"{NAMESPACE}/{meta['name']}"}
    for ref in (a, b):
        await eventually(lambda ref=ref: [e for e in entries(fake_api, ref)
                                          if e["data"].get("mpsControlDaemon") == where],
                         f"status.devices of {ref.name} naming the MPS pod: "
                         f"{entries(fake_api, ref)}")
    top = ["top", "--kubeconfig", str(daemon.base / "kubeconfig"), "-o", "wide"]
    assert await asyncio.to_thread(main, top) == 0  # it runs a loop of its own
    shown = capsys.readouterr().out
    header, *lines = shown[shown.index("NAMESPACE"):].splitlines()
    column = header.split().index("MPS")
    assert [line.split()[column] for line in lines] == [f"{NAMESPACE}/{meta['name']}"] * 2
    print(before)  # after `gpudra top`, whose output the test reads

    # The upgrade: the old node daemon goes (asked to, or killed), the new one starts over
    # the same directories. Meanwhile the clients' daemon serves.
    old = daemon.process.pid
    code = daemon.stop(how)
    assert code == (0 if how == signal.SIGTERM else -signal.SIGKILL)
    assert mps_process.alive(pid) and pipe_answers(daemon, directory)
    daemon.start()
    assert pipe_answers(daemon, directory)
    [again] = mps_pods(fake_api)
    assert again["metadata"]["uid"] == meta["uid"]  # the same pod: not deleted, not re-made
    assert runner.pid(NAMESPACE, meta["name"]) == pid  # the same process: never stopped
    assert sim_daemons(directory) == [pid]
    [adopted] = adoptions(daemon)
    assert adopted["pid"] == pid and adopted["where"] == f"pod {NAMESPACE}/{meta['name']}"
    print(f"after the upgrade ({signal.Signals(how).name} to node daemon {old}, new node "
          f"daemon {daemon.process.pid}): same pod uid {again['metadata']['uid']}, control "
          f"daemon pid {runner.pid(NAMESPACE, meta['name'])}, adopted: {adopted['pid']}")

    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.unprepare([b]))[b.uid]["error"] == ""
        assert runner.pid(NAMESPACE, meta["name"]) == pid  # share-a still uses it
        assert read_limits(directory / "log")["defaultActiveThreadPercentage"] == 25
        assert (await kubelet.unprepare([a]))[a.uid]["error"] == ""
    assert mps_pods(fake_api) == []  # the last share took the pod
    runner.wait_gone(NAMESPACE, meta["name"])
    assert not mps_process.alive(pid) and not directory.exists()
    print(f"after the last unprepare: pod gone, pid {pid} alive: {mps_process.alive(pid)}")
    assert daemon.stop() == 0


async def test_a_crash_after_creating_the_pod_leaks_nothing(node, fake_api):
    daemon, runner = node
    a = share_claim(fake_api, "share-a")
    daemon.env["GPUDRA_CRASH_AT"] = "prepare:after-settings"
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        with pytest.raises(grpc.aio.AioRpcError):  # the daemon dies inside the call
            await kubelet.prepare([a])
    daemon.process.wait(20)
    [pod] = mps_pods(fake_api)  # created, then the crash: nothing committed
    pid = runner.wait_running(NAMESPACE, pod["metadata"]["name"])
    daemon.stop_kubelet()
    del daemon.env["GPUDRA_CRASH_AT"]
    daemon.start()  # rolls the claim back: the pod of a GPU without shares goes
    assert mps_pods(fake_api) == []
    runner.wait_gone(NAMESPACE, pod["metadata"]["name"])
    assert not mps_process.alive(pid)
    assert daemon.stop() == 0


async def test_start_up_deletes_a_pod_of_a_gpu_without_shares(node, fake_api):
    daemon, runner = node
    a = share_claim(fake_api, "share-a")
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.prepare([a]))[a.uid]["error"] == ""
    [pod] = mps_pods(fake_api)
    assert daemon.stop() == 0
    # While the node daemon was down, a pod of a GPU without shares appeared (left by a
    # node daemon that crashed between deleting a record and deleting its pod).
    gpu_key = pod["metadata"]["labels"][f"{DRIVER}/mps-daemon"]
    text = json.dumps({k: v for k, v in pod.items() if k != "status"})
    stray = json.loads(text.replace(gpu_key, "shared-GPU-x").replace(
        pod["metadata"]["name"], pod_name("node-a", "shared-GPU-x")))
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        stray["metadata"].pop(key, None)
    for sub in ("pipe", "log", "shm"):
        (daemon.plugins / DRIVER / "mps" / "shared-GPU-x" / sub).mkdir(parents=True)
    fake_api.put(stray)
    runner.wait_running(NAMESPACE, stray["metadata"]["name"], timeout=20)
    daemon.start()
    names = [p["metadata"]["name"] for p in mps_pods(fake_api)]
    assert names == [pod["metadata"]["name"]]  # the stray one deleted, the prepared kept
    assert runner.pid(NAMESPACE, stray["metadata"]["name"]) is None
    assert not (daemon.plugins / DRIVER / "mps" / "shared-GPU-x").exists()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        assert (await kubelet.unprepare([a]))[a.uid]["error"] == ""
    assert mps_pods(fake_api) == []
    assert daemon.stop() == 0


def test_the_pod_command_runs_the_simulated_daemon_in_the_foreground(tmp_path):
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    pipe.mkdir()
    logs.mkdir()
    from gpudra.cli.main import build_parser
    from gpudra.cli.mps_daemon_cmd import command

    args = build_parser().parse_args(["mps-control-daemon", f"--pipe-dir={pipe}",
                                      f"--log-dir={logs}", "--gpu-uuid=GPU-1234", "--simulate"])
    argv, env = command(args)
    assert argv == [sys.executable, "-IS", str(mps_process.SIM_CONTROL), str(pipe), str(logs)]
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1234"
    assert env[mps_process.OWNER_ENV] == mps_process.pod_owner_mark(tmp_path)
    assert env[mps_process.OWNER_ENV] != mps_process.owner_mark(tmp_path)
