"""Waiting for a driver that is not ready yet: a diagnosis of what is missing and where it was
looked for, then ready once the driver container has finished."""

from __future__ import annotations

import shutil

from structlog.testing import capture_logs

from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.driver_wait import diagnose, wait_for_driver
from gpudra.driver.sim.driver_root import populate_driver_root


def test_an_empty_root_names_everything_missing_and_where(tmp_path):
    (tmp_path / "driver").mkdir()
    (tmp_path / "dev").mkdir()
    problems = diagnose(DriverRoot(tmp_path / "driver", dev_root=tmp_path / "dev"))
    assert problems == [
        f"libcuda.so.1 not found under driver root {tmp_path}/driver (searched "
        "usr/lib/x86_64-linux-gnu, usr/lib/aarch64-linux-gnu, usr/lib64, lib/x86_64-linux-gnu, "
        "lib/aarch64-linux-gnu, lib64, usr/lib, lib, usr/lib/wsl/lib)",
        f"libnvidia-ml.so.1 not found under driver root {tmp_path}/driver (searched "
        "usr/lib/x86_64-linux-gnu, usr/lib/aarch64-linux-gnu, usr/lib64, lib/x86_64-linux-gnu, "
        "lib/aarch64-linux-gnu, lib64, usr/lib, lib, usr/lib/wsl/lib)",
        f"nvidia-smi not found under driver root {tmp_path}/driver (searched usr/bin, "
        "usr/local/bin, usr/sbin, bin, sbin)",
        f"/dev/nvidiactl not found under device root {tmp_path}/dev",
        f"/dev/nvidia-uvm not found under device root {tmp_path}/dev",
        "the NVIDIA kernel module is not loaded (no "
        f"{tmp_path}/dev/proc/driver/nvidia/version)",
    ]


def test_libraries_of_another_version_than_the_module_are_an_upgrade_in_progress(tmp_path):
    driver, dev = tmp_path / "driver", tmp_path / "dev"
    populate_driver_root(driver, [0], layout="gke", dev_root=dev)
    root = DriverRoot(driver, dev_root=dev)
    assert diagnose(root) == []
    populate_driver_root(driver, [0], layout="gke", dev_root=dev, driver_version="590.10.01")
    (dev / "proc/driver/nvidia/version").write_text("NVRM version: ... Module  580.65.06  x\n")
    assert diagnose(root) == [f"kernel module 580.65.06 but libraries 590.10.01 under driver "
                              f"root {driver}: an upgrade is in progress"]


def test_waits_until_the_driver_container_is_done(tmp_path):
    driver, dev = tmp_path / "driver", tmp_path / "dev"
    driver.mkdir()  # the mount point exists; the driver container fills it
    dev.mkdir()
    clock = [0.0]
    polls = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        clock[0] += seconds
        if len(polls) == 3:  # the driver container finishes meanwhile
            populate_driver_root(driver, [0], layout="operator", dev_root=dev)

    with capture_logs() as logs:
        missing = wait_for_driver(DriverRoot(driver, dev_root=dev), timeout=None, interval=2,
                                  sleep=sleep, clock=lambda: clock[0])
    assert missing == [] and polls == [2, 2, 2]
    events = [e["event"] for e in logs]
    # Said once while unchanged, not at every poll; then the all-clear.
    assert events == ["waiting for the NVIDIA driver", "NVIDIA driver is ready"]
    assert any("libcuda.so.1 not found" in p for p in logs[0]["missing"])
    assert logs[1]["waited_s"] == 6.0


def test_gives_up_after_the_timeout_with_what_is_still_missing(tmp_path):
    driver, dev = tmp_path / "driver", tmp_path / "dev"
    populate_driver_root(driver, [0], dev_root=dev)
    shutil.rmtree(dev / "proc")
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    missing = wait_for_driver(DriverRoot(driver, dev_root=dev), timeout=10, interval=3,
                              sleep=sleep, clock=lambda: clock[0])
    assert missing == [f"the NVIDIA kernel module is not loaded (no "
                       f"{dev}/proc/driver/nvidia/version)"]
    assert clock[0] == 10  # at its timeout, not at the next poll after it (3+3+3+1)
