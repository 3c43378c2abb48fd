"""``gpudra controller``: the ComputeDomain controller's flags, turned into one checked
:class:`~gpudra.controller.compute_domains.app.ControllerConfig` and served by
:func:`gpudra.controller.compute_domains.app.serve` (which says what the process does).

Exit status: 0 after SIGTERM/SIGINT (the Lease released), 1 on a bad flag, an unusable
kubeconfig or a lost Lease (the Deployment restarts it as a standby).
"""

from __future__ import annotations

import argparse
import math
import os
import uuid
from typing import Any

import structlog

from gpudra.api.identifiers import IdentifierError, check_label, check_name
from gpudra.cli.logs import configure_logging, fatal_line, resolve_format
from gpudra.cli.options import CliError, env
from gpudra.cli.signals import run_until_signalled

log = structlog.get_logger("gpudra.controller")

FATAL_EVENT = "gpudra controller failed"
LOG_FORMATS = ("json", "console", "auto")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_LEASE = "gpudra-compute-domain-controller"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "controller", help="run the ComputeDomain controller (IMEX daemons, domain status, "
                           "claim binding conditions)",
        description="Watch ComputeDomains (resource.nvidia.com/v1beta1) and make what each "
                    "needs: its channel ResourceClaimTemplate, one IMEX daemon pod per node "
                    "its channel claims were allocated on, its status, and the binding "
                    "conditions of its claims. Every flag has an environment fallback.")
    parser.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                        help="kubeconfig file (env KUBECONFIG; default in-cluster config)")
    parser.add_argument("--namespace", default=env("POD_NAMESPACE"),
                        help="the driver namespace: daemon pods, their claim templates and "
                             "the Lease live here (env POD_NAMESPACE; required)")
    parser.add_argument("--daemon-image", default=env("DAEMON_IMAGE"),
                        help="image of the IMEX daemon pods (env DAEMON_IMAGE; required)")
    parser.add_argument("--daemon-image-pull-policy",
                        default=env("DAEMON_IMAGE_PULL_POLICY", "IfNotPresent"),
                        choices=("Always", "IfNotPresent", "Never"),
                        help="env DAEMON_IMAGE_PULL_POLICY")
    parser.add_argument("--daemon-service-account", default=env("DAEMON_SERVICE_ACCOUNT", ""),
                        help="ServiceAccount of the daemon pods (env DAEMON_SERVICE_ACCOUNT)")
    parser.add_argument("--daemon-priority-class", default=env("DAEMON_PRIORITY_CLASS", ""),
                        help="PriorityClass of the daemon pods, so they do not queue behind "
                             "the workload that waits for them (env DAEMON_PRIORITY_CLASS)")
    parser.add_argument("--ready-timeout", default=env("READY_TIMEOUT", "5m"),
                        metavar="DURATION",
                        help="a node's daemon not Ready this long fails its claims "
                             "(ComputeDomainFailed, with the reason); keep it under the "
                             "scheduler's binding timeout, 10m by default (env READY_TIMEOUT; "
                             "default 5m)")
    parser.add_argument("--crash-restarts", default=env("CRASH_RESTARTS", "3"), metavar="N",
                        help="container restarts after which a daemon counts as crash-"
                             "looping; 0: never (env CRASH_RESTARTS; default 3)")
    parser.add_argument("--restart-delay", default=env("RESTART_DELAY", "30s"),
                        metavar="DURATION",
                        help="how long a Failed daemon pod is kept before it is replaced "
                             "(env RESTART_DELAY; default 30s)")
    parser.add_argument("--leader-elect", default=env("LEADER_ELECT", "true"),
                        choices=("true", "false"),
                        help="take a Lease before acting; false only with one replica "
                             "(env LEADER_ELECT; default true)")
    parser.add_argument("--lease-name", default=env("LEASE_NAME", DEFAULT_LEASE),
                        help=f"env LEASE_NAME; default {DEFAULT_LEASE}")
    parser.add_argument("--lease-duration", default=env("LEASE_DURATION", "15s"),
                        metavar="DURATION", help="env LEASE_DURATION; default 15s")
    parser.add_argument("--renew-deadline", default=env("RENEW_DEADLINE", "10s"),
                        metavar="DURATION", help="env RENEW_DEADLINE; default 10s")
    parser.add_argument("--retry-period", default=env("RETRY_PERIOD", "2s"),
                        metavar="DURATION", help="env RETRY_PERIOD; default 2s")
    parser.add_argument("--identity", default=env("POD_NAME"),
                        help="this candidate's name in the Lease (env POD_NAME; default "
                             "host name and a random suffix)")
    parser.add_argument("--workers", default=env("WORKERS", "4"), metavar="N",
                        help="domains reconciled at once (env WORKERS; default 4)")
    parser.add_argument("--writes-at-once", default=env("WRITES_AT_ONCE", "16"), metavar="N",
                        help="writes of one domain's reconcile in flight at once: pod "
                             "creates, claim status (env WRITES_AT_ONCE; default 16)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=env("LOG_FORMAT", "json"),
                        help="env LOG_FORMAT")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=env("LOG_LEVEL", "info"),
                        help="env LOG_LEVEL")
    parser.set_defaults(run=run)


def _duration(text: str, flag: str) -> float:
    value = text.strip()
    unit = next((u for u in ("ms", "s", "m", "h") if value.endswith(u)), "s")
    number = value[:-len(unit)] if value.endswith(unit) else value
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise CliError(f"{flag}: {text!r}: need a duration > 0 (such as 10s, 5m)")
    return seconds


def _count(text: str, flag: str, *, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise CliError(f"{flag}: {text!r}: need a whole number >= {minimum}")
    return value


def controller_config(args: argparse.Namespace) -> Any:
    """The process's settings; a bad flag is a one-line CliError naming it."""
    from gpudra.controller.compute_domains.app import ControllerConfig
    from gpudra.controller.compute_domains.leader import LeaseSettings
    from gpudra.controller.compute_domains.objects import Settings
    from gpudra.kubeletplugin.node.api_access import ApiAccessError, check_api_access

    if not args.namespace:
        raise CliError("--namespace (env POD_NAMESPACE) is required: the driver namespace")
    if not args.daemon_image:
        raise CliError("--daemon-image (env DAEMON_IMAGE) is required")
    try:
        namespace = check_label(args.namespace, "--namespace (env POD_NAMESPACE)")
        lease_name = check_name(args.lease_name, "--lease-name (env LEASE_NAME)")
        if args.daemon_service_account:
            check_name(args.daemon_service_account,
                       "--daemon-service-account (env DAEMON_SERVICE_ACCOUNT)")
        if args.daemon_priority_class:
            check_name(args.daemon_priority_class,
                       "--daemon-priority-class (env DAEMON_PRIORITY_CLASS)")
    except IdentifierError as exc:
        raise CliError(str(exc)) from None
    settings = Settings(
        namespace=namespace, daemon_image=args.daemon_image,
        daemon_service_account=args.daemon_service_account,
        daemon_priority_class=args.daemon_priority_class,
        image_pull_policy=args.daemon_image_pull_policy,
        ready_timeout=_duration(args.ready_timeout, "--ready-timeout (env READY_TIMEOUT)"),
        crash_restarts=_count(args.crash_restarts, "--crash-restarts (env CRASH_RESTARTS)",
                              minimum=0),
        restart_delay=_duration(args.restart_delay, "--restart-delay (env RESTART_DELAY)"),
        writes_at_once=_count(args.writes_at_once, "--writes-at-once (env WRITES_AT_ONCE)",
                              minimum=1))
    identity = args.identity or f"{os.uname().nodename}_{uuid.uuid4().hex[:8]}"
    lease = None
    if args.leader_elect == "true":
        try:
            lease = LeaseSettings(
                lease_name, namespace, identity,
                lease_duration=_duration(args.lease_duration, "--lease-duration"),
                renew_deadline=_duration(args.renew_deadline, "--renew-deadline"),
                retry_period=_duration(args.retry_period, "--retry-period"))
        except ValueError as exc:
            raise CliError(f"--retry-period, --renew-deadline, --lease-duration: {exc}") \
                from None
    try:
        connection = check_api_access(args.kubeconfig or None)
    except ApiAccessError as exc:
        raise CliError(str(exc)) from None
    return ControllerConfig(settings=settings, connection=connection, identity=identity,
                            lease=lease,
                            workers=_count(args.workers, "--workers (env WORKERS)", minimum=1))


def run(args: argparse.Namespace) -> int:
    effective = resolve_format(args.log_format)
    from gpudra.controller.compute_domains.app import LeadershipLost, serve

    try:
        config = controller_config(args)
        configure_logging(fmt=effective, level=args.log_level)
        log.info("starting the ComputeDomain controller", namespace=config.settings.namespace,
                 identity=config.identity, leader_election=config.lease is not None)

        run_until_signalled(lambda stop: serve(config, stop))
    except (CliError, LeadershipLost) as exc:
        if effective != "json":
            raise CliError(str(exc)) from exc
        fatal_line(FATAL_EVENT, logger="gpudra.controller", error=str(exc))
        return 1
    except Exception as exc:
        if effective != "json":
            raise
        fatal_line(FATAL_EVENT, logger="gpudra.controller",
                   error=f"{type(exc).__name__}: {exc}", exc_info=True)
        return 1
    return 0
