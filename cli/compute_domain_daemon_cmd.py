"""``gpudra compute-domain-daemon``: the IMEX daemon workload of one ComputeDomain on one
node (run by the controller's daemon pod; see :mod:`gpudra.kubeletplugin.node.imex_workload`)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from gpudra.cli.logs import configure_logging
from gpudra.cli.options import CliError, add_simulation_flags, check_simulate_profile, env
from gpudra.cli.signals import stop_on_signals


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "compute-domain-daemon", help="run one ComputeDomain's IMEX daemon on this node",
        description="Join this node to a ComputeDomain: publish this node's entry in its "
                    "status, write the IMEX nodes config from the peers in the same NVLink "
                    "clique, run the IMEX daemon and report whether it is ready.")
    parser.add_argument("--domain-uid", required=True)
    parser.add_argument("--domain-namespace", required=True)
    parser.add_argument("--domain-name", required=True)
    parser.add_argument("--node", default=env("NODE_NAME"), help="env NODE_NAME")
    parser.add_argument("--address", default=env("POD_IP"),
                        help="this node's IMEX address (env POD_IP)")
    add_simulation_flags(parser)
    parser.add_argument("--sim-network", type=Path, default=env("GPUDRA_SIM_IMEX_NETWORK"),
                        help="simulated IMEX network directory (env GPUDRA_SIM_IMEX_NETWORK)")
    parser.add_argument("--sim-address", default=env("GPUDRA_SIM_NODE_ADDRESS"),
                        help="a simulated node's own address, replacing --address (every "
                             "simulated pod has 127.0.0.1; env GPUDRA_SIM_NODE_ADDRESS)")
    parser.add_argument("--imex-dir", type=Path, default=env("IMEX_CONFIG_DIR"),
                        help="the domain's IMEX config directory (env IMEX_CONFIG_DIR, which "
                             "the daemon claim's CDI spec sets; default /etc/nvidia-imex)")
    parser.add_argument("--imex-root", type=Path, default=env("GPUDRA_IMEX_ROOT"),
                        help="a simulated node's per-domain directories: the domain's is "
                             "<root>/<uid> (env GPUDRA_IMEX_ROOT; pods run without CDI there)")
    parser.add_argument("--imex-binary", default=env("IMEX_BINARY", "nvidia-imex"))
    parser.add_argument("--imex-ctl", default=env("IMEX_CTL", "nvidia-imex-ctl"))
    parser.add_argument("--interval", type=float, default=0.5,
                        help="seconds between looks at the domain and the daemon")
    parser.add_argument("--kubeconfig", default=env("KUBECONFIG"))
    parser.add_argument("--log-format", choices=("json", "console", "auto"),
                        default=env("LOG_FORMAT", "json"))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import ipaddress

    from gpudra.api.identifiers import IdentifierError, check_name, check_namespace, check_uid

    check_simulate_profile(args)
    try:
        uid = check_uid(args.domain_uid, "--domain-uid")
        namespace = check_namespace(args.domain_namespace, "--domain-namespace")
        name = check_name(args.domain_name, "--domain-name")
        node = check_name(args.node or "", "--node (env NODE_NAME)")
    except IdentifierError as exc:
        raise CliError(str(exc)) from exc
    address = args.sim_address if args.simulate and args.sim_address else args.address
    try:
        address = str(ipaddress.ip_address(address or ""))
    except ValueError:
        raise CliError(f"--address (env POD_IP): {address!r} is not an IP address") from None
    configure_logging(fmt=args.log_format)
    return asyncio.run(_main(args, uid=uid, namespace=namespace, name=name, node=node,
                             address=address))


async def _main(args: argparse.Namespace, *, uid: str, namespace: str, name: str, node: str,
                address: str) -> int:
    from gpudra.driver.compute_domain_devices import FabricProblem, clique_id, node_clique
    from gpudra.driver.nvml import GpuProbe, NvmlUnavailable, open_nvml
    from gpudra.kube.raw_api import RawApi
    from gpudra.kubeletplugin.node.api_access import ApiAccessError, api_session, check_api_access
    from gpudra.kubeletplugin.node.imex_workload import (
        ImexWorkload,
        WorkloadConfig,
        WorkloadError,
        real_imex,
        simulated_imex,
    )

    try:
        nvml = open_nvml(simulate=args.simulate, sim_state=args.sim_state)
        try:
            fabric = node_clique([nvml.fabric_info(p.uuid) for p in nvml.probe_all()
                                  if isinstance(p, GpuProbe)])
        finally:
            nvml.shutdown()
    except (NvmlUnavailable, FabricProblem) as exc:
        raise CliError(f"NVLink fabric: {exc}") from exc
    if fabric is None:
        raise CliError("this node has no multi-node NVLink fabric: it cannot join a "
                       "ComputeDomain")
    if args.simulate:
        if args.sim_network is None:
            raise CliError("--sim-network (env GPUDRA_SIM_IMEX_NETWORK): needed to simulate")
        command, query = simulated_imex(args.sim_network, address, uid, min(args.interval, 0.2))
    else:
        command, query = real_imex(args.imex_binary, args.imex_ctl)
    try:
        connection = check_api_access(args.kubeconfig)
    except ApiAccessError as exc:
        raise CliError(str(exc)) from exc
    session = api_session(connection)
    workload = ImexWorkload(WorkloadConfig(
        domain_uid=uid, domain_namespace=namespace, domain_name=name, node=node,
        address=address, imex_dir=_imex_dir(args, uid), clique=clique_id(fabric),
        imex_command=command, query=query, interval=args.interval), RawApi(session))
    stop = stop_on_signals()
    try:
        await workload.run(stop)
    except WorkloadError as exc:
        raise CliError(str(exc)) from exc
    finally:
        await session.close()
    return 0


def _imex_dir(args: argparse.Namespace, uid: str) -> Path:
    from gpudra.driver.compute_domain_imex import CONTAINER_DIR, domain_dir

    if args.imex_dir is not None:
        return Path(args.imex_dir)
    if args.imex_root is not None:
        return domain_dir(args.imex_root, uid)
    return Path(CONTAINER_DIR)
