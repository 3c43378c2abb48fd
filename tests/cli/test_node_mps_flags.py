"""``gpudra node --mps-daemons / --mps-image / --namespace``: checked before anything starts,
each bad value a one-line error naming the flag."""

from __future__ import annotations

import pytest

from gpudra.cli.main import build_parser
from gpudra.cli.node_cmd import node_config
from gpudra.cli.options import CliError
from gpudra.kubeletplugin.node.node_config import NodeConfig
from gpudra.kubeletplugin.node.node_state import node_setup

ENVIRONMENT = ("MPS_DAEMONS", "MPS_IMAGE", "POD_NAMESPACE")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


def config(*flags: str) -> NodeConfig:
    return node_config(build_parser("node").parse_args(["node", "--node-name", "n", *flags]))


def test_in_the_container_unless_told_otherwise():
    got = config()
    assert (got.mps_daemons, got.mps_image, got.namespace) == ("container", None, None)
    assert node_setup(got).mps_pods is None


def test_pods_with_image_and_namespace_from_flags_or_environment(monkeypatch):
    got = config("--mps-daemons", "pod", "--mps-image", "gpudra:1", "--namespace", "gpu-ops")
    assert (got.mps_daemons, got.mps_image, got.namespace) == ("pod", "gpudra:1", "gpu-ops")
    monkeypatch.setenv("MPS_DAEMONS", "pod")
    monkeypatch.setenv("MPS_IMAGE", "gpudra:2")
    monkeypatch.setenv("POD_NAMESPACE", "kube-gpu")
    got = config()
    assert (got.mps_daemons, got.mps_image, got.namespace) == ("pod", "gpudra:2", "kube-gpu")


@pytest.mark.parametrize(("flags", "message"), [
    (("--mps-daemons", "daemonset"), "--mps-daemons (env MPS_DAEMONS): 'daemonset' is not one"),
    (("--mps-daemons", "pod", "--namespace", "x"), "--mps-daemons pod needs --mps-image"),
    (("--mps-daemons", "pod", "--mps-image", "i"), "needs the driver's namespace"),
    (("--mps-daemons", "pod", "--mps-image", "i", "--namespace", "Bad_NS"),
     "--namespace (env POD_NAMESPACE)"),
])
def test_bad_values_are_one_line_errors_naming_the_flag(flags, message):
    with pytest.raises(CliError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(*flags)
