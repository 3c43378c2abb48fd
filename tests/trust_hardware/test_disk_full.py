"""Disk full: every failed write names its file. The real ``gpudra node`` process with its
data directory (checkpoint, MPS pid files) or CDI root on a small tmpfs that is then filled
up, as a node's disk fills. Needs root (mount); skipped elsewhere."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.api.claims import ClaimRef
from gpudra.testing.fakeapi.server import FakeApiServer
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.integration.daemon import DRIVER, Daemon, create_claim

GV = "resource.nvidia.com/v1beta1"
MPS = {"opaque": {"driver": DRIVER, "parameters": {
    "apiVersion": GV, "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}},
    "requests": ["gpu"], "source": "FromClaim"}


@contextlib.contextmanager
def small_disk(path: Path, size: str = "4m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0750", "tmpfs",
                           str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Take every free byte of ``directory``'s filesystem; the filler's path."""
    filler = directory / "filler"
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


@pytest.fixture
def daemon(fake_api: FakeApiServer) -> Iterator[Daemon]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    fake_api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    made = Daemon(fake_api.url)
    try:
        yield made
    finally:
        if made.process is not None and made.process.poll() is None:
            made.stop()
        made.stop_kubelet()
        for mount in (made.plugins / DRIVER, made.cdi_root):
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, check=False)
        shutil.rmtree(made.base, ignore_errors=True)


async def prepare_error(kubelet: KubeletEmulator, ref: ClaimRef) -> str:
    """The claim's own error: a file the daemon cannot write fails each claim of the call,
    never the whole call (an INTERNAL status here fails the test)."""
    return str((await kubelet.prepare([ref]))[ref.uid]["error"])


async def test_a_full_data_dir_names_the_checkpoint(daemon, fake_api):
    with small_disk(daemon.plugins / DRIVER) as data:
        daemon.start()
        ref = create_claim(fake_api, "gpu", devices=["gpu-0"])
        filler = fill(data)
        async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
            error = await prepare_error(kubelet, ref)
            assert "No space left on device" in error, error
            assert str(data / "checkpoint.json") in error, error
            filler.unlink()  # room again: the kubelet's retry prepares
            assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
            assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
        assert daemon.stop() == 0


async def test_a_full_cdi_root_names_the_spec(daemon, fake_api):
    with small_disk(daemon.cdi_root, "64k") as cdi:
        daemon.start()
        ref = create_claim(fake_api, "gpu", devices=["gpu-1"])
        filler = fill(cdi)
        async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
            error = (await kubelet.prepare([ref]))[ref.uid]["error"]
            assert "No space left on device" in error, error
            assert f"cannot write CDI spec {cdi}/k8s.{DRIVER}-claim_{ref.uid}.json" in error
            filler.unlink()
            assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
            assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
        assert daemon.stop() == 0


async def test_a_full_data_dir_during_an_mps_prepare_names_the_file(daemon, fake_api):
    with small_disk(daemon.plugins / DRIVER) as data:
        daemon.start()
        ref = create_claim(fake_api, "mps", devices=["gpu-2"], configs=[MPS])
        async with await KubeletEmulator.discover(daemon.registrar) as kubelet:
            assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
            assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
            filler = fill(data)
            error = (await kubelet.prepare([ref]))[ref.uid]["error"]
            assert "No space left on device" in error, error
            assert str(data / "checkpoint.json") in error, error  # its started record
            filler.unlink()
            assert (await kubelet.prepare([ref]))[ref.uid]["error"] == ""
            assert (await kubelet.unprepare([ref]))[ref.uid]["error"] == ""
        assert daemon.stop() == 0


def test_a_pid_file_that_cannot_be_written_is_named(tmp_path):
    # The MPS daemon's pid file, written by the node daemon once the control daemon is up.
    from gpudra.driver import mps_process

    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    with small_disk(tmp_path / "disk", "64k") as disk:
        fill(disk)
        pid_file = disk / "control.pid"
        with pytest.raises(OSError) as caught:
            mps_process.write_pid(pid_file, 4242)
        assert caught.value.errno == errno.ENOSPC
        assert caught.value.filename == str(pid_file)
        assert f"No space left on device: '{pid_file}'" in str(caught.value)
        assert not pid_file.exists() and not (disk / "control.pid.tmp").exists()
