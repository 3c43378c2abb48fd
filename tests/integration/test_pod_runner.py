"""The pod runner (the kubelet stand-in for ordinary Pods) against the API stand-in over HTTP."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudra.testing.fakeapi import FakeApiServer
from gpudra.testing.pod_runner import PodRunner

NODE = "node-a"
NS = "gpudra"


def wait_until(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError("condition not met")


def pod(name: str, script: str, *, node: str = NODE, restart: str = "Never",
        env: list[dict[str, Any]] | None = None, grace: int | None = None,
        volumes: list[dict[str, Any]] | None = None,
        mounts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node, "restartPolicy": restart,
        "containers": [{"name": "main", "image": "gpudra:test",
                        "command": [sys.executable, "-c"], "args": [script],
                        "env": env or [], "volumeMounts": mounts or []}],
        "volumes": volumes or []}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def status(api: FakeApiServer, name: str) -> dict[str, Any]:
    obj = api.get("Pod", name, NS)
    return (obj or {}).get("status") or {}


def test_runs_the_command_with_env_and_host_paths_and_reports_ready(api, tmp_path):
    out = tmp_path / "out"
    script = ("import os, pathlib, time; p = pathlib.Path(os.environ['OUT']); "
              "p.write_text(os.environ['FROM_TEST'] + ' ' + os.environ['NODE'] + ' ' "
              "+ os.environ['MY_NAME']); time.sleep(60)")
    with PodRunner(api.url, NODE, env={"FROM_TEST": "given"}) as runner:
        api.put(pod("worker", script, env=[
            {"name": "OUT", "value": "/data/out"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            volumes=[{"name": "d", "hostPath": {"path": str(tmp_path),
                                                "type": "Directory"}}],
            mounts=[{"name": "d", "mountPath": "/data"}]))
        api.put(pod("elsewhere", "import time; time.sleep(60)", node="node-b"))
        pid = runner.wait_running(NS, "worker")
        wait_until(out.exists)
        assert wait_until(out.read_text) == f"given {NODE} worker"
        st = wait_until(lambda: status(api, "worker").get("phase") == "Running"
                        and status(api, "worker"))
        assert st["podIP"] == "127.0.0.1"
        assert {c["type"]: c["status"] for c in st["conditions"]}["Ready"] == "True"
        assert runner.pid(NS, "elsewhere") is None  # another node's pod
        assert list(runner.pids().values()) == [pid]
    assert not alive(pid)  # close stops every process


def test_exit_code_reaches_the_status(api):
    with PodRunner(api.url, NODE) as runner:
        api.put(pod("fails", "import sys; print('bye'); sys.exit(3)"))
        st = wait_until(lambda: status(api, "fails").get("phase") == "Failed"
                        and status(api, "fails"))
        assert st["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
        assert runner.exit_code(NS, "fails") == 3
        assert "bye" in runner.log(NS, "fails")
        api.put(pod("works", "pass"))
        wait_until(lambda: status(api, "works").get("phase") == "Succeeded")


def test_on_failure_restarts_the_container(api, tmp_path):
    marker = tmp_path / "ran"
    script = (f"import pathlib, sys, time; p = pathlib.Path({str(marker)!r}); "
              "n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1)); "
              "sys.exit(1) if n == 0 else time.sleep(60)")
    with PodRunner(api.url, NODE) as runner:
        api.put(pod("flaky", script, restart="OnFailure"))
        wait_until(lambda: marker.exists() and marker.read_text() == "2")
        runner.wait_running(NS, "flaky")
        st = wait_until(lambda: status(api, "flaky").get("phase") == "Running"
                        and status(api, "flaky")["containerStatuses"][0]["ready"]
                        and status(api, "flaky"))
        assert st["containerStatuses"][0]["restartCount"] == 1


def test_delete_sends_sigterm_then_sigkill_after_the_grace(api):
    with PodRunner(api.url, NODE, max_grace=0.5) as runner:
        api.put(pod("polite", "import time; time.sleep(60)"))
        api.put(pod("stubborn", "import signal, time; "
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"))
        polite = runner.wait_running(NS, "polite")
        stubborn = runner.wait_running(NS, "stubborn")
        api.delete("Pod", "polite", NS)
        api.delete("Pod", "stubborn", NS)
        runner.wait_gone(NS, "polite")
        runner.wait_gone(NS, "stubborn")
        assert not alive(polite) and not alive(stubborn)


def test_a_detached_runner_leaves_processes_and_a_new_one_adopts_them(api, tmp_path):
    state = tmp_path / "runner"
    first = PodRunner(api.url, NODE, state_dir=state).start()
    try:
        api.put(pod("kept", "import time; time.sleep(60)"))
        api.put(pod("dropped", "import time; time.sleep(60)"))
        api.put(pod("ends", "import sys, time; time.sleep(0.3); sys.exit(4)"))
        kept = first.wait_running(NS, "kept")
        dropped = first.wait_running(NS, "dropped")
        first.wait_running(NS, "ends")
    finally:
        first.detach()
    # The kubelet is down: pods live on; one is deleted and one ends meanwhile.
    api.delete("Pod", "dropped", NS)
    assert alive(kept) and alive(dropped)
    wait_until(lambda: (state.glob("*.exit") and True))
    with PodRunner(api.url, NODE, state_dir=state) as second:
        wait_until(lambda: not alive(dropped))
        assert second.pid(NS, "kept") == kept  # adopted: the same process
        assert alive(kept)
        st = wait_until(lambda: status(api, "ends").get("phase") == "Failed"
                        and status(api, "ends"))
        assert st["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 4
        api.delete("Pod", "kept", NS)
        second.wait_gone(NS, "kept")
        assert not alive(kept)
        # Records of deleted pods go; the pod that ended is still there, and so is its record.
        wait_until(lambda: len(list(state.glob("*.json"))) == 1)


def test_pod_without_command_fails_with_a_message(api):
    with PodRunner(api.url, NODE) as runner:
        obj = pod("no-command", "")
        del obj["spec"]["containers"][0]["command"]
        del obj["spec"]["containers"][0]["args"]
        api.put(obj)
        st = wait_until(lambda: status(api, "no-command").get("phase") == "Failed"
                        and status(api, "no-command"))
        assert "has no command" in st["message"]
        assert runner.errors


def test_no_stray_process_after_close(api):
    runner = PodRunner(api.url, NODE, max_grace=0.5).start()
    api.put(pod("one", "import time; time.sleep(60)"))
    pid = runner.wait_running(NS, "one")
    runner.close()
    assert not alive(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
