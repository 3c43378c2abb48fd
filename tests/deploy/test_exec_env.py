"""``kubectl exec`` into the node daemon's container: ``gpudra inventory`` and ``gpudra sim``
read the daemon's settings from the environment the chart gives the container, so they see
the node as the daemon does without repeating its flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_chart import SIMULATE, container

SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "simulate": SIMULATE,
    "choices": {"shareableGpus": "0,1", "featureGates": {"MPSSupport": False},
                "dynamicMig": {"gpus": "all", "profiles": "1g.10gb", "placements": "disjoint"},
                "kubeletPlugin": {"kubeletPluginsDirectoryPath": "/var/lib/k0s/kubelet/plugins",
                                  "kubeletRegistrarDirectoryPath":
                                      "/var/lib/k0s/kubelet/plugins_registry"}},
}


def _parse(words: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    from gpudra.cli.main import build_parser

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return build_parser().parse_args(words)


def _flag(args: list[str], name: str) -> str | None:
    found = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return found[-1] if found else None


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_inventory_in_the_pod_sees_what_the_daemon_sees(scenario, monkeypatch):
    c = container(SCENARIOS[scenario])
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    args = c["args"]
    inventory = _parse(["inventory"], env, monkeypatch)
    assert inventory.driver_name == _flag(args, "driver-name")
    assert (inventory.simulate or None) == _flag(args, "simulate")
    assert (str(inventory.sim_state) if inventory.sim_state else None) == _flag(args, "sim-state")
    if not inventory.simulate:
        assert Path(inventory.driver_root) == Path(_flag(args, "driver-root") or "")
        assert Path(inventory.dev_root) == Path(_flag(args, "dev-root") or "")
    assert inventory.shareable_gpus == (_flag(args, "shareable-gpus") or "none")
    assert inventory.feature_gates == (_flag(args, "feature-gates") or "")
    assert inventory.dynamic_mig_gpus == _flag(args, "dynamic-mig-gpus")
    assert inventory.dynamic_mig_profiles == (_flag(args, "dynamic-mig-profiles") or "all")
    assert inventory.dynamic_mig_placements == (_flag(args, "dynamic-mig-placements") or "all")
    assert Path(inventory.plugins_dir) == Path(_flag(args, "plugins-dir") or "")


def test_sim_in_a_simulated_pod_finds_the_state_without_flags(monkeypatch):
    c = container(SIMULATE)
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    load = _parse(["sim", "load", "--gpu", "0", "--sm", "50"], env, monkeypatch)
    assert str(load.sim_state) == _flag(c["args"], "sim-state")
