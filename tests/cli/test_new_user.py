"""What a new user tripped on (issue 30, item 7), each with the test that keeps it fixed:
YAML output without anchors, ``sim`` without a state directory, the README's examples as
written, ``wait-for-driver``'s deadline and missing roots, ``inventory``'s root and share
flags, a stable ``nvlinkDomain``, the demo on every profile, ``explain``'s share hint and
holder names, and an examples index that lists every example."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from gpudra.cli.main import main
from gpudra.cli.output import emit
from gpudra.driver import sim

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def _detach(monkeypatch):
    for name in ("SIM_STATE", "SIMULATE", "DRIVER_ROOT", "DEV_ROOT", "SHAREABLE_GPUS",
                 "FEATURE_GATES", "DYNAMIC_MIG_GPUS"):
        monkeypatch.delenv(name, raising=False)
    yield
    sim.uninstall()


def run(capsys, *words: str) -> tuple[int, str, str]:
    try:
        code = main(list(words))
    except SystemExit as done:
        code = int(done.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _no_anchors(text: str) -> None:
    tokens = list(yaml.scan(text))
    assert not [t for t in tokens if isinstance(t, yaml.AnchorToken | yaml.AliasToken)]


# --- -o yaml ------------------------------------------------------------------------------

def test_yaml_output_has_no_anchors_or_aliases(capsys):
    code, out, _ = run(capsys, "inventory", "--simulate", "dgx-a100", "-o", "yaml")
    assert code == 0
    _no_anchors(out)
    code, as_json, _ = run(capsys, "inventory", "--simulate", "dgx-a100", "-o", "json")
    assert yaml.safe_load(out) == json.loads(as_json)  # the same document, written out


def test_emit_writes_shared_objects_out_in_full(capsys):
    shared = {"productName": {"string": "NVIDIA A100"}}
    emit({"devices": [{"attributes": shared}, {"attributes": shared}]}, "yaml")
    out = capsys.readouterr().out
    _no_anchors(out)
    assert out.count("productName") == 2


# --- sim without --sim-state, and the README's sim load -----------------------------------

@pytest.mark.parametrize("action", [["load", "--gpu", "0", "--sm", "85"],
                                    ["xid", "--gpu", "0", "--xid", "79"]])
def test_sim_without_a_state_directory_is_a_usage_error(capsys, action):
    code, _, err = run(capsys, "sim", *action)
    assert code == 2
    assert "--sim-state: required" in err and "SIM_STATE" in err


def test_sim_on_a_directory_without_a_node_is_a_usage_error(capsys, tmp_path):
    code, _, err = run(capsys, "sim", "load", "--sim-state", str(tmp_path / "none"),
                       "--gpu", "0", "--sm", "85")
    assert code == 2 and "--sim-state: " in err


def _readme_commands(text: str, command: str) -> list[list[str]]:
    """Every ``gpudra <command> …`` line of the README's console blocks, as argv."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        for line in block.splitlines():
            words = shlex.split(line.removeprefix("$ "))
            if len(words) > 1 and words[0].endswith("gpudra") and words[1] == command:
                found.append(words[1:])
    return found


def test_readme_sim_load_works_as_written(simulate, sim_state, capsys):
    (words,) = _readme_commands(README.read_text(), "sim")
    assert words[:2] == ["sim", "load"]
    # The README names the chart's state directory; here a simulated node's, elsewhere.
    at = words.index("--sim-state")
    simulate("dgx-h100")
    words[at + 1] = str(sim_state)
    code, out, err = run(capsys, *words)
    assert code == 0, err
    assert out.startswith("load on GPU 0")
    [load] = sim.SimControl(sim_state).snapshot()["gpus"][0]["loads"]
    assert load["sm_percent"] == 85 and load["memory_bytes"] == 42 * 2**30


@pytest.mark.parametrize("readme", [README, EXAMPLES / "README.md"],
                         ids=["README", "examples-README"])
def test_readme_explain_examples_are_allocatable(capsys, monkeypatch, readme):
    monkeypatch.chdir(ROOT)
    commands = _readme_commands(readme.read_text(), "explain")
    assert commands
    for words in commands:
        code, out, err = run(capsys, *words)
        assert code == 0, f"{shlex.join(words)}: {out}{err}"
        assert "ALLOCATABLE" in out.splitlines()[-1]


# --- wait-for-driver ----------------------------------------------------------------------

class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_wait_for_driver_never_sleeps_past_its_timeout(tmp_path):
    from gpudra.driver.driver_root import DriverRoot
    from gpudra.driver.driver_wait import wait_for_driver

    time = FakeTime()
    root = DriverRoot(tmp_path / "driver", dev_root=tmp_path / "dev")
    missing = wait_for_driver(root, timeout=3, interval=5, sleep=time.sleep, clock=time.clock)
    assert missing and time.slept == [3]  # not the 5 s interval
    time = FakeTime()
    wait_for_driver(root, timeout=12, interval=5, sleep=time.sleep, clock=time.clock)
    assert time.slept == [5, 5, 2]


def test_wait_for_driver_says_when_the_root_itself_is_missing(tmp_path, capsys):
    code, _, err = run(capsys, "wait-for-driver", f"--driver-root={tmp_path}/nowhere",
                       f"--dev-root={tmp_path}", "--timeout=0.01", "--interval=0.01")
    assert code == 1
    assert f"driver root {tmp_path}/nowhere does not exist (wrong --driver-root?" in err
    assert "libcuda.so.1 not found" not in err  # one line for the root, not one per file
    code, _, err = run(capsys, "wait-for-driver", f"--driver-root={tmp_path}",
                       f"--dev-root={tmp_path}/nodev", "--timeout=0.01", "--interval=0.01")
    assert f"device root {tmp_path}/nodev does not exist (wrong --dev-root?)" in err


# --- inventory's flags ----------------------------------------------------------------------

def test_inventory_takes_the_roots_and_names_them_when_nvml_fails(tmp_path, capsys,
                                                                    monkeypatch):
    code, _, err = run(capsys, "inventory", "--driver-root", str(tmp_path / "driver"),
                       "--dev-root", str(tmp_path))
    assert code == 1
    assert f"driver root {tmp_path}/driver does not exist" in err
    # In the plugin pod, `kubectl exec … -- gpudra inventory` reads them from the environment.
    monkeypatch.setenv("DRIVER_ROOT", str(tmp_path / "driver-root"))
    monkeypatch.setenv("DEV_ROOT", str(tmp_path))
    code, _, err = run(capsys, "inventory")
    assert code == 1 and f"driver root {tmp_path}/driver-root does not exist" in err


def test_inventory_takes_shareable_gpus(capsys, monkeypatch):
    code, out, _ = run(capsys, "inventory", "--simulate", "l4-x4", "--shareable-gpus", "1")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()[1:] if line.strip()]
    assert "gpu-1-shared" in names and "gpu-0-shared" not in names
    monkeypatch.setenv("SHAREABLE_GPUS", "all")
    code, out, _ = run(capsys, "inventory", "--simulate", "l4-x4", "-o", "json")
    devices = [d["name"] for s in json.loads(out)["items"] for d in s["spec"].get("devices", [])]
    assert sum(name.endswith("-shared") for name in devices) == 4
    code, _, err = run(capsys, "inventory", "--simulate", "l4-x4", "--shareable-gpus", "9x")
    assert code == 2 and "shareable" in err


# --- nvlinkDomain ---------------------------------------------------------------------------

def _domains(capsys, state: Path) -> dict[str, str]:
    code, out, _ = run(capsys, "inventory", "--simulate", "dgx-h100", "--sim-state", str(state),
                       "-o", "json")
    assert code == 0
    return {d["name"]: d["attributes"]["nvlinkDomain"]["string"]
            for s in json.loads(out)["items"] for d in s["spec"].get("devices", [])
            if "nvlinkDomain" in d["attributes"]}


def test_nvlink_domain_stays_when_a_gpu_goes_missing(capsys, sim_state):
    before = _domains(capsys, sim_state)
    assert len(set(before.values())) == 1 and len(before) == 8
    assert run(capsys, "sim", "remove-gpu", "--sim-state", str(sim_state), "--gpu", "3")[0] == 0
    after = _domains(capsys, sim_state)
    assert "gpu-3" not in after and len(after) == 7
    assert after == {name: domain for name, domain in before.items() if name != "gpu-3"}
    assert run(capsys, "sim", "insert-gpu", "--sim-state", str(sim_state), "--gpu", "3")[0] == 0
    assert _domains(capsys, sim_state) == before


# --- explain ----------------------------------------------------------------------------------

def test_explain_hints_at_shareable_gpus_when_no_node_publishes_shares(capsys):
    code, out, _ = run(capsys, "explain", str(EXAMPLES / "fractional-gpu"), "--simulate",
                       "dgx-h100")
    assert code == 1
    assert "hint: no node publishes shared GPUs" in out and "--shareable-gpus" in out
    code, out, _ = run(capsys, "explain", str(EXAMPLES / "fractional-gpu"), "--simulate",
                       "dgx-h100", "--shareable-gpus", "all")
    assert code == 0 and "no node publishes shared GPUs" not in out
    code, out, _ = run(capsys, "explain", str(EXAMPLES / "single-gpu"), "--simulate", "l4-x4")
    assert "shared GPUs" not in out  # only for claims that ask for a share


BOTH = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: both}
spec:
  devices:
    requests:
    - name: share
      exactly:
        deviceClassName: gpu-share.nvidia.com
        capacity: {requests: {memory: 4Gi}}
    - name: whole
      exactly: {deviceClassName: gpu.nvidia.com}
"""


def test_explain_names_the_share_that_holds_a_gpu_in_the_claim(capsys, tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text(BOTH)
    code, out, _ = run(capsys, "explain", str(path), "--simulate", "t4-x1",
                       "--shareable-gpus", "all", "--dynamic-mig-gpus", "all")
    assert code == 1
    verdict = out.splitlines()[-1]
    assert "held by shared device gpu-0-shared, which request share takes" in verdict
    assert "counter" not in verdict.split("(the same GPU")[0]


def test_explain_names_an_allocated_share_not_a_copy_engine_counter(simulate, sim_state):
    from gpudra.cli.explain_cmd import Cluster, simulated_cluster
    from gpudra.cli.main import build_parser
    from gpudra.scheduling.allocator import Allocator
    from gpudra.scheduling.explain import explain
    from gpudra.scheduling.explain_subjects import subjects

    args = build_parser().parse_args(["explain", "x", "--simulate", "dgx-h100",
                                      "--sim-state", str(sim_state), "--shareable-gpus", "0",
                                      "--dynamic-mig-gpus", "0"])
    cluster: Cluster = simulated_cluster(args)
    share = yaml.safe_load(BOTH)
    share["spec"]["devices"]["requests"] = share["spec"]["devices"]["requests"][:1]
    taken = Allocator(cluster.slices, cluster.device_classes).allocate(share, cluster.nodes[0])
    assert taken.result is not None
    whole = yaml.safe_load(BOTH)
    whole["spec"]["devices"]["requests"] = [{"name": "g", "exactly": {
        "deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].uuid == '"
                               + sim.SimControl(sim_state).gpu_uuid(0) + "'"}}]}}]
    (subject,), _ = subjects([whole])
    allocator = Allocator(cluster.slices, cluster.device_classes, [taken.result])
    explanation = explain(subject, allocator, cluster.nodes)
    assert not explanation.allocatable
    assert "held by allocated shared device gpu-0-shared (the same GPU: counter set " \
        "gpu-0-counter-set)" in explanation.verdict
    assert "copy-engines" not in explanation.verdict


def test_explain_says_its_device_counts_are_per_node(capsys):
    code, out, _ = run(capsys, "explain", str(EXAMPLES / "fractional-gpu" / "claims.yaml"),
                       "--simulate", "l4-x4", "--nodes", "3")
    assert code == 1
    summary = [line.strip() for line in out.splitlines() if "devices usable" in line]
    assert "0 devices usable" in summary  # the request, over all three nodes
    verdict = out.splitlines()[-1]
    assert "0 of 4 devices usable" in verdict and verdict.endswith("(on each of the 3 nodes)")


# --- examples/README ---------------------------------------------------------------------------

def test_examples_readme_lists_every_example():
    index = (EXAMPLES / "README.md").read_text()
    listed = set(re.findall(r"^\| `([^`/]+)/` \|", index, re.M))
    folders = {p.name for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith(".")
               and not p.name.startswith("__")}
    assert folders == listed


def test_inventory_shows_the_daemons_held_taint(capsys, tmp_path, sim_state):
    """What the node daemon holds for claims it cannot name (its held-unknown.json) is
    tainted in inventory as in its slices; the TAINTS column appears once a device has one."""
    code, out, _ = run(capsys, "inventory", "--simulate", "l4-x4", "--sim-state", str(sim_state),
                       "--plugins-dir", str(tmp_path))
    assert code == 0 and "TAINTS" not in out.splitlines()[0]
    uuid = sim.SimControl(sim_state).gpu_uuid(2)
    data = tmp_path / "gpu.nvidia.com"
    data.mkdir()
    (data / "held-unknown.json").write_text(json.dumps({"held": [
        {"kind": "compute-mode", "reason": "a checkpoint that could not be read",
         "gpu": uuid, "minor": 2}]}))
    code, out, _ = run(capsys, "inventory", "--simulate", "l4-x4", "--sim-state", str(sim_state),
                       "--plugins-dir", str(tmp_path), "--shareable-gpus", "2")
    assert code == 0
    header, *rows = [line.split() for line in out.splitlines() if line.strip()][:-1]
    assert header[-1] == "TAINTS"
    taints = {row[0]: row[-1] for row in rows}
    assert taints["gpu-2"] == taints["gpu-2-shared"] == "gpu.nvidia.com/held-unknown:NoSchedule"
    assert taints["gpu-0"] == "-"
    code, out, _ = run(capsys, "inventory", "--simulate", "l4-x4", "--sim-state", str(sim_state),
                       "--plugins-dir", str(tmp_path), "-o", "json")
    tainted = {d["name"] for s in json.loads(out)["items"] for d in s["spec"].get("devices", [])
               if d.get("taints")}
    assert tainted == {"gpu-2"}
