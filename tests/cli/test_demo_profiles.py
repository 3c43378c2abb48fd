"""``gpudra demo`` on every simulated profile: it runs, picks a GPU it can share, counts each
kind of device apart and fills ``top``'s POD column from the claims' ``reservedFor``."""

from __future__ import annotations

import re

import pytest

from gpudra.cli.demo_cmd import shared_gpu
from gpudra.driver.sim import profiles
from tests.cli.test_demo import demo

PUBLISHED = re.compile(r"published \d+ ResourceSlices in [\d.]+s: (\d+) devices = (\d+) x .+? "
                       r"\+ (\d+) MIG placements(?: \+ (\d+) shared GPUs?)?, ")


def test_the_shared_gpu_is_picked_from_the_profile():
    assert shared_gpu("dgx-h100") == 7
    assert shared_gpu("t4-x1") == 0
    assert shared_gpu("h100-nvl-x2") == 1
    # Two of its GPUs are in MIG mode: the last one that is not.
    static = profiles.node_profile("dgx-a100-static-mig")
    assert shared_gpu("dgx-a100-static-mig") == max(
        g.index for g in static.gpus if not g.mig_enabled)
    assert shared_gpu("no-such-node") is None


@pytest.mark.parametrize("profile", sorted(profiles.node_profiles()))
def test_demo_runs_on_every_profile(tmp_path, profile):
    done = demo(tmp_path, "--profile", profile)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    match = PUBLISHED.search(out)
    assert match, out
    total, gpus, mig, shares = (int(x or 0) for x in match.groups())
    assert total == gpus + mig + shares  # a GPU's shared device is no MIG placement
    assert shares == 1
    assert f"a share of GPU {shared_gpu(profile)}" in out or "share gpu-16gi: not allocatable" \
        in out
    assert "CDI specs left: 0" in out and "sockets left behind: none" in out
    if profile == "dgx-h100":
        assert "209 devices = 8 x NVIDIA H100 80GB HBM3 + 200 MIG placements + 1 shared GPU" \
            in out
    lines = out.splitlines()
    at = lines.index("   gpudra top (with simulated load on the devices):")
    rows = [line.split() for line in lines[at + 2:] if line.startswith("   default")]
    assert rows and all(row[2] != "-" for row in rows), rows  # the POD column
