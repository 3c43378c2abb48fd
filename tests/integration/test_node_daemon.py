"""``gpudra node`` end to end: kubelet emulator over unix sockets, claims over real HTTP."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import AsyncIterator, Iterator

import pytest

from gpudra.api.claims import ClaimRef
from gpudra.cli.node_cmd import FATAL_EVENT
from gpudra.driver.checkpoint_store import FILE_NAME
from gpudra.driver.checkpoint_upgrade import JOURNAL_NAME
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import DRIVER, Daemon, create_claim, node_daemon

GV = "resource.nvidia.com/v1beta1"


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    with node_daemon(fake_api) as d:
        yield d


@pytest.fixture
async def kubelet(daemon: Daemon) -> AsyncIterator[KubeletEmulator]:
    daemon.start()
    emulator = await KubeletEmulator.discover(daemon.registrar)
    try:
        yield emulator
    finally:
        await emulator.close()


def cdi_spec(daemon: Daemon, ref: ClaimRef) -> dict:
    return json.loads((daemon.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json").read_text())


@pytest.mark.parametrize("count", [1, 2, 8])
async def test_prepare_and_unprepare_full_gpus(count, kubelet, daemon, fake_api):
    devices = [f"gpu-{i}" for i in range(count)]
    ref = create_claim(fake_api, "gpus", devices=devices)
    response = await kubelet.prepare([ref])
    entry = response[ref.uid]
    assert entry["error"] == ""
    assert [d["device_name"] for d in entry["devices"]] == devices
    for d in entry["devices"]:
        assert d["pool_name"] == "node-a"
        assert d["request_names"] == ["gpu"]
        assert d["cdi_device_ids"] == [f"k8s.{DRIVER}/claim={ref.uid}-{d['device_name']}"]
    spec = cdi_spec(daemon, ref)
    assert [d["name"] for d in spec["devices"]] == [f"{ref.uid}-{d}" for d in devices]
    assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
    assert list(daemon.cdi_root.glob("*.json")) == []


async def test_dynamic_mig_claim_with_subrequest(kubelet, daemon, fake_api):
    ref = create_claim(fake_api, "mig", devices=["gpu-0-mig-1g10gb-19-6"], request="mig/small")
    entry = (await kubelet.prepare([ref]))[ref.uid]
    assert entry["error"] == ""
    # the kubelet matches containers on the base request name
    assert entry["devices"][0]["request_names"] == ["mig"]
    assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""


@pytest.mark.parametrize("calls", ["one call", "a call each"])
async def test_bad_input_gets_a_per_claim_error_and_changes_nothing(kubelet, daemon, fake_api,
                                                                    calls):
    # All the claims in one call, or one claim per call: the answers must not differ.
    good = create_claim(fake_api, "good", devices=["gpu-1"])
    missing = ClaimRef("default", "nope", "00000000-0000-4000-8000-0000000000aa")
    replaced = ClaimRef("default", "good", "00000000-0000-4000-8000-0000000000bb")
    unallocated = create_claim(fake_api, "pending", allocated=False)
    other_driver = create_claim(fake_api, "other", driver="example.com")
    unknown = create_claim(fake_api, "unknown", devices=["gpu-42"])
    bad_config = create_claim(fake_api, "badcfg", devices=["gpu-2"], configs=[
        {"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": GV, "kind": "GpuConfig", "sharing": {"strategy": "Sometimes"}}}}])
    refs = [good, missing, replaced, unallocated, other_driver, unknown, bad_config]
    if calls == "one call":
        response = await kubelet.prepare(refs)
    else:
        response = {ref.uid: (await kubelet.prepare([ref]))[ref.uid] for ref in refs}
    assert response[good.uid]["error"] == ""
    expect = {
        missing.uid: "claim default/nope:00000000-0000-4000-8000-0000000000aa: not found",
        replaced.uid: "the claim was replaced",
        unallocated.uid: "not allocated (status.allocation is empty)",
        other_driver.uid: "no devices allocated for driver gpu.nvidia.com",
        unknown.uid: "device 'gpu-42' is not in this node's inventory",
        bad_config.uid: "config[0].opaque.parameters.sharing.strategy",
    }
    for uid, text in expect.items():
        assert text in response[uid]["error"], response[uid]
        assert response[uid]["devices"] == []
    # only the good claim left a CDI spec
    assert [p.name for p in daemon.cdi_root.glob("*.json")] == [
        f"k8s.{DRIVER}-claim_{good.uid}.json"]


async def test_config_for_another_driver_is_ignored(kubelet, daemon, fake_api):
    ref = create_claim(fake_api, "mixed", devices=["gpu-3"], configs=[
        {"source": "FromClaim", "requests": [], "opaque": {
            "driver": "other.example.com", "parameters": {"anything": ["goes"]}}}])
    assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""


async def test_prepare_survives_a_daemon_restart_idempotently(daemon, fake_api):
    ref = create_claim(fake_api, "sticky", devices=["gpu-4", "gpu-5-mig-3g40gb-9-0"])
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        first = (await kubelet.prepare([ref]))[ref.uid]
    assert first["error"] == ""
    assert daemon.stop() == 0
    fake_api.delete("ResourceClaim", "sticky", "default")  # the API server may be gone
    daemon.start()
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        again = (await kubelet.prepare([ref]))[ref.uid]
        assert again == first
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
        # unknown claim: success
        assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""


async def test_api_server_errors_are_per_claim_and_retryable(kubelet, daemon, fake_api):
    ref = create_claim(fake_api, "flaky", devices=["gpu-6"])
    fake_api.fail_next(1, status=503, verb="get", resource="resourceclaims")
    first = (await kubelet.prepare([ref]))[ref.uid]
    assert "API error 503" in first["error"]
    assert list(daemon.cdi_root.glob("*.json")) == []
    # the kubelet retries
    assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""


def test_sigterm_removes_sockets_and_exits_zero(daemon):
    daemon.start()
    assert len(daemon.sockets()) == 2
    assert daemon.stop() == 0
    assert daemon.sockets() == []


async def test_static_mig_devices_prepare_without_touching_the_layout(fake_api):
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    daemon = Daemon(fake_api.url, profile="dgx-a100-static-mig").start()
    try:
        from gpudra.driver.sim import SimControl

        before = SimControl(daemon.sim_state).snapshot()["gpus"]
        ref = create_claim(fake_api, "static", devices=["gpu-1-mig-1g5gb-19-3",
                                                        "gpu-0-mig-3g20gb-9-4"])
        async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
            entry = (await kubelet.prepare([ref]))[ref.uid]
            assert entry["error"] == ""
            nodes = [n["path"] for d in cdi_spec(daemon, ref)["devices"]
                     for n in d["containerEdits"]["deviceNodes"]]
            assert "/dev/nvidia1" in nodes and "/dev/nvidia0" in nodes
            assert sum(p.startswith("/dev/nvidia-caps/") for p in nodes) == 4
            assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
        after = SimControl(daemon.sim_state).snapshot()["gpus"]
        assert [g["gpu_instances"] for g in after] == [g["gpu_instances"] for g in before]
    finally:
        assert daemon.stop() == 0
        shutil.rmtree(daemon.base, ignore_errors=True)


@pytest.mark.parametrize(("extra", "message"), [
    (["--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig /nonexistent/kubeconfig: no such"),
    (["--simulate", "nosuch"], "--simulate: unknown node profile 'nosuch'"),
])
def test_start_up_errors_are_one_line_and_leave_no_socket(extra, message, fake_api):
    daemon = Daemon(fake_api.url, extra_args=extra)
    try:
        daemon.start(wait=False)
        assert daemon.process is not None
        assert daemon.process.wait(30) == 1
        # --log-format json: the error is one JSON line, like the rest of the log
        errors = daemon.fatal_errors()
        assert len(errors) == 1 and message in errors[0], daemon.output()
        assert daemon.output().count(FATAL_EVENT) == 1
        assert "Traceback" not in daemon.output()
        assert daemon.sockets() == []
        assert "serving the kubelet" not in daemon.output()  # found before the sockets were up
    finally:
        daemon.stop_kubelet()
        shutil.rmtree(daemon.base, ignore_errors=True)


def test_sigterm_during_start_up_exits_promptly(daemon):
    import time

    daemon.start(wait=False)
    time.sleep(0.3)  # still importing / discovering
    started = time.monotonic()
    # 0 once our handler is installed; a SIGTERM that beats it ends the process by default
    assert daemon.stop() in (0, -signal.SIGTERM)
    assert time.monotonic() - started < 10
    assert daemon.sockets() == []


def test_sigterm_while_discovering_devices_is_honoured(daemon):
    import time

    # A hook that makes device discovery slow, so the signal lands in the middle of it.
    daemon.env["GPUDRA_DELAY_AT"] = "start:discovery=5"
    daemon.start(wait=False)
    log = daemon.base / "node.log"
    deadline = time.monotonic() + 10
    while "discovering devices" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    started = time.monotonic()
    assert daemon.stop() == 0
    assert time.monotonic() - started < 4  # did not wait for the 5 s discovery
    assert daemon.sockets() == []


async def test_feature_gates_reach_the_device_state(fake_api):
    """--feature-gates → NodeConfig → DeviceState: an explicit computeMode is refused."""
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    daemon = Daemon(fake_api.url, extra_args=["--feature-gates", "ComputeModeSettings=false"])
    try:
        daemon.start()
        mode = create_claim(fake_api, "mode", devices=["gpu-0"], configs=[
            {"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": GV, "kind": "GpuConfig", "computeMode": "ExclusiveProcess"}}}])
        plain = create_claim(fake_api, "plain", devices=["gpu-1"])
        async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
            response = await kubelet.prepare([mode, plain])
        assert "feature gate ComputeModeSettings" in response[mode.uid]["error"]
        assert response[plain.uid]["error"] == ""
    finally:
        assert daemon.stop() == 0
        shutil.rmtree(daemon.base, ignore_errors=True)


async def test_every_commit_leaves_a_snapshot_the_previous_build_reads(
        kubelet, daemon, fake_api):
    """Calls commit by replacing the whole snapshot (version 2, no journal): a rollback to
    the previous build reads it, whether this daemon stopped cleanly or not."""
    kept = create_claim(fake_api, "kept", devices=["gpu-0"])
    gone = create_claim(fake_api, "gone", devices=["gpu-1"])
    assert (await kubelet.prepare([kept]))[kept.uid]["error"] == ""
    assert (await kubelet.prepare([gone]))[gone.uid]["error"] == ""
    assert (await kubelet.unprepare([gone]))[gone.uid]["error"] == ""
    directory = daemon.plugins / DRIVER
    snapshot = json.loads((directory / FILE_NAME).read_text())
    assert snapshot["version"] == 2
    assert list(snapshot["data"]["claims"]) == [kept.uid]
    assert not (directory / JOURNAL_NAME).exists()
    assert daemon.stop() == 0
    assert json.loads((directory / FILE_NAME).read_text()) == snapshot
