"""The one seam for driver operations NVML cannot express (``nvidia-smi``, MPS control).

Production runs the driver root's binaries; the simulator implements the same commands
(``gpudra.driver.sim.commands``) so the code calling them is the same in every test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from gpudra.driver.driver_root import BINARY_DIRS, DriverRoot


class CommandError(RuntimeError):
    """A driver command failed; the message has the command and its output."""


class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            stdin: str | None = None) -> str:
        """Run a driver command to completion; returns stdout, raises CommandError."""


class HostCommandRunner:
    """Runs binaries from the NVIDIA driver root with its libraries on the search path."""

    def __init__(self, driver_root: Path, *, timeout: float = 30.0) -> None:
        self.driver_root = driver_root
        self.timeout = timeout

    def _resolve(self, name: str) -> str:
        for folder in BINARY_DIRS:
            candidate = self.driver_root / folder / name
            if candidate.exists():
                return str(candidate)
        raise CommandError(f"{name} not found under the driver root {self.driver_root}")

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        libs = [str(d) for d in DriverRoot(self.driver_root).library_dirs()]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if self.driver_root != Path("/") and libs:
            env["LD_LIBRARY_PATH"] = ":".join(libs)
        env.update(extra or {})
        return env

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            stdin: str | None = None) -> str:
        command = [self._resolve(argv[0]), *argv[1:]]
        try:
            done = subprocess.run(command, input=stdin, capture_output=True, text=True,
                                  env=self._env(env), timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CommandError(f"{' '.join(argv)}: {exc}") from exc
        if done.returncode != 0:
            output = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise CommandError(f"{' '.join(argv)} exited {done.returncode}: {' | '.join(output)}")
        return done.stdout


def set_time_slice(runner: CommandRunner, uuid: str, value: int) -> None:
    """``nvidia-smi compute-policy --set-timeslice`` (0 Default, 1 Short, 2 Medium, 3 Long)."""
    runner.run(["nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", str(value)])
