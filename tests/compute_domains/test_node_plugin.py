"""``gpudra compute-domain-node`` as the kubelet and the scheduler see it: a real process,
its sockets registered by the kubelet stand-in, the API stand-in over HTTP, simulated GB200
trays under pynvml."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudra.api.claims import ClaimRef
from gpudra.api.compute_domain import DRIVER_NAME, channel_config, daemon_config
from gpudra.driver.cdi import spec_path
from gpudra.driver.faults import CRASH_EXIT_CODE
from gpudra.driver.sim.api_fabric import set_fabric
from gpudra.testing.fakeapi import FakeApiServer
from tests.compute_domains.harness import (
    SimNode,
    allocated_claim,
    claim_ref,
    published,
    until,
)

NODE = "tray-a"
DOMAIN = "training"


@pytest.fixture
def node(fake_api: FakeApiServer, tmp_path: Path) -> Iterator[SimNode]:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    sim = SimNode(NODE, "10.0.0.1", fake_api.url, tmp_path / "net")
    try:
        yield sim
    finally:
        sim.stop()


def _domain(api: FakeApiServer, entry: str | None = None) -> str:
    stored = api.put({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": DOMAIN, "namespace": "default"},
        "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "ch"}}}})
    if entry is not None:
        _entry(api, entry)
    return str(stored["metadata"]["uid"])


def _entry(api: FakeApiServer, status: str) -> None:
    api.modify("ComputeDomain", DOMAIN, {"status": {"status": status, "nodes": [{
        "name": NODE, "ipAddress": "10.0.0.1", "cliqueID": "x.1", "index": 0,
        "status": status}]}}, "default")


def _claim(api: FakeApiServer, name: str, **kwargs: Any) -> ClaimRef:
    kwargs.setdefault("node", NODE)
    return claim_ref(api.put(allocated_claim(name, **kwargs)))


def _checkpoint(node: SimNode) -> dict[str, Any]:
    path = node.data / "compute-domain-checkpoint.json"
    return json.loads(path.read_text())["claims"] if path.exists() else {}


def _started(node: SimNode) -> SimNode:
    node.start(pods=False)
    node.wait_plugin()
    return node


def test_publishes_channels_and_daemon_slots_in_the_trays_clique(
        fake_api: FakeApiServer, node: SimNode, tmp_path: Path) -> None:
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "tray-b"}})
    other = SimNode("tray-b", "10.0.1.1", fake_api.url, tmp_path / "net",
                    profile="gb200-nvl72-rack2")
    try:
        _started(node)
        _started(other)
        mine = until(lambda: published(fake_api, NODE), "tray-a's pool")
        theirs = until(lambda: published(fake_api, "tray-b"), "tray-b's pool")
    finally:
        other.stop()
    assert sorted(mine) == sorted([f"channel-{n}" for n in range(8)]
                                  + [f"daemon-{n}" for n in range(8)])
    channel, daemon = mine["channel-3"], mine["daemon-0"]
    assert channel["attributes"]["id"] == {"int": 3}
    assert channel["bindingConditions"] == ["ComputeDomainReady"]
    assert "bindingConditions" not in daemon
    assert daemon["attributes"]["type"] == {"string": "daemon"}
    rack1 = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
    assert channel["attributes"]["cliqueID"] == {"string": f"{rack1}.4026"}
    assert channel["attributes"]["fabricClusterUUID"] == {"string": rack1}
    # Another rack is another clique: matchAttribute on cliqueID keeps a domain in one.
    assert theirs["channel-0"]["attributes"]["cliqueID"] == {
        "string": "2f1d7c4e-8a3b-4e6f-9b1a-5c7d3e9f0a12.4027"}


def test_a_tray_offers_its_channels_once_its_fabric_is_ready(
        fake_api: FakeApiServer, node: SimNode) -> None:
    from gpudra.driver import sim

    sim.install("gb200-nvl72", node.sim_state)  # the state directory, then its fabric
    sim.uninstall()
    set_fabric(node.sim_state, state="IN_PROGRESS")
    node.plugin_args = ("--fabric-poll", "0.1")
    _started(node)
    until(lambda: any(s["spec"]["driver"] == DRIVER_NAME and s["spec"]["pool"]["name"] == NODE
                      for s in fake_api.list("ResourceSlice")), "the (empty) pool")
    assert published(fake_api, NODE) == {}
    assert "the fabric is not usable" in node.log() and "InProgress" in node.log()
    # The fabric manager registers the GPUs: the channels appear without a restart.
    set_fabric(node.sim_state, state="COMPLETED")
    devices = until(lambda: published(fake_api, NODE), "the channels, once the fabric is up")
    assert len(devices) == 16
    assert "NVLink fabric changed" in node.log()


@pytest.mark.parametrize(("name", "kwargs", "says"), [
    ("bad-domain", {"device": "channel-0",
                    "parameters": {"apiVersion": "resource.nvidia.com/v1beta1",
                                   "kind": "ComputeDomainChannelConfig",
                                   "domainID": "../../etc"}}, "domainID"),
    ("bad-device", {"device": "channel-x", "parameters": None},
     "status.allocation.devices.results[0].device"),
    ("no-config", {"device": "channel-0", "parameters": None},
     "no ComputeDomainChannelConfig"),
    ("wrong-kind", {"device": "channel-0",
                    "parameters": daemon_config("6b1f0f8e-3c1a-4b7e-9d2a-5e8f7a6b5c4d")},
     "does not configure channel devices"),
    ("other-node", {"device": "channel-0", "node": "tray-z",
                    "parameters": channel_config("6b1f0f8e-3c1a-4b7e-9d2a-5e8f7a6b5c4d")},
     "no device of compute-domain.nvidia.com is allocated on node tray-a"),
    ("bad-pool", {"device": "channel-0", "node": "../tray-a",
                  "parameters": channel_config("6b1f0f8e-3c1a-4b7e-9d2a-5e8f7a6b5c4d")},
     "results[0].pool"),
])
def test_a_bad_claim_is_refused_naming_it_and_the_field_and_nothing_changes(
        fake_api: FakeApiServer, node: SimNode, name: str, kwargs: dict[str, Any],
        says: str) -> None:
    _started(node)
    ref = _claim(fake_api, name, **kwargs)
    error = node.prepare(ref)["error"]
    assert error.startswith(f"claim default/{name}:"), error
    assert says in error, error
    assert list(node.cdi_root.glob("*")) == [] if node.cdi_root.exists() else True
    assert _checkpoint(node) == {}
    assert not node.imex_root.exists() or list(node.imex_root.iterdir()) == []


def test_daemon_claim_writes_the_domains_imex_config_and_unprepare_removes_it(
        fake_api: FakeApiServer, node: SimNode) -> None:
    uid = _domain(fake_api)
    _started(node)
    ref = _claim(fake_api, "imex", device="daemon-2", request="daemon",
                 parameters=daemon_config(uid))
    answer = node.prepare(ref)
    assert answer["error"] == ""
    assert [d["device_name"] for d in answer["devices"]] == ["daemon-2"]
    where = node.imex_root / uid
    assert "IMEX_NODE_CONFIG_FILE=nodes_config.cfg" in (where / "config.cfg").read_text()
    spec = json.loads(spec_path(node.cdi_root, DRIVER_NAME, ref.uid).read_text())
    (mount,) = spec["devices"][0]["containerEdits"]["mounts"]
    assert mount["hostPath"] == str(where) and mount["containerPath"] == "/etc/nvidia-imex"
    assert _checkpoint(node)[ref.uid]["state"] == "completed"
    assert node.unprepare(ref)["error"] == ""
    assert not where.exists()
    assert not spec_path(node.cdi_root, DRIVER_NAME, ref.uid).exists()
    assert _checkpoint(node) == {}


def test_channel_claim_gets_its_device_node_once_this_nodes_daemon_is_ready(
        fake_api: FakeApiServer, node: SimNode) -> None:
    uid = _domain(fake_api)
    _started(node)
    ref = _claim(fake_api, "worker", device="channel-5", parameters=channel_config(uid))
    error = node.prepare(ref)["error"]
    assert error.startswith("claim default/worker:") and "has not joined" in error
    _entry(fake_api, "NotReady")
    assert "is 'NotReady', not Ready" in node.prepare(ref)["error"]
    assert _checkpoint(node) == {}
    _entry(fake_api, "Ready")
    answer = node.prepare(ref)
    assert answer["error"] == ""
    spec = json.loads(spec_path(node.cdi_root, DRIVER_NAME, ref.uid).read_text())
    (device,) = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert device["path"] == "/dev/nvidia-caps-imex-channels/channel5"
    assert Path(device["hostPath"]).is_file()  # the simulated device root's node
    # A retry (or a kubelet restart) is answered from the checkpoint, without the API.
    fake_api.delete("ResourceClaim", "worker", "default")
    assert node.prepare(ref) == answer
    everything = _claim(fake_api, "all", device="channel-0",
                        parameters=channel_config(uid, "All"))
    assert node.prepare(everything)["error"] == ""
    spec = json.loads(spec_path(node.cdi_root, DRIVER_NAME, everything.uid).read_text())
    paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert paths == [f"/dev/nvidia-caps-imex-channels/channel{n}" for n in range(8)]


@pytest.mark.parametrize("point", ["prepare:after-started", "prepare:after-cdi-write"])
def test_a_crash_in_prepare_is_finished_by_the_retry_or_undone_by_unprepare(
        fake_api: FakeApiServer, node: SimNode, point: str) -> None:
    uid = _domain(fake_api)
    node.env = {"GPUDRA_CRASH_AT": point}
    _started(node)
    first = _claim(fake_api, "first", device="daemon-0", request="daemon",
                   parameters=daemon_config(uid))
    second = _claim(fake_api, "second", device="daemon-1", request="daemon",
                    parameters=daemon_config(uid))
    with pytest.raises(Exception):  # noqa: B017 - the plugin died mid-call
        node.prepare(first)
    assert node.stop_plugin() == CRASH_EXIT_CODE
    assert _checkpoint(node)[first.uid]["state"] == "started"
    node.env = {}
    node.start_plugin()
    node.wait_plugin()
    assert node.prepare(first)["error"] == ""  # the kubelet's retry finishes it
    assert _checkpoint(node)[first.uid]["state"] == "completed"
    # Or: the kubelet gives up and unprepares (the other claim after the same crash).
    node.env = {"GPUDRA_CRASH_AT": point}
    node.stop_plugin()
    node.start_plugin()
    node.wait_plugin()
    with pytest.raises(Exception):  # noqa: B017
        node.prepare(second)
    node.stop_plugin()
    node.env = {}
    node.start_plugin()
    node.wait_plugin()
    assert node.unprepare(second)["error"] == ""
    assert not spec_path(node.cdi_root, DRIVER_NAME, second.uid).exists()
    assert set(_checkpoint(node)) == {first.uid}
    assert (node.imex_root / uid / "config.cfg").exists()  # the first claim still uses it


def test_a_crash_in_unprepare_is_finished_by_the_retry(
        fake_api: FakeApiServer, node: SimNode) -> None:
    uid = _domain(fake_api)
    _started(node)
    ref = _claim(fake_api, "imex", device="daemon-0", request="daemon",
                 parameters=daemon_config(uid))
    assert node.prepare(ref)["error"] == ""
    node.stop_plugin()
    node.env = {"GPUDRA_CRASH_AT": "unprepare:after-cdi-remove"}
    node.start_plugin()
    node.wait_plugin()
    with pytest.raises(Exception):  # noqa: B017
        node.unprepare(ref)
    assert node.stop_plugin() == CRASH_EXIT_CODE
    node.env = {}
    node.start_plugin()
    node.wait_plugin()
    assert node.unprepare(ref)["error"] == ""
    assert _checkpoint(node) == {}
    assert not (node.imex_root / uid).exists()


def test_an_unreadable_checkpoint_is_set_aside_and_rebuilt_from_the_cdi_specs(
        fake_api: FakeApiServer, node: SimNode) -> None:
    uid = _domain(fake_api, entry="Ready")
    _started(node)
    daemon = _claim(fake_api, "imex", device="daemon-0", request="daemon",
                    parameters=daemon_config(uid))
    channel = _claim(fake_api, "worker", device="channel-0", parameters=channel_config(uid))
    assert node.prepare(daemon)["error"] == "" and node.prepare(channel)["error"] == ""
    node.stop_plugin()
    (node.data / "compute-domain-checkpoint.json").write_text('{"version": 1, "claims": [')
    node.start_plugin()
    node.wait_plugin()
    assert "checkpoint unreadable: set aside" in node.log()
    assert [p.name.split(".unreadable-")[0] for p in node.data.glob("*.unreadable-*")] == [
        "compute-domain-checkpoint.json"]
    recovered = _checkpoint(node)
    assert {uid_: e["kind"] for uid_, e in recovered.items()} == {
        daemon.uid: "daemon", channel.uid: "channel"}
    assert recovered[daemon.uid]["domain"] == uid  # from the spec's mount
    # The kubelet's retry of a prepare finishes from the API server ...
    assert node.prepare(channel)["error"] == ""
    assert _checkpoint(node)[channel.uid]["state"] == "completed"
    # ... and its unprepare removes what the claim left, the domain's directory included.
    assert node.unprepare(daemon)["error"] == ""
    assert not (node.imex_root / uid).exists()
    assert not spec_path(node.cdi_root, DRIVER_NAME, daemon.uid).exists()
