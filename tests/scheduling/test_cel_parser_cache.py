"""The CEL parser's LALR tables are cached in the user's cache directory, and parse the same
from the cache; without a usable cache directory they are built as before."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROBE = textwrap.dedent("""
    from gpudra.scheduling.cel.grammar import parse
    from gpudra.scheduling.cel.environment import compile_selector
    print(parse('device.attributes["gpu.nvidia.com"].?index.orValue(-1) >= 0').pretty())
    print(compile_selector('device.driver == "gpu.nvidia.com"').expression)
""")


def run(cache_home: Path) -> str:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    return subprocess.run([sys.executable, "-c", PROBE], env=env, check=True,
                          capture_output=True, text=True).stdout


def test_the_second_process_parses_the_same_from_the_cache(tmp_path):
    first = run(tmp_path)
    [cached] = (tmp_path / "gpudra").glob("cel-grammar-lark*")
    stamp = cached.stat().st_mtime_ns
    for trees in (tmp_path / "gpudra").glob("cel-trees-*"):
        shutil.rmtree(trees)  # else nothing is parsed: the trees come from that cache
    assert run(tmp_path) == first
    assert cached.stat().st_mtime_ns == stamp  # read, not rebuilt


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_an_unwritable_cache_directory_only_costs_time(tmp_path):
    tmp_path.chmod(0o500)
    try:
        reference = run(tmp_path.parent / f"{tmp_path.name}-writable")
        assert run(tmp_path) == reference
    finally:
        tmp_path.chmod(0o700)


def test_a_cache_path_that_is_a_file_only_costs_time(tmp_path):
    (tmp_path / "gpudra").write_text("not a directory")
    assert "member_dot_opt" in run(tmp_path)
