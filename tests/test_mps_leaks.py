"""The suite's guard against leaked MPS control daemons finds a test's own daemons by their
mark, names those that outlived their directory, and stops them all."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from gpudra.driver import mps_process
from gpudra.driver.mps import MpsManager
from gpudra.driver.sim.commands import SimulatedCommandRunner
from tests import mps_leaks

UID1 = "11111111-1111-4111-8111-111111111111"
UID2 = "22222222-2222-4222-8222-222222222222"


def start(tmp_path: Path, uid: str) -> int:
    manager = MpsManager(SimulatedCommandRunner(tmp_path / "sim"), tmp_path / "mps")
    manager.start(uid, [], [])
    pid = manager.running_pid(uid)
    assert pid is not None
    return pid


def test_a_daemon_whose_directory_was_removed_is_named_and_stopped(tmp_path):
    mark = os.environ[mps_leaks.MARK_ENV]
    kept, orphan = start(tmp_path, UID1), start(tmp_path, UID2)
    shutil.rmtree(tmp_path / "mps" / UID2)  # what a clean-up that forgot the daemon does
    assert sorted(d.pid for d in mps_leaks.find(mark)) == sorted([kept, orphan])

    leaked = mps_leaks.stop_all(mark)

    assert [d.pid for d in leaked] == [orphan]
    assert leaked[0].pipe_dir == tmp_path / "mps" / UID2 / "pipe"
    assert not mps_process.alive(kept) and not mps_process.alive(orphan)
    assert mps_leaks.find(mark) == []


def test_a_daemon_signalled_a_moment_ago_is_not_a_leak(tmp_path):
    """A test that kills a daemon whose directory it removed has not leaked it, even if
    the process has not exited yet when the guard looks."""
    mark = os.environ[mps_leaks.MARK_ENV]
    pid = start(tmp_path, UID1)
    shutil.rmtree(tmp_path / "mps")
    os.kill(pid, signal.SIGSTOP)  # stopped, it leaves the SIGTERM below pending
    assert mps_process.wait_for(lambda: _state(pid) == "T", 5.0)
    os.kill(pid, signal.SIGTERM)
    try:
        [daemon] = mps_leaks.find(mark)
        assert daemon.pid == pid and not daemon.leaked
    finally:
        os.kill(pid, signal.SIGCONT)
    assert mps_leaks.stop_all(mark) == []  # going by itself: no leak
    # It exits in its own time once continued (the SIGTERM it had pending): wait for that.
    assert mps_process.wait_for(lambda: not mps_process.alive(pid), 10.0)


def _state(pid: int) -> str:
    return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]


def test_another_marks_daemons_are_left_alone(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(mps_leaks.MARK_ENV, "someone-else")
    pid = start(tmp_path, UID1)
    try:
        assert mps_leaks.stop_all("this-test") == []
        assert mps_process.alive(pid)
    finally:
        assert mps_leaks.stop_all("someone-else") == []
    assert not mps_process.alive(pid)
