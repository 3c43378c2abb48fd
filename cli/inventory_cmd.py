"""``gpudra inventory``: the node's devices as a table, or its ResourceSlices as YAML/JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

import yaml

from gpudra.api.quantity import format_quantity
from gpudra.cli.options import (
    CliError,
    add_driver_flags,
    add_simulation_flags,
    feature_gates,
    node_name,
    nvml_session,
)
from gpudra.controller.slice_validation import SliceValidationError, ensure_valid
from gpudra.controller.slices import build_slices, slice_list
from gpudra.driver.device_model import ModelOptions, build_devices
from gpudra.driver.devices import Device, NodeDevices
from gpudra.driver.inventory import read_inventory, simulated_pcie_root, sysfs_pcie_root


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "inventory", help="print this node's GPUs as DRA devices or ResourceSlices",
        description="Read the node's GPUs (real NVML, or --simulate PROFILE) and print the "
                    "DRA devices the driver would publish.")
    add_driver_flags(parser)
    add_simulation_flags(parser)
    parser.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table",
                        help="table of devices (default), or the ResourceSlices as a List")
    parser.set_defaults(run=run)


def collect_devices(args: argparse.Namespace) -> NodeDevices:
    gates = feature_gates(args)
    with nvml_session(args) as nvml:
        resolver = simulated_pcie_root if args.simulate else sysfs_pcie_root
        inventory = read_inventory(nvml, pcie_root=resolver)
    return build_devices(inventory, ModelOptions(dynamic_mig=gates.enabled("DynamicMIG")))


def run(args: argparse.Namespace) -> int:
    devices = collect_devices(args)
    if args.output == "table":
        print_table(devices, sys.stdout)
        return 0
    slices = build_slices(devices, driver=args.driver_name, node_name=node_name(args))
    try:
        ensure_valid(slices)
    except SliceValidationError as exc:  # a bug in the driver, not user input
        raise CliError(f"refusing to print invalid slices: {exc}") from exc
    document = slice_list(slices)
    if args.output == "json":
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump(document, sys.stdout, sort_keys=False)
    return 0


def _row(device: Device) -> list[str]:
    attrs = device.attributes
    kind = device.type
    what = str(attrs.get("profile") if kind == "mig" else attrs.get("productName", ""))
    ident = str(attrs.get("uuid") or f"parent {attrs.get('parentUUID', '')}")
    memory = device.capacity.get("memory")
    return [
        device.name,
        kind + ("" if kind != "mig" or "uuid" in attrs else " (dynamic)"),
        what,
        format_quantity(memory) if memory is not None else "-",
        str(attrs.get("numaNode", "-")),
        str(attrs.get("nvlinkDomain", "-")),
        ident,
    ]


def print_table(devices: NodeDevices, out: TextIO) -> None:
    header = ["DEVICE", "TYPE", "PRODUCT/PROFILE", "MEMORY", "NUMA", "NVLINK", "UUID"]
    rows = [_row(d) for d in devices.devices]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")
    gpus = len(devices.groups)
    out.write(f"\n{len(devices.devices)} devices on {gpus} GPU{'s' if gpus != 1 else ''}, "
              f"{len(devices.counter_sets)} shared counter sets\n")
