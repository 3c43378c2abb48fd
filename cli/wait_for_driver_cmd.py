"""``gpudra wait-for-driver``: block until the NVIDIA driver is usable (an init container)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from gpudra.cli.logs import configure_logging
from gpudra.cli.options import CliError, env
from gpudra.driver.driver_root import DriverRoot
from gpudra.driver.driver_wait import wait_for_driver


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "wait-for-driver", help="wait until the NVIDIA driver is ready (init container)",
        description="Wait until the driver root has the NVIDIA libraries and nvidia-smi, the "
                    "device root has /dev/nvidiactl and /dev/nvidia-uvm, and the kernel module "
                    "of the same version is loaded; log what is missing meanwhile.")
    parser.add_argument("--driver-root", type=Path, default=env("DRIVER_ROOT", "/"),
                        help="NVIDIA driver root as this process sees it (env DRIVER_ROOT)")
    parser.add_argument("--dev-root", type=Path, default=env("DEV_ROOT", "/"),
                        help="where dev/ and proc/ are, as this process sees it (env DEV_ROOT)")
    parser.add_argument("--timeout", metavar="SECONDS", default=env("WAIT_TIMEOUT", "0"),
                        help="seconds before giving up with exit code 1; 0 waits for ever "
                             "(env WAIT_TIMEOUT)")
    parser.add_argument("--interval", metavar="SECONDS", default="5",
                        help="seconds between checks")
    parser.add_argument("--log-format", choices=("json", "console", "auto"),
                        default=env("LOG_FORMAT", "json"), help="env LOG_FORMAT")
    parser.set_defaults(run=run)


def _seconds(flag: str, text: str, *, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CliError(f"{flag}: {text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        raise CliError(f"{flag}: {text!r}: need seconds {'>=' if zero else '>'} 0")
    return value


def run(args: argparse.Namespace) -> int:
    timeout = _seconds("--timeout (env WAIT_TIMEOUT)", args.timeout, zero=True)
    interval = _seconds("--interval", args.interval, zero=False)
    configure_logging(fmt=args.log_format, level="info")
    root = DriverRoot(args.driver_root, dev_root=args.dev_root)
    missing = wait_for_driver(root, timeout=timeout or None, interval=interval)
    if missing:
        raise CliError(f"NVIDIA driver not ready after {timeout:g}s: {'; '.join(missing)}")
    return 0
