"""What ``gpudra explain --simulate`` adds for ComputeDomains: the compute-domain.nvidia.com
pool ``gpudra compute-domain-node`` would publish on the simulated node (IMEX channels and
daemon slots in the profile's NVLink clique), for profiles with multi-node NVLink."""

from __future__ import annotations

import argparse
from typing import Any


def simulated_slices(args: argparse.Namespace, node: str) -> list[dict[str, Any]]:
    """The node's compute-domain slices; none for a profile without fabric info. A fabric
    that is not ready gives the empty pool the node daemon publishes then."""
    from gpudra.cli.options import nvml_session
    from gpudra.driver.nvml import GpuProbe

    with nvml_session(args) as nvml:
        fabrics = [nvml.fabric_info(p.uuid) for p in nvml.probe_all()
                   if isinstance(p, GpuProbe)]
    if not any(fabrics):
        return []
    # Only now: the device models load pydantic, which a GPU-only explain does without.
    from gpudra.api.compute_domain import DRIVER_NAME
    from gpudra.controller.slices import build_slices
    from gpudra.driver.compute_domain_devices import FabricProblem, build_devices, node_clique
    try:
        fabric = node_clique(fabrics)
    except FabricProblem:
        fabric = None
    return list(build_slices(build_devices(fabric), driver=DRIVER_NAME, node_name=node))
