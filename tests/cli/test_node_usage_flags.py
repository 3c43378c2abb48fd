"""``gpudra node --usage-interval / --idle-threshold / --idle-after``."""

from __future__ import annotations

import pytest

from gpudra.cli.main import build_parser
from gpudra.cli.node_cmd import node_config
from gpudra.cli.options import CliError
from gpudra.kubeletplugin.node.node_config import NodeConfig

ENVIRONMENT = ("USAGE_INTERVAL", "IDLE_THRESHOLD", "IDLE_AFTER")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


def config(*flags: str) -> NodeConfig:
    return node_config(build_parser("node").parse_args(["node", "--node-name", "n", *flags]))


def test_defaults_sample_every_ten_seconds_and_call_half_an_hour_idle():
    got = config()
    assert (got.usage_interval, got.idle_threshold, got.idle_after) == (10.0, 5.0, 1800.0)


def test_flags_and_units():
    got = config("--usage-interval", "500ms", "--idle-threshold", "2.5", "--idle-after", "1h")
    assert (got.usage_interval, got.idle_threshold, got.idle_after) == (0.5, 2.5, 3600.0)
    assert config("--usage-interval", "0").usage_interval == 0  # off
    assert config("--idle-after", "90").idle_after == 90


def test_environment_fallbacks(monkeypatch):
    monkeypatch.setenv("USAGE_INTERVAL", "30s")
    monkeypatch.setenv("IDLE_THRESHOLD", "10")
    monkeypatch.setenv("IDLE_AFTER", "5m")
    got = config()
    assert (got.usage_interval, got.idle_threshold, got.idle_after) == (30.0, 10.0, 300.0)


@pytest.mark.parametrize(("flags", "message"), [
    (["--usage-interval", "often"], "--usage-interval (env USAGE_INTERVAL): 'often': need a "
                                    "duration >= 0 (such as 10s, 5m, 1h)"),
    (["--usage-interval=-1s"], "need a duration >= 0"),
    (["--idle-after", "0"], "--idle-after (env IDLE_AFTER): '0': need a duration > 0"),
    (["--idle-threshold", "101"], "--idle-threshold (env IDLE_THRESHOLD): '101': need a "
                                  "percentage from 0 to 100"),
    (["--idle-threshold", "nan"], "need a percentage"),
])
def test_bad_values_are_one_line_errors(flags, message):
    with pytest.raises(CliError) as error:
        config(*flags)
    assert message in str(error.value)
