"""``gpudra top``: what every prepared claim does with its GPUs, from node daemons' metrics.

Reads ``/metrics`` of one or more node daemons (``--endpoint``, repeatable) and prints one
row per prepared device: SM utilisation, memory, power and how long the claim has been
idle. A daemon that does not answer is a line saying so, never a traceback. With
``--kubeconfig`` (or ``--context``) the rows come cluster-wide from the claims'
``status.devices`` (node, ``Idle`` condition), joined with the metrics of any ``--endpoint``.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpudra.cli.options import env
from gpudra.cli.output import (
    EXIT_FOUND,
    EXIT_OK,
    UsageError,
    add_output_flag,
    emit,
    plain_text,
    table,
)

DEFAULT_ENDPOINT = "http://127.0.0.1:8080"
FETCH_TIMEOUT = 3.0
SORT_KEYS = ("util", "idle", "memory")
_DEVICE_GAUGES = {
    "gpudra_claim_sm_utilization_percent": "sm_percent",
    "gpudra_claim_memory_used_bytes": "memory_used_bytes",
    "gpudra_claim_memory_total_bytes": "memory_total_bytes",
    "gpudra_claim_power_watts": "power_watts",
}
_IDLE = "gpudra_claim_idle_seconds"
_MPS = "gpudra_mps_control_daemons"


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "top", help="per-claim GPU utilisation, memory and idle time from node daemons",
        description=plain_text(__doc__))
    parser.add_argument("--endpoint", action="append", metavar="URL",
                        help="a node daemon's HTTP address (its --http-address), repeatable "
                             f"(env GPUDRA_ENDPOINT; default {DEFAULT_ENDPOINT})")
    parser.add_argument("--sort", choices=SORT_KEYS, default="util",
                        help="highest first: SM utilisation (default), idle time or memory")
    add_output_flag(parser, "the rows and the unreachable daemons as a document")
    parser.add_argument("-w", "--watch", action="store_true",
                        help="refresh every --interval until interrupted")
    parser.add_argument("--interval", type=_seconds, default=2.0, metavar="SECONDS",
                        help="seconds between refreshes with --watch (default 2)")
    parser.add_argument("--count", type=int, default=0, metavar="N",
                        help="with --watch, stop after N refreshes (default: never)")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="cluster-wide: every claim's device status from this cluster")
    parser.add_argument("--context", help="the kubeconfig context to use (cluster-wide)")
    parser.add_argument("--driver-name", default=env("DRIVER_NAME") or "gpu.nvidia.com",
                        help="whose status.devices entries to show (env DRIVER_NAME)")
    parser.set_defaults(run=run)


def _seconds(text: str) -> float:
    try:
        value = float(text.removesuffix("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


@dataclass
class DeviceRow:
    """One prepared device as a daemon's metrics describe it."""

    endpoint: str
    namespace: str
    claim: str
    pods: list[str]
    device: str
    gpu_uuid: str
    mig_profile: str
    share_id: str
    sm_percent: float | None = None
    memory_used_bytes: float = 0.0
    memory_total_bytes: float = 0.0
    power_watts: float | None = None
    idle_seconds: float = 0.0
    node: str = ""
    """The pool (node) from the claim's status; cluster-wide only."""
    mps: str = ""
    """Where the device's MPS control daemon runs: ``pod <namespace>/<name>`` or ``plugin
    container``; empty: it uses none (or nobody said)."""

    def document(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint, "namespace": self.namespace, "claim": self.claim,
            "pods": self.pods, "device": self.device, "gpuUUID": self.gpu_uuid,
            "migProfile": self.mig_profile or None, "shareID": self.share_id or None,
            "smPercent": self.sm_percent, "memoryUsedBytes": int(self.memory_used_bytes),
            "memoryTotalBytes": int(self.memory_total_bytes), "powerWatts": self.power_watts,
            "idleSeconds": self.idle_seconds, "node": self.node or None,
            "mpsControlDaemon": self.mps or None,
        }


@dataclass
class Snapshot:
    rows: list[DeviceRow] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    asked: int = 0


def fetch(endpoints: Sequence[str], timeout: float = FETCH_TIMEOUT) -> Snapshot:
    """Every endpoint's claim rows; an endpoint that fails is named with the reason."""
    snapshot = Snapshot(asked=len(endpoints))
    for endpoint in endpoints:
        try:
            text = _get_metrics(endpoint, timeout)
            snapshot.rows.extend(parse_rows(endpoint, text))
        except (OSError, ValueError) as exc:
            snapshot.unreachable[endpoint] = _reason(exc)
    return snapshot


def _get_metrics(endpoint: str, timeout: float) -> str:
    url = endpoint.rstrip("/") + "/metrics"
    if "://" not in url:
        url = "http://" + url
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
    return body.decode()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__


def parse_rows(endpoint: str, text: str) -> list[DeviceRow]:
    """Rows from a daemon's metrics text (one per device label set)."""
    rows: dict[tuple[str, ...], DeviceRow] = {}
    idle: dict[tuple[str, str, str], float] = {}
    mps: dict[str, str] = {}  # GPU UUID -> where its shared MPS daemon runs
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == _MPS and sample.value and \
                    labels.get("daemon", "").startswith("shared-"):
                mps[labels.get("gpu_uuid", "")] = labels.get("where", "")
                continue
            if sample.name == _IDLE:
                idle[(labels["namespace"], labels["claim"], labels["pod"])] = sample.value
                continue
            attribute = _DEVICE_GAUGES.get(sample.name)
            if attribute is None:
                continue
            key = tuple(labels.get(k, "") for k in ("namespace", "claim", "pod", "device",
                                                    "gpu_uuid", "mig_profile", "share_id"))
            row = rows.get(key)
            if row is None:
                row = rows[key] = DeviceRow(
                    endpoint, key[0], key[1], [p for p in key[2].split(",") if p], key[3],
                    key[4], key[5], key[6])
            setattr(row, attribute, sample.value)
    for row in rows.values():
        row.idle_seconds = idle.get((row.namespace, row.claim, ",".join(row.pods)), 0.0)
        if row.share_id:  # a share uses its GPU's daemon, when the GPU shares under MPS
            row.mps = mps.get(row.gpu_uuid, "")
    return list(rows.values())


def claim_status_rows(claims: Sequence[dict[str, Any]], driver: str,
                      now: float) -> list[DeviceRow]:
    """Rows from ``status.devices`` of claims: one per entry of ``driver``; an ``Idle``
    condition that is True counts from its ``lastTransitionTime``."""
    rows = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        status = claim.get("status") or {}
        pods = [r["name"] for r in status.get("reservedFor") or []
                if r.get("resource") == "pods" and isinstance(r.get("name"), str)]
        for entry in status.get("devices") or []:
            if entry.get("driver") != driver:
                continue
            data = entry.get("data") or {}
            row = DeviceRow("", str(meta.get("namespace", "")), str(meta.get("name", "")),
                            pods, str(entry.get("device", "")), str(data.get("uuid") or ""),
                            str(data.get("migProfile") or ""), str(entry.get("shareID") or ""),
                            node=str(entry.get("pool", "")), mps=_mps_status(data))
            for condition in entry.get("conditions") or []:
                if condition.get("type") == "Idle" and condition.get("status") == "True":
                    row.idle_seconds = max(0.0, now - _timestamp(condition))
            rows.append(row)
    return rows


def _mps_status(data: dict[str, Any]) -> str:
    """``data.mpsControlDaemon`` of a status entry, as the node daemon's metrics name it."""
    where = data.get("mpsControlDaemon")
    if not isinstance(where, dict):
        return ""
    if where.get("runsIn") == "pod" and where.get("pod"):
        return f"pod {where['pod']}"
    return "plugin container" if where.get("runsIn") == "pluginContainer" else ""


def _timestamp(condition: dict[str, Any]) -> float:
    text = str(condition.get("lastTransitionTime") or "")
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def join(cluster: list[DeviceRow], metrics: list[DeviceRow]) -> list[DeviceRow]:
    """Cluster rows with the figures of the matching metrics rows (same claim and device)."""
    figures = {(r.namespace, r.claim, r.device, r.share_id): r for r in metrics}
    for row in cluster:
        found = figures.get((row.namespace, row.claim, row.device, row.share_id))
        if found is not None:
            row.endpoint, row.sm_percent, row.power_watts = (found.endpoint, found.sm_percent,
                                                             found.power_watts)
            row.memory_used_bytes = found.memory_used_bytes
            row.memory_total_bytes = found.memory_total_bytes
            row.idle_seconds = max(row.idle_seconds, found.idle_seconds)
            row.gpu_uuid = row.gpu_uuid or found.gpu_uuid
            row.mps = row.mps or found.mps
    return cluster


def _cluster_claims(args: argparse.Namespace) -> list[dict[str, Any]]:
    # Imported here: the per-node view reads no cluster.
    from gpudra.cli.explain_cmd import read_cluster
    from gpudra.kube.kubeconfig import KubeconfigError, resolve
    from gpudra.kube.raw_api import RESOURCE_CLAIMS

    try:
        access = resolve(args.kubeconfig, context=args.context)
    except KubeconfigError as exc:
        raise UsageError(str(exc)) from exc
    return read_cluster(access, [RESOURCE_CLAIMS])[0]


def sort_rows(rows: list[DeviceRow], key: str) -> list[DeviceRow]:
    """Highest first; ties by namespace, claim and device."""
    def value(row: DeviceRow) -> float:
        if key == "idle":
            return row.idle_seconds
        if key == "memory":
            return row.memory_used_bytes
        return -1.0 if row.sm_percent is None else row.sm_percent

    by_name = sorted(rows, key=lambda r: (r.namespace, r.claim, r.device))
    return sorted(by_name, key=value, reverse=True)


def render(snapshot: Snapshot, fmt: str, sort: str) -> str:
    rows = sort_rows(snapshot.rows, sort)
    if fmt in ("json", "yaml"):
        out = io.StringIO()
        emit({"claims": [r.document() for r in rows],
              "unreachable": [{"endpoint": e, "error": why}
                              for e, why in snapshot.unreachable.items()]}, fmt, out)
        return out.getvalue()
    wide = fmt == "wide"
    cluster = any(r.node for r in rows)
    shared = any(r.mps for r in rows)
    header = ["NAMESPACE", "CLAIM", "POD", *(["NODE"] if cluster else []), "DEVICE", "SM%",
              "MEMORY", "POWER", "IDLE", *(["MPS"] if shared else [])]
    if wide:
        header += ["GPU", "SHARE", "ENDPOINT"]
    lines_rows = []
    for r in rows:
        cells = [r.namespace, r.claim, ",".join(r.pods) or "-",
                 *([r.node or "-"] if cluster else []), _device(r), _percent(r),
                 _memory(r), "-" if r.power_watts is None else f"{r.power_watts:.0f}W",
                 human_duration(r.idle_seconds), *([_mps_cell(r, wide)] if shared else [])]
        if wide:
            cells += [r.gpu_uuid, r.share_id or "-", r.endpoint]
        lines_rows.append(cells)
    answered = len(snapshot.unreachable) < snapshot.asked
    lines = table(header, lines_rows) if rows else (
        ["No prepared claims."] if answered else [])
    lines += [f"{endpoint}: unreachable ({why})" for endpoint, why in
              snapshot.unreachable.items()]
    return "\n".join(lines) + "\n"


def _mps_cell(row: DeviceRow, wide: bool) -> str:
    """The MPS control daemon's pod (its name; with the namespace when wide), ``plugin``
    for one in the plugin container, ``-`` for none."""
    if not row.mps:
        return "-"
    if row.mps.startswith("pod "):
        where = row.mps.removeprefix("pod ")
        return where if wide else where.rpartition("/")[2]
    return "plugin"


def _device(row: DeviceRow) -> str:
    return f"{row.device} ({row.mig_profile})" if row.mig_profile else row.device


def _percent(row: DeviceRow) -> str:
    # No figure: a MIG device on a GPU without GPM (before Hopper), or no daemon asked.
    return "n/a" if row.sm_percent is None else f"{row.sm_percent:.0f}"


def _memory(row: DeviceRow) -> str:
    if not row.memory_total_bytes:
        return "-"
    gib = 2**30
    return f"{row.memory_used_bytes / gib:.1f}/{row.memory_total_bytes / gib:.1f}Gi"


def human_duration(seconds: float) -> str:
    """``-`` for 0 (active); otherwise kubectl's AGE style: 45s, 12m, 3h5m, 2d4h."""
    s = int(seconds)
    if s <= 0:
        return "-"
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        hours, minutes = divmod(s // 60, 60)
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(s // 3600, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def run(args: argparse.Namespace) -> int:
    cluster = bool(args.kubeconfig or args.context)
    endpoints: list[str] = args.endpoint or (
        [] if cluster else [env("GPUDRA_ENDPOINT") or DEFAULT_ENDPOINT])
    if args.count < 0:
        raise UsageError("--count: must be >= 0")
    refreshes = 0
    clear = args.watch and sys.stdout.isatty() and args.output not in ("json", "yaml")
    try:
        while True:
            snapshot = fetch(endpoints)
            if cluster:
                snapshot.rows = join(claim_status_rows(_cluster_claims(args), args.driver_name,
                                                       time.time()), snapshot.rows)
            text = render(snapshot, args.output, args.sort)
            if clear:
                sys.stdout.write("\x1b[H\x1b[2J")
            elif refreshes and args.output != "json":  # JSON: one document per refresh
                sys.stdout.write("---\n" if args.output == "yaml" else "\n")
            sys.stdout.write(text)
            sys.stdout.flush()
            refreshes += 1
            if not args.watch or (args.count and refreshes >= args.count):
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK
    every_daemon_down = bool(endpoints) and len(snapshot.unreachable) == len(endpoints)
    return EXIT_FOUND if every_daemon_down and not cluster else EXIT_OK
