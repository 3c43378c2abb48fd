"""Every start-up error of ``gpudra node`` is one line (one JSON object under
``--log-format json``), found before the kubelet sockets are served where it can be;
``/readyz`` says why the daemon is not ready while it starts; the first log line carries the
version and the effective feature gates. ``gpudra node`` as a real process."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import pytest

from gpudra.cli.node_cmd import FATAL_EVENT
from gpudra.testing.fakeapi.server import FakeApiServer
from tests.integration.daemon import Daemon, free_port, http_get


@pytest.fixture
def node(fake_api: FakeApiServer) -> Iterator[Callable[..., Daemon]]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    made: list[Daemon] = []

    def make(*extra: str, env: dict[str, str] | None = None) -> Daemon:
        daemon = Daemon(fake_api.url, extra_args=list(extra), env=env or {}, kubelet=False)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
        shutil.rmtree(daemon.base, ignore_errors=True)


def failed(daemon: Daemon, status: int = 1) -> str:
    """Start ``daemon``, expect it to exit with ``status``; its whole output."""
    daemon.start(wait=False)
    assert daemon.process is not None
    assert daemon.process.wait(30) == status, daemon.output()
    output = daemon.output()
    assert "Traceback" not in output
    assert daemon.sockets() == []
    return output


def assert_one_fatal_json_line(daemon: Daemon, message: str) -> None:
    output = failed(daemon)
    assert output.count(FATAL_EVENT) == 1, output
    [error] = daemon.fatal_errors()
    assert message in error, output
    [line] = [e for e in daemon.events() if e["event"] == FATAL_EVENT]
    assert line["level"] == "critical" and line["logger"] == "gpudra.node"
    assert "serving the kubelet" not in output  # found before the kubelet saw anything


def test_http_port_in_use_fails_before_the_kubelet_sockets_are_served(node):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = node("--http-address", f"127.0.0.1:{port}")
        assert_one_fatal_json_line(daemon, f"--http-address 127.0.0.1:{port}: Address already "
                                           "in use")


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: '%(server)s'%(ca)s}}]
users: [{name: test, user: {%(user)s}}]
contexts: [{name: test, context: {cluster: %(cluster)s, user: %(username)s}}]
%(current)s
"""


def kubeconfig(path: Path, *, server: str = "https://127.0.0.1:6443", ca: str = "",
               user: str = "", cluster: str = "fake", username: str = "test",
               current: str = "current-context: test") -> Path:
    path.write_text(KUBECONFIG % {"server": server, "ca": ca, "user": user,
                                  "cluster": cluster, "username": username,
                                  "current": current})
    return path


@pytest.mark.parametrize(("write", "message"), [
    (lambda p: p.with_name("missing"), "no such file"),
    (lambda p: (p.write_text("clusters: [\n"), p)[1], "not valid YAML"),
    (lambda p: (p.write_text("- a list\n"), p)[1], "not a kubeconfig"),
    (lambda p: kubeconfig(p, current=""), "no current-context"),
    (lambda p: kubeconfig(p, current="current-context: prod"),
     "current-context prod: no such context in {path} (contexts: test)"),
    (lambda p: kubeconfig(p, cluster="gone"), "context test: cluster 'gone' is not in {path}"),
    (lambda p: kubeconfig(p, username="nobody"), "user 'nobody' is not in users (known: test)"),
    (lambda p: kubeconfig(p, ca=", certificate-authority: ca.pem"),
     "cluster 'fake': certificate-authority {dir}/ca.pem: No such file or directory"),
    (lambda p: kubeconfig(p, user="client-key: ."),
     "user 'test': client-key {dir}: Is a directory"),
    (lambda p: kubeconfig(p, ca=", certificate-authority-data: 'not base64!'"),
     "cluster 'fake': certificate-authority-data is not base64"),
], ids=["missing", "yaml", "list", "no-current", "no-context", "no-cluster", "no-user",
        "ca-file", "key-dir", "ca-data"])
def test_a_bad_kubeconfig_fails_before_the_kubelet_sockets_are_served(node, write, message):
    daemon = node()
    path = write(daemon.base / "bad-kubeconfig")
    daemon.extra_args = ["--kubeconfig", str(path)]
    assert_one_fatal_json_line(
        daemon, f"--kubeconfig {path}: " + message.format(dir=daemon.base.resolve(), path=path))


def test_no_kubeconfig_outside_a_cluster_fails_before_the_sockets_are_served(node):
    daemon = node("--kubeconfig", "", env={"KUBERNETES_SERVICE_HOST": ""})
    assert_one_fatal_json_line(daemon, "no --kubeconfig given and not running in a cluster "
                                       "(KUBERNETES_SERVICE_HOST is not set)")


def test_a_fatal_error_on_the_console_is_one_plain_line(node):
    daemon = node("--kubeconfig", "/nonexistent/kubeconfig", "--log-format", "console")
    output = failed(daemon)
    errors = [line for line in output.splitlines() if line.startswith("gpudra node")]
    assert errors == ["gpudra node: --kubeconfig /nonexistent/kubeconfig: no such file"], output


def test_a_bug_at_start_up_is_one_json_line_with_its_traceback(node):
    # A malformed delay hook makes start-up raise a plain ValueError: a stand-in for a bug.
    daemon = node(env={"GPUDRA_DELAY_AT": "start:discovery=soon"})
    output = failed(daemon)
    assert output.count(FATAL_EVENT) == 1, output
    [line] = [e for e in daemon.events() if e["event"] == FATAL_EVENT]
    assert line["error"] == "ValueError: could not convert string to float: 'soon'"
    frames = line["exception"][0]["frames"]
    assert any(frame["name"] == "delay_point" for frame in frames)


@pytest.mark.parametrize(("extra", "env", "status", "message"), [
    (["--log-level", "verbose"], {}, 2,
     "gpudra node: error: argument --log-level: invalid choice: 'verbose' (choose from "
     "'debug', 'info', 'warning', 'error', 'critical') (see gpudra node --help)"),
    ([], {"LOG_LEVEL": "verbose"}, 1,
     "gpudra node: --log-level (env LOG_LEVEL): unknown level 'verbose' (choose from debug, "
     "info, warning, error, critical)"),
    (["--log-format", "xml"], {}, 2,
     "gpudra node: error: argument --log-format: invalid choice: 'xml' (choose from 'json', "
     "'console', 'auto') (see gpudra node --help)"),
    (["--registration-timeout", "0"], {}, 1, None),  # a JSON line: the format is known
])
def test_bad_log_flags_are_one_line_naming_the_choices(node, extra, env, status, message):
    daemon = node(*extra, env=env)
    output = failed(daemon, status)
    if message is None:
        assert daemon.fatal_errors() == ["--registration-timeout (env REGISTRATION_TIMEOUT): "
                                         "'0': need a number of seconds > 0"]
    else:
        assert output.splitlines() == [message]


async def _probe_until(port: int, daemon: Daemon, path: str, text: str,
                       over: str) -> tuple[int, str]:
    """The first answer of ``path`` that contains ``text``, before the daemon logs ``over``
    (the step is then done: the answer came too late). No clock: a slow machine only waits
    longer, as the delay point holds the step for as long as it takes."""
    assert daemon.process is not None
    while True:  # answers from the first moments, not only once start-up is over
        try:
            status, body = http_get(port, path)
            if text in body:
                return status, body
        except OSError:
            pass
        assert over not in daemon.output() and daemon.process.poll() is None, daemon.output()
        await asyncio.sleep(0.02)


async def test_readyz_and_healthz_say_which_start_up_step_is_running(node):
    # Before the kubelet sockets are served, both probes name the step.
    port = free_port()
    daemon = node("--http-address", f"127.0.0.1:{port}",
                  env={"GPUDRA_DELAY_AT": "start:sockets=3"})
    daemon.start(wait=False)
    step = "starting: serving the kubelet sockets\n"
    assert await _probe_until(port, daemon, "/readyz", "serving",
                              over="serving the kubelet") == (503, step)
    assert http_get(port, "/healthz") == (503, step)
    daemon.wait_registered()
    assert http_get(port, "/healthz") == (200, "ok\n")


async def test_while_devices_are_discovered_readyz_names_the_step_and_healthz_is_ok(node):
    # The sockets are served before discovery: liveness is then GetInfo, which answers.
    port = free_port()
    daemon = node("--http-address", f"127.0.0.1:{port}",
                  env={"GPUDRA_DELAY_AT": "start:discovery=3"})
    daemon.start(wait=False)
    step = "starting: discovering devices and reconciling the checkpoint\n"
    # (it may catch "loading the driver" or "opening NVML" first)
    assert await _probe_until(port, daemon, "/readyz", "discovering",
                              over="node daemon running") == (503, step)
    assert http_get(port, "/healthz") == (200, "ok\n")
    daemon.wait_registered()
    assert http_get(port, "/readyz")[0] == 503  # no kubelet here: not registered, nothing
    assert "starting:" not in http_get(port, "/readyz")[1]  # published; but started


def test_the_first_log_line_names_the_version_and_the_feature_gates(node):
    daemon = node("--feature-gates", "MPSSupport=false").start()
    first = daemon.events()[0]
    assert first["event"] == "starting node daemon"
    assert first["version"] == metadata.version("gpudra")
    assert first["feature_gates"] == {"DynamicMIG": True, "TimeSlicingSettings": True,
                                      "MPSSupport": False, "ComputeModeSettings": True,
                                      "DeviceHealthCheck": True, "ConsumableCapacity": True,
                                      "PassthroughSupport": False}
    assert daemon.stop() == 0


# --- files the daemon reads or writes at start-up (issue 27 items 9 and 10) --------------


def test_a_checkpoint_version_of_400_digits_is_named_not_printed_whole(node):
    daemon = node()
    data_dir = daemon.plugins / "gpu.nvidia.com"
    data_dir.mkdir(parents=True)
    checkpoint = data_dir / "checkpoint.json"
    huge = "9" * 400
    checkpoint.write_text('{"kind": "GpudraCheckpoint", "version": ' + huge + ', "data": {}}')
    output = failed(daemon)
    [error] = daemon.fatal_errors()
    assert str(checkpoint) in error, output
    assert "9" * 40 not in output  # bounded: no line carries the number whole
    assert "400-digit" in error, output


def _data_dir_is_a_file(daemon: Daemon) -> Path:
    daemon.plugins.mkdir(parents=True)
    path = daemon.plugins / "gpu.nvidia.com"
    path.write_text("not a directory")
    return path


def _cdi_root_is_a_file(daemon: Daemon) -> Path:
    daemon.cdi_root.write_text("not a directory")
    return daemon.cdi_root


def _checkpoint_is_a_directory(daemon: Daemon) -> Path:
    path = daemon.plugins / "gpu.nvidia.com" / "checkpoint.json"
    path.mkdir(parents=True)
    return path


def _lock_dir_is_a_file(daemon: Daemon) -> Path:
    data = daemon.plugins / "gpu.nvidia.com"
    data.mkdir(parents=True)
    (data / "gpu-locks").write_text("not a directory")
    return data / "gpu-locks"


@pytest.mark.parametrize(("make", "hint"), [
    (_data_dir_is_a_file, ""), (_cdi_root_is_a_file, "point --cdi-root (env CDI_ROOT) at"),
    (_checkpoint_is_a_directory, "move it aside"), (_lock_dir_is_a_file, "move it aside"),
], ids=["data-dir-file", "cdi-root-file", "checkpoint-dir", "lock-dir-file"])
def test_a_path_of_the_wrong_kind_is_one_line_naming_it(node, make, hint):
    daemon = node()
    path = make(daemon)
    daemon.start(wait=False)
    assert daemon.process is not None
    with contextlib.suppress(subprocess.TimeoutExpired):  # or it starts and says so
        daemon.process.wait(15)
    output = daemon.output()
    assert "Traceback" not in output, output
    if daemon.process.poll() is None:
        assert str(path) in output, output  # started: the problem is said, naming the file
        return
    [error] = daemon.fatal_errors()
    assert str(path) in error and hint in error, output  # the file, and what to do
    assert output.count(FATAL_EVENT) == 1
