"""``gpudra node``'s flags and environment fallbacks → one checked NodeConfig."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudra.cli.main import build_parser, main
from gpudra.cli.node_cmd import node_config
from gpudra.cli.options import CliError
from gpudra.driver.health import APPLICATION_XIDS, DEFAULT_QUIET_PERIOD
from gpudra.kubeletplugin.node.node_config import NodeConfig

FALLBACKS = ("NODE_NAME", "DRIVER_NAME", "FEATURE_GATES", "SIMULATE", "SIM_STATE", "KUBECONFIG",
             "POD_UID", "HTTP_ADDRESS", "ADDITIONAL_XIDS_TO_IGNORE", "XID_QUIET_PERIOD",
             "LOG_LEVEL", "LOG_FORMAT", "DRIVER_ROOT", "HOST_DRIVER_ROOT", "CDI_ROOT",
             "REGISTRATION_TIMEOUT")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in FALLBACKS:
        monkeypatch.delenv(name, raising=False)


def config(*flags: str) -> NodeConfig:
    """Parse as ``gpudra node`` does; the parser reads the environment when it is built."""
    return node_config(build_parser("node").parse_args(["node", *flags]))


def test_flags_become_one_config():
    c = config("--node-name", "Node-A", "--feature-gates", "DynamicMIG=false",
               "--additional-xids-to-ignore", "48, 79", "--xid-quiet-period", "2.5",
               "--http-address", "0.0.0.0:9000", "--pod-uid", "u-1", "--simulate", "dgx-h100",
               "--cdi-root", "/cdi", "--kubeconfig", "/kc")
    assert c.node_name == "node-a"  # Kubernetes names are lower case
    assert c.gates.enabled("DynamicMIG") is False and c.gates.enabled("MPSSupport") is True
    assert c.health.application_xids == APPLICATION_XIDS | {48, 79}
    assert c.health.quiet_period == 2.5
    assert c.http_address == ("0.0.0.0", 9000)
    assert (c.pod_uid, c.simulate, c.cdi_root, c.kubeconfig) == (
        "u-1", "dgx-h100", Path("/cdi"), "/kc")


def test_defaults():
    c = config()
    assert c.node_name == os.uname().nodename.lower()
    assert c.driver_name == "gpu.nvidia.com"
    assert c.health.quiet_period == DEFAULT_QUIET_PERIOD
    assert c.http_address == ("127.0.0.1", 8080)
    assert (c.kubeconfig, c.simulate, c.pod_uid, c.driver_root) == (None, None, None, None)


def test_environment_fallbacks(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "from-env")
    monkeypatch.setenv("FEATURE_GATES", "DeviceHealthCheck=false")
    monkeypatch.setenv("XID_QUIET_PERIOD", "0")
    monkeypatch.setenv("HTTP_ADDRESS", "")
    monkeypatch.setenv("ADDITIONAL_XIDS_TO_IGNORE", "79")
    monkeypatch.setenv("DRIVER_ROOT", "/run/nvidia/driver")
    c = config()
    assert c.node_name == "from-env"
    assert c.gates.enabled("DeviceHealthCheck") is False
    assert c.health.quiet_period is None  # 0: taints stay until restart
    assert c.http_address is None  # empty: not served
    assert 79 in c.health.application_xids
    assert c.driver_root == Path("/run/nvidia/driver")
    assert config("--node-name", "flag-wins").node_name == "flag-wins"


def test_an_empty_quiet_period_means_the_default(monkeypatch):
    monkeypatch.setenv("XID_QUIET_PERIOD", "")
    assert config().health.quiet_period == DEFAULT_QUIET_PERIOD


def test_a_bare_port_listens_everywhere():
    assert config("--http-address", "8081").http_address == ("", 8081)


@pytest.mark.parametrize(("flags", "message"), [
    (["--feature-gates", "Nope=true"], "--feature-gates: unknown feature gate 'Nope'"),
    (["--feature-gates", "DynamicMIG"], "--feature-gates: feature gate 'DynamicMIG': expected"),
    (["--additional-xids-to-ignore", "79,x"], "--additional-xids-to-ignore: 'x' is not a "
                                              "positive XID number"),
    (["--xid-quiet-period", "soon"], "--xid-quiet-period (env XID_QUIET_PERIOD): 'soon' is "
                                     "not a number of seconds"),
    (["--xid-quiet-period", "-1"], "--xid-quiet-period (env XID_QUIET_PERIOD): '-1': need "
                                   "seconds >= 0"),
    (["--xid-quiet-period", "nan"], "need seconds >= 0"),
    (["--simulate", "nosuch"], "--simulate: unknown node profile 'nosuch' (known: "),
    (["--http-address", "localhost:http"], "--http-address: 'localhost:http': expected "
                                           "host:port"),
    (["--http-address", "localhost:70000"], "--http-address: 'localhost:70000'"),
])
def test_bad_values_are_one_line_errors(flags, message):
    with pytest.raises(CliError) as error:
        config(*flags)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("XID_QUIET_PERIOD", "5m", "gpudra node: --xid-quiet-period (env XID_QUIET_PERIOD): '5m' "
                               "is not a number of seconds"),
    ("ADDITIONAL_XIDS_TO_IGNORE", "-3", "gpudra node: --additional-xids-to-ignore: '-3'"),
    ("FEATURE_GATES", "MPS=on", "gpudra node: --feature-gates: feature gate 'MPS=on'"),
    ("LOG_LEVEL", "chatty", "gpudra node: --log-level (env LOG_LEVEL): unknown level 'chatty'"),
    ("LOG_FORMAT", "xml", "gpudra node: --log-format (env LOG_FORMAT): 'xml' is not one of"),
])
def test_a_bad_environment_value_is_a_one_line_error_not_a_traceback(
        name, value, message, monkeypatch, capsys):
    monkeypatch.setenv("LOG_FORMAT", "console")  # json: one JSON line (tests/integration)
    monkeypatch.setenv(name, value)
    assert main(["node", "--simulate", "dgx-h100", "--node-name", "n"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert err.count("\n") == 1
