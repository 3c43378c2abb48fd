"""``gpudra inventory``: the node's devices as a table, or its ResourceSlices as YAML/JSON."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpudra.api.quantity import format_quantity
from gpudra.cli.mig_flags import add_mig_flags, mig_offer
from gpudra.cli.options import (
    CliError,
    add_driver_flags,
    add_simulation_flags,
    check_simulate_profile,
    env,
    feature_gates,
    node_name,
    nvml_session,
)
from gpudra.cli.output import (
    EXIT_STATUS_HELP,
    STRUCTURED,
    UsageError,
    add_output_flag,
    emit,
    table,
)
from gpudra.controller.slice_validation import SliceValidationError, ensure_valid
from gpudra.controller.slices import build_slices, slice_list
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.devices import Device, NodeDevices
from gpudra.driver.gpu_shares import NONE, ShareableError, parse_shareable
from gpudra.driver.inventory import read_inventory, simulated_pcie_root, sysfs_pcie_root

if TYPE_CHECKING:
    from gpudra.driver.nvml import Nvml
    from gpudra.driver.prepare_plan import NodeIndex

# Beyond this many devices (a DGX with dynamic MIG publishes 208), the default table lists
# the GPUs and existing MIG devices and sums up the MIG devices that would be made on demand.
BIG_NODE = 64
TYPES = ("gpu", "mig")


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "inventory", help="print this node's GPUs as DRA devices or ResourceSlices",
        description="Read the node's GPUs (real NVML, or --simulate PROFILE) and print the "
                    "DRA devices the driver would publish: a table, or the ResourceSlices "
                    "(-o json|yaml, ready for kubectl apply).",
        epilog=EXIT_STATUS_HELP)
    add_driver_flags(parser)
    add_simulation_flags(parser)
    add_mig_flags(parser)
    add_output_flag(parser, "the node's ResourceSlices as a List, whole")
    parser.add_argument("--gpu", action="append", metavar="N|UUID",
                        help="only the devices of this GPU: N as in the device names (gpu-N), "
                             "or its UUID (repeatable)")
    parser.add_argument("--type", choices=TYPES, help="only full GPUs, or only MIG devices")
    parser.add_argument("--all", action="store_true",
                        help=f"every device, also on nodes with more than {BIG_NODE} (where "
                             "the table sums up the MIG devices made on demand)")
    add_root_flags(parser)
    parser.add_argument("--plugins-dir", type=Path,
                        default=env("KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins"),
                        help="the kubelet plugins dir of the node daemon, whose data directory "
                             "(<dir>/<driver name>) says which hardware it holds for claims it "
                             "cannot name: those devices show its taint (env "
                             "KUBELET_PLUGINS_DIRECTORY_PATH)")
    parser.add_argument("--shareable-gpus", metavar="all|none|LIST",
                        default=env("SHAREABLE_GPUS", "none"),
                        help="GPUs that also publish a shared device, as the node daemon's "
                             "flag: all, none, or minors/UUIDs (env SHAREABLE_GPUS; default "
                             "none; needs the ConsumableCapacity gate)")
    parser.set_defaults(run=run)


def add_root_flags(parser: argparse.ArgumentParser) -> None:
    """Where the driver is, as the node daemon's flags say it: inside the plugin pod
    ``kubectl exec … -- gpudra inventory`` finds it through the same environment."""
    parser.add_argument("--driver-root", type=Path, default=env("DRIVER_ROOT"),
                        help="NVIDIA driver root as this process sees it, searched for "
                             "libnvidia-ml.so.1 (env DRIVER_ROOT; default /)")
    parser.add_argument("--dev-root", type=Path, default=env("DEV_ROOT"),
                        help="where the NVIDIA device nodes (dev/) and proc/ are, as this "
                             "process sees it; named in the diagnosis when NVML fails (env "
                             "DEV_ROOT; default /)")


def collect_devices(args: argparse.Namespace) -> NodeDevices:
    try:  # a bad flag value: a usage error (exit status 2) for the commands that print
        gates = feature_gates(args)
        check_simulate_profile(args)
        offer = mig_offer(args)
    except CliError as exc:
        raise UsageError(str(exc)) from exc
    with _nvml(args) as nvml:
        resolver = simulated_pcie_root if args.simulate else sysfs_pcie_root
        inventory = read_inventory(nvml, pcie_root=resolver)
    for gpu in inventory.unavailable:  # one bad GPU leaves out that GPU, not the node
        name = f"GPU {gpu.index}" + (f" ({gpu.uuid})" if gpu.uuid else "")
        print(f"gpudra inventory: warning: {name} is left out: {gpu.reason}", file=sys.stderr)
    try:
        shareable = parse_shareable(getattr(args, "shareable_gpus", None))
    except ShareableError as exc:
        raise UsageError(str(exc)) from exc
    if not gates.enabled("ConsumableCapacity"):
        shareable = NONE
    vfio = None
    if gates.enabled("PassthroughSupport"):  # the node's vfio devices too
        from gpudra.driver.vfio_setup import cli_offer

        vfio = cli_offer(inventory, simulate=bool(args.simulate))
    options = ModelOptions(dynamic_mig=gates.enabled("DynamicMIG"), mig=offer,
                           shareable=shareable, vfio=vfio)
    plugins_dir = getattr(args, "plugins_dir", None)
    if plugins_dir is not None:
        held = _held(Path(plugins_dir) / args.driver_name)
        if held is not None:
            # Imported here: prepare targets (and their config models) only when needed.
            from gpudra.driver.prepare_plan import NodeIndex

            return held(NodeIndex.build(node_name(args), inventory, options))
    return build_devices(inventory, options)


def _held(data_dir: Path) -> Callable[[NodeIndex], NodeDevices] | None:
    """The node daemon's taint on devices sharing hardware it holds for claims it cannot
    name (its ``held-unknown.json``, kept across its restarts); None when it holds none.
    Health taints (XIDs, a lost GPU) live in the running daemon only: its ResourceSlices
    (``kubectl get resourceslices``) show them."""
    from gpudra.driver.health import rfc3339
    from gpudra.driver.held import HELD_FILE, parse_held, with_held_taints

    path = data_dir / HELD_FILE
    try:
        content = path.read_bytes()
        since = rfc3339(path.stat().st_mtime)
    except FileNotFoundError:
        return None
    except OSError as exc:
        print(f"gpudra inventory: warning: {path}: {exc.strerror}", file=sys.stderr)
        return None
    try:
        held = parse_held(content, str(path))
    except ValueError as exc:
        print(f"gpudra inventory: warning: {exc}", file=sys.stderr)
        return None
    return lambda index: with_held_taints(index.devices, held, index.targets, since)


@contextmanager
def _nvml(args: argparse.Namespace) -> Iterator[Nvml]:
    """NVML as the node daemon opens it (from ``--driver-root``); when it cannot be opened,
    the error says what is missing under the driver and device roots."""
    with ExitStack() as stack:
        try:
            nvml = stack.enter_context(nvml_session(args))
        except CliError as exc:
            raise CliError(_diagnosed(str(exc), args)) from exc
        yield nvml


def _diagnosed(message: str, args: argparse.Namespace) -> str:
    driver_root = getattr(args, "driver_root", None)
    dev_root = getattr(args, "dev_root", None)
    if args.simulate or (driver_root is None and dev_root is None):
        return message
    from gpudra.driver.driver_root import DriverRoot
    from gpudra.driver.driver_wait import diagnose

    problems = diagnose(DriverRoot(driver_root or Path("/"), dev_root=dev_root or Path("/")))
    return f"{message}; {'; '.join(problems)}" if problems else message


def run(args: argparse.Namespace) -> int:
    filtered = bool(args.gpu or args.type or args.all)
    if filtered and args.output in STRUCTURED:
        raise UsageError("--gpu, --type and --all choose table rows; -o json|yaml prints the "
                         "node's ResourceSlices whole")
    devices = collect_devices(args)
    if args.output in ("table", "wide"):
        wanted = select(devices, gpus=args.gpu or (), kind=args.type)
        summarise = not filtered and len(devices.devices) > BIG_NODE
        print_table(devices, wanted, sys.stdout, wide=args.output == "wide",
                    summarise=summarise)
        return 0
    slices = build_slices(devices, driver=args.driver_name, node_name=node_name(args))
    try:
        ensure_valid(slices)
    except SliceValidationError as exc:  # a bug in the driver, not user input
        raise CliError(f"refusing to print invalid slices: {exc}") from exc
    emit(slice_list(slices), args.output)
    return 0


def _gpu_uuids(devices: NodeDevices) -> dict[str, str]:
    """Group (gpu-N) → the GPU's UUID, from the full GPU or any of its MIG devices."""
    uuids: dict[str, str] = {}
    for device in devices.devices:
        uuid = device.attributes.get("uuid" if device.type == "gpu" else "parentUUID")
        if isinstance(uuid, str):
            uuids.setdefault(device.group, uuid)
    return uuids


def select(devices: NodeDevices, *, gpus: Sequence[str] = (),
           kind: str | None = None) -> list[Device]:
    """The devices of these GPUs (number or UUID) and this type; an unknown GPU: UsageError."""
    groups: set[str] = set()
    uuids = _gpu_uuids(devices)
    by_uuid = {uuid.lower(): group for group, uuid in uuids.items()}
    for gpu in gpus:
        group = f"gpu-{gpu}" if gpu.isdigit() else by_uuid.get(gpu.lower())
        if group not in devices.groups:
            known = ", ".join(devices.groups) or "none"
            raise UsageError(f"--gpu {gpu}: no such GPU on this node (GPUs: {known})")
        groups.add(group)
    return [d for d in devices.devices
            if (not groups or d.group in groups) and (kind is None or d.type == kind)]


def _dynamic(device: Device) -> bool:
    """A MIG device the driver would create on demand (it has no UUID yet)."""
    return device.type == "mig" and "uuid" not in device.attributes


def _taints(device: Device) -> str:
    return ",".join(f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
                    for t in device.taints) or "-"


def _row(device: Device, wide: bool, taints: bool = False) -> list[str]:
    attrs = device.attributes
    kind = device.type
    what = str(attrs.get("profile") if kind == "mig" else attrs.get("productName", ""))
    ident = str(attrs.get("uuid") or f"parent {attrs.get('parentUUID', '')}")
    memory = device.capacity.get("memory")
    row = [
        device.name,
        kind + (" (dynamic)" if _dynamic(device) else ""),
        what,
        format_quantity(memory) if memory is not None else "-",
        str(attrs.get("numaNode", "-")),
        str(attrs.get("nvlinkDomain", "-")),
    ]
    if wide:
        row += [
            str(device.capacity.get("multiprocessors", "-")),
            str(attrs.get("architecture", "-")),
            str(attrs.get("cudaComputeCapability", "-")),
            str(attrs.get("resource.kubernetes.io/pciBusID", "-")),
        ]
    return [*row, ident, _taints(device)] if wide or taints else [*row, ident]


def _summary(hidden: Sequence[Device]) -> str:
    counts = set(Counter(d.group for d in hidden).values())
    each = f"{counts.pop()} per GPU, " if len(counts) == 1 else ""
    profiles = sorted({str(d.attributes.get("profile")) for d in hidden})
    span = profiles[0] if len(profiles) == 1 else f"{profiles[0]} … {profiles[-1]}"
    return (f"+ {len(hidden)} MIG devices made on demand ({each}profiles {span}): "
            "--type mig or --all lists them")


def print_table(devices: NodeDevices, wanted: Sequence[Device], out: TextIO, *,
                wide: bool = False, summarise: bool = False) -> None:
    header = ["DEVICE", "TYPE", "PRODUCT/PROFILE", "MEMORY", "NUMA", "NVLINK"]
    if wide:
        header += ["SMS", "ARCH", "CC", "PCI BUS"]
    hidden = [d for d in wanted if _dynamic(d)] if summarise else []
    shown = [d for d in wanted if not (summarise and _dynamic(d))]
    # The default table shows TAINTS once a device has one (-o wide always does).
    taints = wide or any(d.taints for d in wanted)
    header += ["UUID", "TAINTS"] if taints else ["UUID"]
    for line in table(header, [_row(d, wide, taints) for d in shown]):
        out.write(line + "\n")
    if hidden:
        out.write(_summary(hidden) + "\n")
    gpus = len(devices.groups)
    listed = "" if len(wanted) == len(devices.devices) else f"{len(wanted)} of "
    out.write(f"\n{listed}{len(devices.devices)} devices on {gpus} GPU{'s' if gpus != 1 else ''}, "
              f"{len(devices.counter_sets)} shared counter sets\n")
