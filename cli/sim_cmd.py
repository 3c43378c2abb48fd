"""``gpudra sim``: fault injection on a simulated GPU node (XIDs, lost GPUs), simulated load,
and hardware changes between daemon runs (GPUs pulled out, put back, replaced).

Works from any process on the node's state directory, including while a daemon runs on
it: the daemon's XID watcher sees the event within milliseconds. To swap the whole node,
start the daemon with another ``--simulate`` profile on the same state directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpudra.api.quantity import parse_quantity
from gpudra.cli.options import CliError, env
from gpudra.cli.output import UsageError
from gpudra.driver.sim import SimControl, recovery


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "sim", help="inject faults into a simulated GPU node",
        description="Raise XID errors, lose GPUs or change the GPUs of a simulated node "
                    "(gpudra node --simulate PROFILE --sim-state DIR), from any process. "
                    "--gpu is the GPU's slot (its minor number), which stays put when "
                    "another GPU is removed.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    xid = actions.add_parser("xid", help="raise an XID critical error on a GPU or MIG device")
    _add_target_flags(xid)
    xid.add_argument("--xid", type=_positive_int, required=True, metavar="X",
                     help="the XID number (e.g. 79: fallen off the bus; 13: application)")
    xid.add_argument("--mig-uuid", metavar="U",
                     help="attribute the XID to this MIG device of the GPU")
    xid.add_argument("--recovery-action", type=_recovery_action, metavar="A",
                     help="the driver also reports this GPU recovery action: "
                          + ", ".join(recovery.NAMES))
    xid.set_defaults(run=run_xid)

    action = actions.add_parser(
        "recovery-action", help="set the GPU recovery action the driver reports",
        description="What NVML's NVML_FI_DEV_GET_GPU_RECOVERY_ACTION field says for a GPU: "
                    "none once it is healthy again, or unsupported (an older driver).")
    _add_target_flags(action)
    action.add_argument("--action", required=True, metavar="A", type=_action_or_unsupported,
                        help=", ".join(recovery.NAMES) + ", unsupported")
    action.set_defaults(run=run_recovery_action)

    reset = actions.add_parser(
        "reset-gpu", help="reset an idle GPU (nvidia-smi -r): its recovery action clears")
    _add_target_flags(reset)
    reset.set_defaults(run=run_reset_gpu)

    lost = actions.add_parser("gpu-lost", help="make a GPU answer GPU_IS_LOST (or recover it)")
    _add_target_flags(lost)
    lost.add_argument("--recover", action="store_true", help="the GPU answers NVML again")
    lost.set_defaults(run=run_gpu_lost)

    load = actions.add_parser(
        "load", help="simulate work on a GPU or MIG device (SM %% and memory)",
        description="Replace the simulated load on a GPU or one of its MIG devices; "
                    "--sm 0 --memory 0 clears it. NVML then reports it as utilisation, "
                    "memory used and power.")
    _add_target_flags(load)
    load.add_argument("--mig-uuid", metavar="U", help="put the load on this MIG device")
    load.add_argument("--sm", type=_percent, required=True, metavar="PCT",
                      help="SM utilisation, 0-100")
    load.add_argument("--memory", type=_bytes, default=0, metavar="Q",
                      help="memory used, a quantity such as 20Gi (default 0)")
    load.add_argument("--for", dest="duration", type=_seconds, metavar="D",
                      help="stop after this long (60s, 5m, 1h); default: until replaced")
    load.set_defaults(run=run_load)

    for name, help_text in _HARDWARE_CHANGES.items():
        change = actions.add_parser(name, help=help_text)
        _add_target_flags(change)
        change.set_defaults(run=run_hardware_change, change=name)


_HARDWARE_CHANGES = {
    "remove-gpu": "pull a GPU out of its slot (NVML stops enumerating it)",
    "insert-gpu": "put a removed GPU back, as it was",
    "replace-gpu": "put a new GPU of the same model in the slot (a new UUID, MIG off)",
}


def _add_target_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sim-state", metavar="DIR", type=Path,
                        default=env("SIM_STATE"),
                        help="the simulated node's state directory (env SIM_STATE)")
    parser.add_argument("--gpu", type=_non_negative_int, required=True, metavar="N",
                        help="GPU index")


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError("must be within 0-100")
    return value


def _bytes(text: str) -> int:
    try:
        value = parse_quantity(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return int(value)


_UNITS = {"s": 1, "m": 60, "h": 3600}


def _seconds(text: str) -> float:
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (60s, 5m, 1h)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _action_or_unsupported(text: str) -> int | None:
    try:
        return recovery.parse_action(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _recovery_action(text: str) -> int:
    try:
        value = recovery.parse_action(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value is None:
        raise argparse.ArgumentTypeError("an XID cannot make the field unsupported")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _control(args: argparse.Namespace) -> SimControl:
    # Usage errors (exit 2): the directory is an argument, like a file kubectl cannot read.
    if args.sim_state is None:
        raise UsageError("--sim-state: required (the simulated node's state directory, as "
                         "given to gpudra node --sim-state; or set SIM_STATE)")
    try:
        return SimControl(args.sim_state)
    except FileNotFoundError as exc:
        raise UsageError(f"--sim-state: {exc}") from exc


def _gpu_uuid(control: SimControl, index: int) -> str:
    gpus = control.node.gpus
    if not 0 <= index < len(gpus):
        raise CliError(f"--gpu: no GPU {index} on this {len(gpus)}-GPU node")
    return control.gpu_uuid(index)


def run_xid(args: argparse.Namespace) -> int:
    control = _control(args)
    uuid = _gpu_uuid(control, args.gpu)
    try:
        control.raise_xid(args.gpu, args.xid, args.mig_uuid,
                          recovery_action=args.recovery_action)
    except ValueError as exc:
        flag = "--mig-uuid" if args.mig_uuid and "MIG" in str(exc) else "--recovery-action"
        raise CliError(f"{flag}: {exc}") from exc
    where = f"MIG device {args.mig_uuid} of " if args.mig_uuid else ""
    print(f"raised XID {args.xid} on {where}GPU {args.gpu} ({uuid})")
    return 0


def run_recovery_action(args: argparse.Namespace) -> int:
    control = _control(args)
    uuid = _gpu_uuid(control, args.gpu)
    control.set_recovery_action(args.gpu, args.action)
    names = {value: name for name, value in recovery.NAMES.items()}
    shown = "unsupported" if args.action is None else names[args.action]
    print(f"GPU {args.gpu} ({uuid}) reports recovery action {shown}")
    return 0


def run_reset_gpu(args: argparse.Namespace) -> int:
    control = _control(args)
    uuid = _gpu_uuid(control, args.gpu)
    try:
        control.reset_gpu(args.gpu)
    except ValueError as exc:
        raise CliError(f"--gpu: {exc}") from exc
    print(f"GPU {args.gpu} ({uuid}) was reset")
    return 0


def run_gpu_lost(args: argparse.Namespace) -> int:
    control = _control(args)
    uuid = _gpu_uuid(control, args.gpu)
    try:
        control.set_gpu_lost(args.gpu, not args.recover)
    except ValueError as exc:
        raise CliError(f"--gpu: {exc}") from exc
    state = "answers NVML again" if args.recover else "is lost (GPU_IS_LOST)"
    print(f"GPU {args.gpu} ({uuid}) {state}")
    return 0


def run_load(args: argparse.Namespace) -> int:
    control = _control(args)
    uuid = _gpu_uuid(control, args.gpu)
    try:
        control.set_load(args.gpu, mig_uuid=args.mig_uuid, sm_percent=args.sm,
                         memory_bytes=args.memory, duration=args.duration)
    except ValueError as exc:
        raise CliError(f"--{'mig-uuid' if args.mig_uuid else 'gpu'}: {exc}") from exc
    where = f"MIG device {args.mig_uuid} of " if args.mig_uuid else ""
    until = f" for {args.duration:g}s" if args.duration else ""
    print(f"load on {where}GPU {args.gpu} ({uuid}): {args.sm:g} % SM, "
          f"{args.memory / 2**30:.1f} GiB{until}")
    return 0


def run_hardware_change(args: argparse.Namespace) -> int:
    control = _control(args)
    before = _gpu_uuid(control, args.gpu)
    change = {"remove-gpu": control.remove_gpu, "insert-gpu": control.insert_gpu,
              "replace-gpu": control.replace_gpu}[args.change]
    try:
        change(args.gpu)
    except ValueError as exc:
        raise CliError(f"--gpu: {exc}") from exc
    if args.change == "remove-gpu":
        print(f"GPU {args.gpu} ({before}) removed")
    elif args.change == "insert-gpu":
        print(f"GPU {args.gpu} ({before}) is back in its slot")
    else:
        print(f"GPU {args.gpu}: {before} replaced by {control.gpu_uuid(args.gpu)}")
    return 0
