"""The node daemon's gRPC core settings: set in the environment around grpc's first import
(when gRPC reads them), an operator's own setting kept, the environment restored."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpudra.kubeletplugin.grpc_env import EXPERIMENTS, experiments_with_polled_listener

# In a fresh interpreter: what GRPC_EXPERIMENTS was while grpc was being imported, what it
# is afterwards, and what import_grpc answered the first and the second time.
_PROBE = r"""
import json, os, sys
from gpudra.kubeletplugin import grpc_env

seen = []

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc":
            seen.append(os.environ.get("GRPC_EXPERIMENTS"))
        return None

sys.meta_path.insert(0, Spy())
first = grpc_env.import_grpc()
second = grpc_env.import_grpc()
print(json.dumps({"during": seen, "after": os.environ.get("GRPC_EXPERIMENTS"),
                  "first": first, "second": second, "imported": "grpc" in sys.modules}))
"""


def probe(experiments: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != EXPERIMENTS}
    if experiments is not None:
        env[EXPERIMENTS] = experiments
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    result: dict[str, object] = json.loads(out.splitlines()[-1])
    return result


@pytest.mark.parametrize(("current", "expected"), [
    (None, "-event_engine_listener"),
    ("", "-event_engine_listener"),
    ("some_experiment", "some_experiment,-event_engine_listener"),
    ("-event_engine_listener", "-event_engine_listener"),
    ("a, event_engine_listener", "a, event_engine_listener"),  # the operator's choice
])
def test_the_listener_experiment_is_off_unless_the_operator_named_it(
        current: str | None, expected: str) -> None:
    assert experiments_with_polled_listener(current) == expected


def test_grpc_is_imported_with_the_setting_and_the_environment_restored() -> None:
    assert probe(None) == {"during": ["-event_engine_listener"], "after": None,
                           "first": True, "second": False, "imported": True}


def test_an_operators_setting_is_extended_for_the_import_and_then_restored() -> None:
    assert probe("some_experiment") == {
        "during": ["some_experiment,-event_engine_listener"], "after": "some_experiment",
        "first": True, "second": False, "imported": True}
