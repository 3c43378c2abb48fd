"""What ``gpudra node`` imports before it serves the kubelet sockets: start-up time until
``GetInfo`` answers is mostly imports, so the driver's modules load later, off the loop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PHASE_TWO = (
    "pydantic", "pynvml", "gpudra.kube.http_client", "gpudra.kube.session",
    "gpudra.driver.nvml", "gpudra.driver.checkpoint_model", "gpudra.driver.device_state",
    "gpudra.driver.health_monitor", "gpudra.driver.usage_sampler",
    "gpudra.kubeletplugin.node.node_state", "gpudra.kubeletplugin.claims.preparer",
    "gpudra.controller.publisher",
)
# The daemon talks to the API server through its own asyncio client: neither of these.
NEVER = ("aiohttp", "kubernetes")


def imported_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + "\nimport sys\nprint(*sys.modules)"],
        check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_the_first_phase_imports_none_of_the_driver_modules():
    modules = imported_after("import gpudra.cli.main, gpudra.cli.node_cmd, "
                             "gpudra.kubeletplugin.node.daemon")
    assert "grpc.aio" in modules and "gpudra.kubeletplugin.serving.server" in modules
    assert sorted(modules & {*PHASE_TWO, *NEVER}) == []


def test_the_node_command_imports_the_daemon_only_to_run_it():
    modules = imported_after("import gpudra.cli.main, gpudra.cli.node_cmd")
    assert "gpudra.kubeletplugin.node.daemon" not in modules
    assert "grpc" not in modules  # so `gpudra node --help` does not pay for it


def test_the_second_phase_imports_what_it_uses():
    modules = imported_after("from gpudra.kubeletplugin.node import daemon\n"
                             "daemon._import_client_modules()")
    assert sorted(set(PHASE_TWO) - modules) == []
    assert sorted(modules & set(NEVER)) == []


def test_the_metrics_endpoint_and_the_version_line_need_neither():
    modules = imported_after("import gpudra.cli.main, gpudra.cli.node_cmd\n"
                             "from gpudra.kubeletplugin.node import daemon, http_probes\n"
                             "from gpudra.cli.version import version\n"
                             "daemon._import_client_modules()\n"
                             "version()")
    assert "prometheus_client" in modules and "gpudra.api.configs" in modules
    assert sorted(modules & set(NEVER)) == []
    # A daemon in its pod reads no kubeconfig file (and a real node no simulator data):
    # PyYAML (resident memory) is imported only to read one.
    assert "gpudra.kube.kubeconfig" in modules and "yaml" not in modules


def test_a_simulated_node_reads_its_profiles_without_importlib_resources():
    modules = imported_after("from gpudra.kubeletplugin.node import daemon\n"
                             "daemon._import_client_modules()\n"
                             "from gpudra.driver.sim import profiles\n"
                             "profiles.node_profile('dgx-h100'), profiles.nvml_data()")
    assert "gpudra.driver.sim.profiles" in modules
    assert sorted(modules & set(NEVER)) == []
