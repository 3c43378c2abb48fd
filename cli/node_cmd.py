"""``gpudra node``: the node daemon's flags, turned into one checked :class:`NodeConfig`
and handed to :func:`gpudra.kubeletplugin.node.daemon.serve` (which says what the daemon does).

The daemon is imported only when it runs (not for ``--help``), and only its first phase
then: the time until the kubelet's ``GetInfo`` is answered is mostly imports.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import structlog

from gpudra.api.identifiers import IdentifierError, check_driver, check_namespace
from gpudra.cli.logs import LogFormat, configure_logging, fatal_line, resolve_format
from gpudra.cli.mig_flags import add_mig_flags, mig_offer
from gpudra.cli.options import (
    CliError,
    add_driver_flags,
    add_simulation_flags,
    check_simulate_profile,
    env,
    feature_gates,
    node_name,
)
from gpudra.cli.signals import run_until_signalled
from gpudra.driver.featuregates import DEFAULTS as GATES
from gpudra.driver.gpu_shares import NONE, ShareableError, ShareableGpus, parse_shareable
from gpudra.driver.health import (
    DEFAULT_QUIET_PERIOD,
    HealthPolicy,
    parse_recovery_effect,
    parse_xids,
)
from gpudra.kube.resource_versions import CHOICES as RESOURCE_API_CHOICES
from gpudra.kubeletplugin.node.node_config import NodeConfig

log = structlog.get_logger("gpudra.node")

FATAL_EVENT = "gpudra node failed"
"""The ``event`` of the one JSON line a fatal error is, under ``--log-format json``."""
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "console", "auto")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_REGISTRATION_TIMEOUT = 30.0


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "node", help="run the node daemon (kubelet plugin and ResourceSlice publisher)",
        description="Serve the kubelet's DRA calls for this node's NVIDIA GPUs and publish "
                    "them as ResourceSlices. Every flag has an environment fallback.")
    add_driver_flags(parser)
    add_simulation_flags(parser)
    parser.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                        help="kubeconfig file (env KUBECONFIG; default in-cluster config)")
    parser.add_argument("--resource-api-version", choices=RESOURCE_API_CHOICES,
                        default=env("RESOURCE_API_VERSION", "auto"),
                        help="resource.k8s.io version to publish and read in: auto (the first "
                             "the API server serves of v1, v1beta2, v1beta1), or one of them "
                             "(env RESOURCE_API_VERSION; default auto)")
    parser.add_argument("--registrar-dir", type=Path,
                        default=env("KUBELET_REGISTRAR_DIRECTORY_PATH",
                                    "/var/lib/kubelet/plugins_registry"),
                        help="kubelet plugin registration dir "
                             "(env KUBELET_REGISTRAR_DIRECTORY_PATH)")
    parser.add_argument("--plugins-dir", type=Path,
                        default=env("KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins"),
                        help="kubelet plugins dir (env KUBELET_PLUGINS_DIRECTORY_PATH)")
    parser.add_argument("--cdi-root", type=Path, default=env("CDI_ROOT", "/var/run/cdi"),
                        help="where per-claim CDI specs are written (env CDI_ROOT)")
    parser.add_argument("--driver-root", type=Path, default=env("DRIVER_ROOT"),
                        help="NVIDIA driver root as this process sees it (env DRIVER_ROOT; "
                             "default /, or a generated root when simulating)")
    parser.add_argument("--host-driver-root", type=Path, default=env("HOST_DRIVER_ROOT"),
                        help="the same root as the host sees it, for CDI paths "
                             "(env HOST_DRIVER_ROOT; default --driver-root)")
    parser.add_argument("--dev-root", type=Path, default=env("DEV_ROOT"),
                        help="where the NVIDIA device nodes (dev/) and proc/ are, as this "
                             "process sees it (env DEV_ROOT; default /, or a generated root "
                             "when simulating)")
    parser.add_argument("--host-dev-root", type=Path, default=env("HOST_DEV_ROOT"),
                        help="the same root as the host sees it (env HOST_DEV_ROOT; default "
                             "--dev-root)")
    parser.add_argument("--cdi-hook-path", default=env("NVIDIA_CDI_HOOK_PATH"),
                        help="host path of nvidia-cdi-hook (or nvidia-ctk) for CDI hooks "
                             "(env NVIDIA_CDI_HOOK_PATH; default: searched under the driver "
                             "root)")
    parser.add_argument("--pod-uid", default=env("POD_UID"),
                        help="this pod's UID: per-pod socket names for rolling updates "
                             "(env POD_UID)")
    parser.add_argument("--http-address", default=env("HTTP_ADDRESS", "127.0.0.1:8080"),
                        help="host:port for /metrics, /healthz, /readyz (env HTTP_ADDRESS; "
                             "empty disables)")
    parser.add_argument("--log-format", choices=LOG_FORMATS,
                        default=env("LOG_FORMAT", "json"), help="env LOG_FORMAT")
    parser.add_argument("--log-level", type=_level_name, choices=LOG_LEVELS,
                        default=env("LOG_LEVEL", "info"), help="env LOG_LEVEL")
    parser.add_argument("--registration-timeout", metavar="SECONDS",
                        default=env("REGISTRATION_TIMEOUT", ""),
                        help="ResourceSlices are published once the kubelet has registered "
                             "the plugin; after this many seconds without it, say so in the "
                             "log and /readyz, and go on waiting (env REGISTRATION_TIMEOUT; "
                             f"default {DEFAULT_REGISTRATION_TIMEOUT:g})")
    parser.add_argument("--additional-xids-to-ignore",
                        default=env("ADDITIONAL_XIDS_TO_IGNORE", ""),
                        help="comma-separated XIDs treated as application faults (taint effect "
                             "None) on top of 13,31,43,45,68,109 (env ADDITIONAL_XIDS_TO_IGNORE)")
    parser.add_argument("--xid-quiet-period", metavar="SECONDS",
                        default=env("XID_QUIET_PERIOD", ""),
                        help="seconds without a new critical XID after which a GPU's XID taint "
                             f"clears; 0 keeps taints until restart (env XID_QUIET_PERIOD; "
                             f"default {DEFAULT_QUIET_PERIOD:g})")
    parser.add_argument("--recovery-taint-effect", metavar="NoSchedule|NoExecute",
                        default=env("RECOVERY_TAINT_EFFECT", "NoSchedule"),
                        help="effect of the gpu.nvidia.com/recovery taint on a GPU that needs "
                             "a reset or reboot (its driver's recovery action, or NVIDIA's "
                             "XID catalog): NoExecute also evicts its pods (env "
                             "RECOVERY_TAINT_EFFECT; default NoSchedule)")
    parser.add_argument("--shareable-gpus", metavar="all|none|LIST",
                        default=env("SHAREABLE_GPUS", "none"),
                        help="GPUs that also publish a shared device for fractional claims "
                             "(class gpu-share.nvidia.com): all, none, or comma-separated "
                             "minor numbers or UUIDs (env SHAREABLE_GPUS; default none; needs "
                             "the ConsumableCapacity gate)")
    add_mig_flags(parser)
    parser.add_argument("--shutdown-grace", type=float, default=env("SHUTDOWN_GRACE", "10"),
                        help="seconds in-flight calls may take to finish at shutdown "
                             "(env SHUTDOWN_GRACE; default 10)")
    parser.add_argument("--usage-interval", metavar="DURATION",
                        default=env("USAGE_INTERVAL", "10s"),
                        help="how often to sample what prepared claims do with their GPUs "
                             "(per-claim metrics, idle detection); 0 turns sampling off "
                             "(env USAGE_INTERVAL; default 10s)")
    parser.add_argument("--idle-threshold", metavar="PERCENT",
                        default=env("IDLE_THRESHOLD", "5"),
                        help="SM utilisation under which a device counts as idle "
                             "(env IDLE_THRESHOLD; default 5)")
    parser.add_argument("--idle-after", metavar="DURATION",
                        default=env("IDLE_AFTER", "30m"),
                        help="a claim whose devices all stay under --idle-threshold this long "
                             "is idle (env IDLE_AFTER; default 30m)")
    parser.add_argument("--mps-daemons", metavar="pod|container",
                        default=env("MPS_DAEMONS", "container"),
                        help="where MPS control daemons run: pod (one Pod per shared GPU, "
                             "created through the API server, which outlives this daemon's "
                             "pod: the chart's default) or container (inside this container, "
                             "detached; they die with it) (env MPS_DAEMONS; default container)")
    parser.add_argument("--mps-image", default=env("MPS_IMAGE"),
                        help="image of the MPS control daemon pods, this daemon's own "
                             "(env MPS_IMAGE; needed with --mps-daemons pod)")
    parser.add_argument("--namespace", default=env("POD_NAMESPACE"),
                        help="the driver's namespace, where MPS control daemon pods are "
                             "created (env POD_NAMESPACE; needed with --mps-daemons pod)")
    parser.set_defaults(run=run)


def _mps_daemons(args: argparse.Namespace) -> dict[str, Any]:
    """``--mps-daemons`` with the image and namespace a pod needs, checked."""
    mode = str(args.mps_daemons).strip()
    if mode not in ("pod", "container"):
        raise CliError(f"--mps-daemons (env MPS_DAEMONS): {mode!r} is not one of pod, "
                       "container")
    if mode == "container":
        return {"mps_daemons": mode}
    if not args.mps_image:
        raise CliError("--mps-daemons pod needs --mps-image (env MPS_IMAGE): the image of "
                       "the MPS control daemon pods")
    try:
        namespace = check_namespace(args.namespace, "--namespace (env POD_NAMESPACE)")
    except IdentifierError as exc:
        raise CliError(f"--mps-daemons pod needs the driver's namespace: {exc}") from None
    return {"mps_daemons": mode, "mps_image": args.mps_image, "namespace": namespace}


def _driver_name(args: argparse.Namespace) -> str:
    """The driver name names directories, sockets and CDI specs: a DNS subdomain of at most
    63 characters, as the apiserver requires of it."""
    try:
        return check_driver(args.driver_name, "--driver-name (env DRIVER_NAME)")
    except IdentifierError as exc:
        raise CliError(str(exc)) from None


def node_config(args: argparse.Namespace) -> NodeConfig:
    """The daemon's settings from the parsed flags; a bad value is a one-line CliError."""
    check_simulate_profile(args)
    return NodeConfig(
        node_name=node_name(args), driver_name=_driver_name(args), gates=feature_gates(args),
        shareable=_shareable(args), mig=mig_offer(args),
        health=_health_policy(args), kubeconfig=args.kubeconfig or None,
        resource_api=args.resource_api_version,
        registrar_dir=args.registrar_dir, plugins_dir=args.plugins_dir,
        cdi_root=args.cdi_root, driver_root=args.driver_root,
        host_driver_root=args.host_driver_root, dev_root=args.dev_root,
        host_dev_root=args.host_dev_root, cdi_hook_path=args.cdi_hook_path or None,
        simulate=args.simulate or None,
        sim_state=args.sim_state, pod_uid=args.pod_uid or None,
        http_address=_http_address(args.http_address),
        registration_timeout=_registration_timeout(args.registration_timeout),
        shutdown_grace=args.shutdown_grace,
        usage_interval=_duration(args.usage_interval, "--usage-interval (env USAGE_INTERVAL)",
                                 zero_ok=True),
        idle_threshold=_idle_threshold(args.idle_threshold),
        idle_after=_duration(args.idle_after, "--idle-after (env IDLE_AFTER)"),
        **_mps_daemons(args))


def _shareable(args: argparse.Namespace) -> ShareableGpus:
    """``--shareable-gpus``, or none at all with the ConsumableCapacity gate off."""
    try:
        chosen = parse_shareable(args.shareable_gpus)
    except ShareableError as exc:
        raise CliError(f"{exc} (env SHAREABLE_GPUS)") from None
    return chosen if feature_gates(args).enabled("ConsumableCapacity") else NONE


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(text: str, flag: str, *, zero_ok: bool = False) -> float:
    """Seconds from ``90``, ``90s``, ``500ms``, ``5m`` or ``1h``."""
    value = text.strip()
    unit = next((u for u in ("ms", "s", "m", "h") if value.endswith(u)), "s")
    number = value[:-len(unit)] if value.endswith(unit) else value
    try:
        seconds = float(number) * _DURATION_UNITS[unit]
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and (seconds > 0 or (zero_ok and seconds == 0))):
        need = ">= 0" if zero_ok else "> 0"
        raise CliError(f"{flag}: {text!r}: need a duration {need} (such as 10s, 5m, 1h)")
    return seconds


def _idle_threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 100:
        raise CliError(f"--idle-threshold (env IDLE_THRESHOLD): {text!r}: need a percentage "
                       "from 0 to 100")
    return value


def _health_policy(args: argparse.Namespace) -> HealthPolicy:
    try:
        extra = parse_xids(args.additional_xids_to_ignore,
                           field_name="--additional-xids-to-ignore")
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    try:
        effect = parse_recovery_effect(
            args.recovery_taint_effect,
            field_name="--recovery-taint-effect (env RECOVERY_TAINT_EFFECT)")
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    return HealthPolicy.with_additional(extra, quiet_period=_quiet_period(args.xid_quiet_period),
                                        recovery_effect=effect)


def _quiet_period(text: str) -> float | None:
    """Seconds; empty: the default; 0: None (taints stay until restart)."""
    if not text.strip():  # an empty XID_QUIET_PERIOD means unset
        return DEFAULT_QUIET_PERIOD
    flag = "--xid-quiet-period (env XID_QUIET_PERIOD)"
    try:
        seconds = float(text)
    except ValueError:
        raise CliError(f"{flag}: {text!r} is not a number of seconds") from None
    if not (math.isfinite(seconds) and seconds >= 0):
        raise CliError(f"{flag}: {text!r}: need seconds >= 0 (0 keeps XID taints until "
                       "restart)")
    return seconds or None


def _registration_timeout(text: str) -> float:
    """Seconds > 0; empty: the default."""
    if not text.strip():
        return DEFAULT_REGISTRATION_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise CliError(f"--registration-timeout (env REGISTRATION_TIMEOUT): {text!r}: need "
                       "a number of seconds > 0")
    return seconds


def _http_address(text: str) -> tuple[str, int] | None:
    """``host:port`` (an empty host or a bare port: every interface); empty: disabled."""
    if not text:
        return None
    host, _, port = text.rpartition(":")
    if not (port.isdigit() and int(port) <= 65535):
        raise CliError(f"--http-address: {text!r}: expected host:port, or empty to disable")
    return host, int(port)


def _level_name(text: str) -> str:
    """Case-insensitive; ``warn`` is ``warning``, as for the logging module."""
    name = text.strip().lower()
    return "warning" if name == "warn" else name


def _log_settings(args: argparse.Namespace) -> tuple[LogFormat, str]:
    # The environment fallbacks bypass argparse's own choices check.
    fmt = args.log_format
    if fmt not in LOG_FORMATS:
        raise CliError(f"--log-format (env LOG_FORMAT): {fmt!r} is not one of "
                       f"{', '.join(LOG_FORMATS)}")
    level = _level_name(args.log_level)
    if level not in LOG_LEVELS:
        raise CliError(f"--log-level (env LOG_LEVEL): unknown level {args.log_level!r} "
                       f"(choose from {', '.join(LOG_LEVELS)})")
    return fmt, level


def run(args: argparse.Namespace) -> int:
    """Run the daemon; exit status 1 after a fatal error, reported as one line: the log's
    format when it is ``json`` (one JSON object), else ``gpudra node: <error>``. After a
    clean stop the process exits 0 here, at once (:func:`_exit_now`)."""
    fmt, level = _log_settings(args)  # a bad one is a plain line: no format to use yet
    effective = resolve_format(fmt)
    from gpudra.cli.version import version
    from gpudra.kubeletplugin.node.daemon import DaemonError, serve

    try:
        config = node_config(args)
        configure_logging(fmt=effective, level=level)
        log.info("starting node daemon", version=version(), node=config.node_name,
                 driver=config.driver_name, simulate=config.simulate,
                 feature_gates={name: config.gates.enabled(name) for name in GATES})
        for note in config.gates.notes:  # NVIDIA's gate names: deprecated or ignored
            log.warning(note)

        run_until_signalled(lambda stop: serve(config, stop))
    except (CliError, DaemonError) as exc:
        if effective != "json":
            raise CliError(str(exc)) from exc
        fatal_line(FATAL_EVENT, error=str(exc))
        return 1
    except Exception as exc:  # a bug: its traceback, inside the one JSON line
        if effective != "json":
            raise
        fatal_line(FATAL_EVENT, error=f"{type(exc).__name__}: {exc}", exc_info=True)
        return 1
    _exit_now()


def _exit_now() -> NoReturn:
    """Exit 0 without the interpreter's finalisation: the daemon has closed everything it
    opened (sockets removed, NVML shut down, checkpoint unlocked by the kernel), and tearing
    down grpc's core and every module takes time a rolling update would wait for."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)
