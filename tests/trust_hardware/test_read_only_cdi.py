"""A read-only CDI root: a prepare says the spec could not be written (not that a spec
could not be removed) and changes nothing; at start-up a leftover spec there is one warning
naming the file, not a crash. The real ``gpudra node`` process; the CDI root is a tmpfs
remounted read-only (root only: mount; skipped elsewhere)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.driver.sim import SimControl
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import DRIVER, Daemon, create_claim

LEFTOVER_UID = "5e5e5e5e-5e5e-4e5e-8e5e-5e5e5e5e5e5e"


def mount(args: list[str]) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")


def read_only(path: Path) -> None:
    mount(["-o", "remount,ro", str(path)])


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    if os.geteuid() != 0:
        pytest.skip("a read-only filesystem needs root (mount); root ignores modes")
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    made = Daemon(fake_api.url)
    made.cdi_root.mkdir(parents=True)
    mount(["-t", "tmpfs", "-o", "size=1m", "tmpfs", str(made.cdi_root)])
    try:
        yield made
    finally:
        if made.process is not None and made.process.poll() is None:
            made.stop()
        made.stop_kubelet()
        subprocess.run(["umount", "--lazy", str(made.cdi_root)], capture_output=True,
                       check=False)
        shutil.rmtree(made.base, ignore_errors=True)


async def test_a_prepare_on_a_read_only_cdi_root_names_the_failed_write(daemon, fake_api):
    daemon.start()
    read_only(daemon.cdi_root)
    ref = create_claim(fake_api, "mig", devices=["gpu-0-mig-1g10gb-19-6"], request="mig")
    async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
        error = (await kubelet.prepare([ref]))[ref.uid]["error"]
    spec = daemon.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json"
    assert f"cannot write CDI spec {spec}: Read-only file system" in error, error
    assert "cannot remove" not in error, error
    gpu0 = SimControl(daemon.sim_state).snapshot()["gpus"][0]
    assert gpu0["gpu_instances"] == [] and gpu0["mig_mode"]["current"] == 0  # rolled back
    assert "Traceback" not in daemon.output()


def test_a_leftover_spec_on_a_read_only_cdi_root_is_a_warning_at_start_up(daemon):
    leftover = daemon.cdi_root / f"k8s.{DRIVER}-claim_{LEFTOVER_UID}.json"
    leftover.write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": f"k8s.{DRIVER}/claim",
        "devices": [{"name": f"{LEFTOVER_UID}-gpu-0",
                     "containerEdits": {"env": ["A=1"]}}]}) + "\n")
    read_only(daemon.cdi_root)
    daemon.start()  # registered and running: no crash loop
    output = daemon.output()
    assert "Traceback" not in output
    warnings = [e for e in daemon.events()
                if e.get("level") == "warning" and str(leftover) in json.dumps(e)]
    assert len(warnings) == 1, output
    assert "Read-only file system" in json.dumps(warnings[0]), warnings
    assert leftover.exists()  # nothing could be done; it is said, not hidden
    assert daemon.stop() == 0
