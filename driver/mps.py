"""One CUDA MPS control daemon per claim: start, configure, stop, and what containers need.

The daemon's pipe and log directories live under the plugin's data dir (a host path, so
the same directory can be bind-mounted into the claim's containers at the path CUDA
clients look for). Commands go through the :mod:`gpudra.driver.commands` seam.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudra.api.configs import MpsConfig
from gpudra.driver.cdi import ContainerEdits, Mount
from gpudra.driver.commands import CommandError, CommandRunner

CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"


@dataclass(frozen=True)
class MpsDaemon:
    directory: Path

    @property
    def pipe_dir(self) -> Path:
        return self.directory / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.directory / "log"

    def env(self, uuids: Sequence[str] = ()) -> dict[str, str]:
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
               "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}
        if uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        return env

    def container_edits(self) -> ContainerEdits:
        return ContainerEdits(
            env=(f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}",),
            mounts=(Mount(host_path=str(self.pipe_dir), container_path=CONTAINER_PIPE_DIR,
                          options=("rbind", "rw")),),
        )


class MpsManager:
    def __init__(self, runner: CommandRunner, base_dir: Path) -> None:
        self.runner = runner
        self.base_dir = base_dir

    def daemon_for(self, claim_uid: str) -> MpsDaemon:
        return MpsDaemon(self.base_dir / claim_uid)

    def start(self, claim_uid: str, uuids: Sequence[str], config: MpsConfig | None) -> MpsDaemon:
        """Start and configure the claim's daemon; on failure nothing is left running."""
        daemon = self.daemon_for(claim_uid)
        daemon.pipe_dir.mkdir(parents=True, exist_ok=True)
        daemon.log_dir.mkdir(parents=True, exist_ok=True)
        env = daemon.env(uuids)
        self.runner.run(["nvidia-cuda-mps-control", "-d"], env=env)
        try:
            for command in commands_for(config, uuids):
                self.runner.run(["nvidia-cuda-mps-control"], env=env, stdin=command + "\n")
        except CommandError:
            self.stop(claim_uid)
            raise
        return daemon

    def stop(self, claim_uid: str) -> None:
        """Quit the claim's daemon if it runs and remove its directories; idempotent."""
        daemon = self.daemon_for(claim_uid)
        if (daemon.pipe_dir / "control").exists():
            self.runner.run(["nvidia-cuda-mps-control"], env=daemon.env(), stdin="quit\n")
        shutil.rmtree(daemon.directory, ignore_errors=True)


def commands_for(config: MpsConfig | None, uuids: Sequence[str]) -> list[str]:
    """Control commands that apply a config (pure)."""
    if config is None:
        return []
    commands = []
    if config.default_active_thread_percentage is not None:
        commands.append(
            f"set_default_active_thread_percentage {config.default_active_thread_percentage}")
    limits: Mapping[str, int] = config.pinned_limits_mib(list(uuids))
    for uuid in sorted(limits):
        commands.append(f"set_default_device_pinned_mem_limit {uuid} {limits[uuid]}M")
    return commands
