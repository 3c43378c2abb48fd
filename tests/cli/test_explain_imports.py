"""``gpudra explain`` and ``validate`` are run interactively: each imports only what its path
needs (counted in a fresh process, which does not depend on the machine's load)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HEAVY = ("celpy", "lark", "yaml", "pydantic", "structlog", "kubernetes", "urllib3", "pynvml",
         "grpc", "asyncio", "importlib.metadata", "gpudra.api.configs", "gpudra.driver.nvml")
PROBE = """
import contextlib, io, json, sys
from gpudra.cli.main import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        code = main(sys.argv[2:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "output": out.getvalue(),
                  "loaded": [m for m in json.loads(sys.argv[1]) if m in sys.modules]}))
"""


def imported(*argv: str) -> tuple[int, str, set[str]]:
    """Exit status, output and which of HEAVY a fresh ``gpudra <argv>`` process imported."""
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY), *argv],
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.splitlines()[-1])
    return result["code"], result["output"], set(result["loaded"])


def test_explain_on_a_simulated_node_imports_no_client_logging_or_config_models():
    code, output, loaded = imported("explain", str(EXAMPLES / "two-mig-same-gpu" / "claim.yaml"),
                                    "--simulate", "dgx-h100", "--dynamic-mig-gpus", "all")
    assert code == 0 and "ALLOCATABLE" in output
    assert not loaded & {"pydantic", "gpudra.api.configs", "importlib.metadata", "structlog",
                         "asyncio", "kubernetes", "urllib3", "grpc"}


def test_explain_decodes_configs_only_when_a_claim_has_one():
    code, output, loaded = imported("explain", str(EXAMPLES / "mps" / "claim.yaml"),
                                    "--simulate", "dgx-h100")
    assert code == 0 and "ALLOCATABLE" in output
    assert "gpudra.api.configs" in loaded


def test_validate_needs_no_nvml():
    code, output, loaded = imported("validate", str(EXAMPLES / "two-mig-same-gpu" / "claim.yaml"))
    assert code == 0 and output.startswith("OK: 1 ResourceClaim")
    assert not loaded & {"pynvml", "gpudra.driver.nvml", "structlog", "pydantic", "kubernetes"}


@pytest.mark.parametrize("command", ["explain", "validate"])
def test_help_of_a_command_imports_none_of_its_machinery(command):
    code, output, loaded = imported(command, "--help")
    assert code == 0 and f"usage: gpudra {command}" in output
    assert loaded == set()
