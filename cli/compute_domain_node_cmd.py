"""``gpudra compute-domain-node``: the ``compute-domain.nvidia.com`` kubelet plugin of a node
(IMEX channels and daemon slots; see :mod:`gpudra.kubeletplugin.node.compute_domain_node`
for why it is a daemon of its own)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpudra.cli.logs import configure_logging
from gpudra.cli.options import CliError, add_simulation_flags, check_simulate_profile, env
from gpudra.cli.signals import run_until_signalled


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "compute-domain-node",
        help="run the ComputeDomain kubelet plugin (IMEX channels) of this node",
        description="Serve the kubelet's DRA calls for the compute-domain.nvidia.com driver "
                    "and publish this node's IMEX channels and daemon slots in its NVLink "
                    "clique. Every flag has an environment fallback.")
    parser.add_argument("--node-name", default=env("NODE_NAME"),
                        help="this node's name (env NODE_NAME; default the host name)")
    add_simulation_flags(parser)
    parser.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                        help="kubeconfig file (env KUBECONFIG; default in-cluster config)")
    parser.add_argument("--registrar-dir", type=Path,
                        default=env("KUBELET_REGISTRAR_DIRECTORY_PATH",
                                    "/var/lib/kubelet/plugins_registry"))
    parser.add_argument("--plugins-dir", type=Path,
                        default=env("KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins"))
    parser.add_argument("--data-dir", type=Path, default=env("DATA_DIR"),
                        help="checkpoint directory (env DATA_DIR; default "
                             "<plugins-dir>/compute-domain.nvidia.com)")
    parser.add_argument("--cdi-root", type=Path, default=env("CDI_ROOT", "/var/run/cdi"))
    parser.add_argument("--driver-root", type=Path, default=env("DRIVER_ROOT"),
                        help="NVIDIA driver root as this process sees it, searched for the "
                             "NVML library (env DRIVER_ROOT; default /)")
    parser.add_argument("--imex-root", type=Path, default=env("IMEX_ROOT"),
                        help="per-domain IMEX config directories (env IMEX_ROOT; default "
                             "<data-dir>/imex)")
    parser.add_argument("--host-imex-root", type=Path, default=env("HOST_IMEX_ROOT"),
                        help="the same as the host sees it (default --imex-root)")
    parser.add_argument("--dev-root", type=Path, default=env("DEV_ROOT"),
                        help="where dev/nvidia-caps-imex-channels is (env DEV_ROOT; default /, "
                             "or a generated root when simulating)")
    parser.add_argument("--host-dev-root", type=Path, default=env("HOST_DEV_ROOT"))
    parser.add_argument("--channels", type=int, default=int(env("CHANNELS", "8") or 8),
                        help="IMEX channels published (env CHANNELS; default 8)")
    parser.add_argument("--daemons", type=int, default=int(env("DAEMONS", "8") or 8),
                        help="IMEX daemon slots published: domains per node (default 8)")
    parser.add_argument("--fabric-poll", type=float,
                        default=float(env("FABRIC_POLL", "10") or 10),
                        help="seconds between looks at the NVLink fabric, so GPUs the fabric "
                             "manager registers after start-up are published (0: at start "
                             "only; env FABRIC_POLL; default 10)")
    parser.add_argument("--pod-uid", default=env("POD_UID"))
    parser.add_argument("--log-format", choices=("json", "console", "auto"),
                        default=env("LOG_FORMAT", "json"))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpudra.cli.options import node_name
    from gpudra.kubeletplugin.node.compute_domain_node import (
        ComputeDomainNodeConfig,
        NodeDaemonError,
        serve,
    )

    check_simulate_profile(args)
    if not 0 < args.channels <= 2048 or not 0 < args.daemons <= 2048:
        raise CliError("--channels and --daemons: need 1..2048")
    data = args.data_dir or args.plugins_dir / "compute-domain.nvidia.com"
    imex = args.imex_root or data / "imex"
    dev = args.dev_root
    if dev is None and args.simulate:
        from gpudra.driver.sim.imex_channels import populate_imex_channels

        dev = data / "sim-dev"
        populate_imex_channels(dev, args.channels)
    dev = dev or Path("/")
    if args.simulate and args.sim_state is None:
        raise CliError("--sim-state: a simulated node needs its state directory (the GPU "
                       "daemon's, so both see the same hardware)")
    config = ComputeDomainNodeConfig(
        node_name=node_name(args), kubeconfig=args.kubeconfig, registrar_dir=args.registrar_dir,
        plugins_dir=args.plugins_dir, pod_uid=args.pod_uid or None, data_dir=data,
        cdi_root=args.cdi_root, imex_root=imex, host_imex_root=args.host_imex_root or imex,
        dev_root=dev, host_dev_root=args.host_dev_root or dev, simulate=args.simulate,
        sim_state=args.sim_state, driver_root=args.driver_root, channels=args.channels,
        daemons=args.daemons,
        fabric_poll=max(0.0, args.fabric_poll))
    configure_logging(fmt=args.log_format)

    try:
        run_until_signalled(lambda stop: serve(config, stop))
    except NodeDaemonError as exc:
        raise CliError(str(exc)) from exc
    return 0
