"""The chart's resourceApiVersion reaches the node daemon's --resource-api-version: auto (the
default) adds no flag (the daemon asks the API server), a version in gpudra's or NVIDIA's
form pins it, and anything else fails the install with the schema's error."""

from __future__ import annotations

import argparse

import pytest

from gpudra.cli import node_cmd
from tests.deploy.test_chart import container, render_error


def flags(values: dict | None = None) -> list[str]:
    return [a for a in container(values)["args"] if a.startswith("--resource-api-version")]


def test_auto_is_the_default_and_adds_no_flag():
    assert flags() == []
    assert flags({"resourceApiVersion": "auto"}) == []
    assert flags({"resourceApiVersion": ""}) == []


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_a_version_pins_the_daemon(version):
    assert flags({"resourceApiVersion": version}) == [f"--resource-api-version={version}"]
    # NVIDIA's chart names it with its group.
    assert flags({"resourceApiVersion": f"resource.k8s.io/{version}"}) == [
        f"--resource-api-version={version}"]


def test_the_daemon_parses_what_the_chart_renders():
    parser = argparse.ArgumentParser()
    node_cmd.add_parser(parser.add_subparsers())
    # What the kubelet substitutes from the pod's fields.
    fields = {"$(NODE_NAME)": "node-a", "$(POD_NAMESPACE)": "gpudra",
              "$(POD_UID)": "00000000-0000-4000-8000-000000000001"}
    args = container({"resourceApiVersion": "v1beta1"})["args"]
    for name, value in fields.items():
        args = [a.replace(name, value) for a in args]
    parsed = parser.parse_args(args)
    assert parsed.resource_api_version == "v1beta1"
    assert node_cmd.node_config(parsed).resource_api == "v1beta1"


def test_a_version_gpudra_does_not_speak_fails_the_install():
    assert "resourceApiVersion" in render_error({"resourceApiVersion": "v1alpha3"})
