"""Per-claim MPS control daemons as real (simulated) processes: start, identity checks
against pid reuse, stop with a deadline, start-up reconciliation, reaping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from gpudra.driver import mps_process
from gpudra.driver.commands import CommandError
from gpudra.driver.mps import NATIVE_PID_FILE, MpsClaim, MpsManager
from gpudra.driver.sim.commands import SimulatedCommandRunner

ROOT = Path(__file__).resolve().parents[2]
UID1 = "11111111-1111-4111-8111-111111111111"
UID2 = "22222222-2222-4222-8222-222222222222"
GPU = "GPU-00000000-0000-4000-8000-000000000000"


def sim_daemons(under: Path) -> list[int]:
    """Live simulated control daemons whose pipe directory is under ``under`` (however
    they were started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        prefix = str(under).encode()
        ours = b"gpudra.driver.sim.mps_daemon" in argv \
            or str(mps_process.SIM_CONTROL).encode() in argv
        if ours and any(a.startswith(prefix) for a in argv) \
                and mps_process.alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[MpsManager]:
    m = MpsManager(SimulatedCommandRunner(tmp_path / "sim"), tmp_path / "mps")
    yield m
    for uid in m.claim_uids():  # never leave a daemon behind, whatever the test did
        m.stop(uid)


@pytest.fixture
def stranger() -> Iterator[int]:
    """An unrelated live process: what a reused pid points at."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc.pid
    proc.kill()
    proc.wait()


class QuitIgnored:
    """Host commands whose ``quit`` never reaches the daemon (a hung control client)."""

    def __init__(self, inner: SimulatedCommandRunner) -> None:
        self.inner = inner

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            stdin: str | None = None) -> str:
        if stdin is not None and stdin.strip() == "quit":
            raise CommandError("nvidia-cuda-mps-control: timed out")
        return self.inner.run(argv, env=env, stdin=stdin)


class Failing:
    """Host commands on a node whose MPS binary is broken."""

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            stdin: str | None = None) -> str:
        raise CommandError(f"{argv[0]}: exited 1: no CUDA-capable device")


class Recording:
    """Host commands, each recorded (argv and stdin) before it runs."""

    def __init__(self, inner: SimulatedCommandRunner) -> None:
        self.inner = inner
        self.calls: list[tuple[list[str], str | None]] = []

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            stdin: str | None = None) -> str:
        self.calls.append((list(argv), stdin))
        return self.inner.run(argv, env=env, stdin=stdin)


def test_start_records_a_detached_daemon_and_stop_removes_everything(manager):
    daemon = manager.start(UID1, [GPU], ["set_default_active_thread_percentage 25"])
    pid = mps_process.read_pid(daemon.pid_file)
    assert pid is not None and manager.running_pid(UID1) == pid
    assert sim_daemons(daemon.pipe_dir) == [pid]
    # detached: its own session, not a child of ours
    assert os.getsid(pid) == pid and os.getsid(pid) != os.getsid(0)
    assert f"PPid:\t{os.getpid()}\n" not in Path(f"/proc/{pid}/status").read_text()
    assert daemon.shm_dir.is_dir() and daemon.log_dir.is_dir()
    assert "set_default_active_thread_percentage 25" in (
        daemon.log_dir / "control.log").read_text()
    manager.stop(UID1)
    assert not mps_process.alive(pid)
    assert not daemon.directory.exists()
    manager.stop(UID1)  # idempotent


def test_start_is_one_launch_and_one_client_call_for_all_commands(tmp_path):
    """Each control call is a process (and a chroot with a driver container's root): the
    limits go in one session, the control shell reading them line by line."""
    runner = Recording(SimulatedCommandRunner(tmp_path / "sim"))
    manager = MpsManager(runner, tmp_path / "mps")
    commands = ["set_default_active_thread_percentage 25",
                f"set_default_device_pinned_mem_limit {GPU} 20480M"]
    daemon = manager.start(UID1, [GPU], commands)
    try:
        assert runner.calls == [(["nvidia-cuda-mps-control", "-d"], None),
                                (["nvidia-cuda-mps-control"], "".join(c + "\n" for c in commands))]
        log = (daemon.log_dir / "control.log").read_text()
        assert all(f"[sim] {c}\n" in log for c in commands)
    finally:
        manager.stop(UID1)


def test_container_edits_carry_pipe_log_and_a_private_shm(manager):
    edits = manager.daemon_for(UID1).container_edits().to_json()
    assert set(edits["env"]) == {"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                                 "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps"}
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    base = manager.base_dir / UID1
    assert mounts["/tmp/nvidia-mps"]["hostPath"] == str(base / "pipe")
    assert mounts["/var/log/nvidia-mps"]["hostPath"] == str(base / "log")
    assert mounts["/dev/shm"]["hostPath"] == str(base / "shm")
    assert {"rbind", "nosuid", "nodev"} <= set(mounts["/dev/shm"]["options"])


def test_a_reused_pid_is_neither_adopted_nor_killed(manager, stranger):
    daemon = manager.start(UID1, [GPU], [])
    real = manager.running_pid(UID1)
    assert real is not None
    os.kill(real, signal.SIGKILL)  # the daemon dies; the kernel may hand its pid on
    assert mps_process.wait_exit(real, 5)
    for path in (daemon.pid_file, daemon.pipe_dir / NATIVE_PID_FILE):
        mps_process.write_pid(path, stranger)
    assert manager.running_pid(UID1) is None
    manager.stop(UID1)
    assert mps_process.alive(stranger)
    assert not daemon.directory.exists()


def test_another_claims_daemon_is_not_this_claims(manager):
    manager.start(UID1, [GPU], [])
    other = manager.start(UID2, [GPU], [])
    first, second = manager.running_pid(UID1), manager.running_pid(UID2)
    assert first is not None and second is not None
    mps_process.write_pid(other.pid_file, first)  # same binary, other claim
    mps_process.write_pid(other.pipe_dir / NATIVE_PID_FILE, first)
    try:
        assert manager.running_pid(UID2) is None
        manager.stop(UID2)
        assert manager.running_pid(UID1) == first
    finally:
        os.kill(second, signal.SIGKILL)  # lost track of by design: not ours to find now


def test_a_killed_daemon_is_started_again_in_the_same_directories(manager):
    daemon = manager.start(UID1, [GPU], [])
    first = manager.running_pid(UID1)
    assert first is not None
    inode = daemon.pipe_dir.stat().st_ino
    os.kill(first, signal.SIGKILL)  # leaves its FIFO and pid file behind
    assert mps_process.wait_exit(first, 5)
    assert (daemon.pipe_dir / "control").exists()
    manager.start(UID1, [GPU], ["set_default_active_thread_percentage 10"])
    second = manager.running_pid(UID1)
    assert second not in (None, first)
    # the same inode: containers that bind-mounted the directory see the new socket
    assert daemon.pipe_dir.stat().st_ino == inode
    assert sim_daemons(daemon.pipe_dir) == [second]


def test_stop_signals_a_daemon_that_does_not_quit(tmp_path):
    manager = MpsManager(QuitIgnored(SimulatedCommandRunner(tmp_path / "sim")),
                         tmp_path / "mps", timeout=0.5)
    daemon = manager.start(UID1, [GPU], [])
    pid = manager.running_pid(UID1)
    assert pid is not None
    manager.stop(UID1)
    assert not mps_process.alive(pid)
    assert not daemon.directory.exists()


def test_stop_with_a_dead_daemon_does_not_hang(manager):
    daemon = manager.start(UID1, [GPU], [])
    pid = manager.running_pid(UID1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # a FIFO with no reader: a blocking open would hang
    assert mps_process.wait_exit(pid, 5)
    manager.stop(UID1)
    assert not daemon.directory.exists()


def test_reconcile_adopts_restarts_and_stops(manager):
    manager.start(UID1, [GPU], ["set_default_active_thread_percentage 30"])
    live = manager.running_pid(UID1)
    dead = manager.start(UID2, [GPU], ["set_default_active_thread_percentage 60"])
    gone = manager.running_pid(UID2)
    assert live is not None and gone is not None
    os.kill(gone, signal.SIGKILL)
    assert mps_process.wait_exit(gone, 5)
    orphan = manager.start("33333333-3333-4333-8333-333333333333", [GPU], [])
    orphan_pid = manager.running_pid("33333333-3333-4333-8333-333333333333")
    assert orphan_pid is not None
    report = manager.reconcile({
        UID1: MpsClaim(ref="default/a", uuids=(GPU,),
                       commands=("set_default_active_thread_percentage 30",)),
        UID2: MpsClaim(ref="default/b", uuids=(GPU,),
                       commands=("set_default_active_thread_percentage 60",)),
    })
    assert report.adopted == {UID1: live}
    assert report.restarted == [UID2]
    assert report.stopped == ["33333333-3333-4333-8333-333333333333"]
    assert report.failed == []
    assert manager.running_pid(UID1) == live  # adopted, not started twice
    assert sim_daemons(manager.daemon_for(UID1).pipe_dir) == [live]
    # restarted with the recorded config
    log = (dead.log_dir / "control.log").read_text()
    assert log.count("set_default_active_thread_percentage 60") == 2
    assert not mps_process.alive(orphan_pid)
    assert not orphan.directory.exists()


def test_reconcile_reports_a_daemon_it_cannot_restart(tmp_path):
    manager = MpsManager(Failing(), tmp_path / "mps")
    report = manager.reconcile({UID1: MpsClaim(ref="default/a", uuids=(GPU,), commands=None)})
    assert report.failed == [UID1] and report.restarted == []


WORKER = """
import ctypes, json, os, sys
from pathlib import Path
from gpudra.driver.mps import MpsManager
from gpudra.driver.sim.commands import SimulatedCommandRunner

PR_SET_CHILD_SUBREAPER = 36
# Orphans are re-parented to us, as they are to the node daemon when it is PID 1.
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
root = Path(sys.argv[1])
manager = MpsManager(SimulatedCommandRunner(root / "sim"), root / "mps")
manager.start("u1", ["GPU-x"], [])
pid = manager.running_pid("u1")
status = Path(f"/proc/{pid}/status").read_text()
parent = int(status.split("PPid:")[1].split()[0])
manager.stop("u1")
print(json.dumps({"parent_is_us": parent == os.getpid(),
                  "left_behind": Path(f"/proc/{pid}").exists()}))
"""


def test_a_stopped_daemon_is_reaped_when_we_are_its_parent(tmp_path):
    """PID 1 (or a subreaper) inherits the detached daemon; stopping it must not leave a
    zombie, and waiting for that one pid leaves subprocess's children alone."""
    done = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == {"parent_is_us": True, "left_behind": False}
