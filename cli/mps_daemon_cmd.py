"""``gpudra mps-control-daemon``: the command of an MPS control daemon's own pod.

The node daemon creates one pod per shared GPU (:mod:`gpudra.driver.mps_pods`) running this
command, which replaces itself (``exec``) with the control daemon in the foreground, so the
pod's process is the daemon: ``nvidia-cuda-mps-control -f`` from the driver root (chrooted
into it when it carries its own C library, as every driver command is run), or, with
``--simulate``, the simulated node's stand-in. Its environment names the pipe and log
directories and the GPUs, as the clients' CDI specs do.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from gpudra.cli.options import CliError

_GPU_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]{1,64}")


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "mps-control-daemon",
        help="run one MPS control daemon in the foreground (the command of its pod)",
        description="Run the MPS control daemon of one shared GPU in the foreground, as the "
                    "node daemon's MPS pods do; not meant to be run by hand.")
    parser.add_argument("--pipe-dir", type=Path, required=True,
                        help="the daemon's pipe directory (CUDA_MPS_PIPE_DIRECTORY)")
    parser.add_argument("--log-dir", type=Path, required=True,
                        help="the daemon's log directory (CUDA_MPS_LOG_DIRECTORY)")
    parser.add_argument("--gpu-uuid", action="append", required=True, metavar="UUID",
                        help="a GPU (or MIG device) the daemon serves; repeatable")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--driver-root", type=Path,
                       help="the NVIDIA driver root as this container sees it")
    where.add_argument("--simulate", action="store_true",
                       help="run the simulated node's stand-in instead of the driver's")
    parser.set_defaults(run=run)


def command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The argv and environment the daemon runs with (what :func:`run` executes)."""
    # Only what the daemon needs: this runs at every start of a daemon's pod.
    from gpudra.driver import mps_process

    for flag, path in (("--pipe-dir", args.pipe_dir), ("--log-dir", args.log_dir)):
        if not path.is_absolute():
            raise CliError(f"{flag} {path}: must be an absolute path")
        if not path.is_dir():
            raise CliError(f"{flag} {path}: no such directory (the node daemon makes it "
                           "before it creates the pod; is the host path mounted?)")
    for uuid in args.gpu_uuid:
        if not _GPU_UUID.fullmatch(uuid):
            raise CliError(f"--gpu-uuid {uuid!r}: not a GPU or MIG device UUID")
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "CUDA_MPS_PIPE_DIRECTORY": str(args.pipe_dir),
        "CUDA_MPS_LOG_DIRECTORY": str(args.log_dir),
        "CUDA_VISIBLE_DEVICES": ",".join(args.gpu_uuid),
        # A daemon in its own pod: the plugin never mistakes it for one of its own children
        # (those it may signal), whichever PID namespace it is seen from.
        mps_process.OWNER_ENV: mps_process.pod_owner_mark(args.pipe_dir.parent),
    }
    if args.simulate:
        return [sys.executable, "-IS", str(mps_process.SIM_CONTROL), str(args.pipe_dir),
                str(args.log_dir)], env
    from gpudra.driver.commands import CommandError, HostCommandRunner

    try:
        return HostCommandRunner(args.driver_root).command([mps_process.CONTROL, "-f"], env)
    except CommandError as exc:
        raise CliError(str(exc)) from exc


def run(args: argparse.Namespace) -> int:
    argv, env = command(args)
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)  # the daemon replaces this process
