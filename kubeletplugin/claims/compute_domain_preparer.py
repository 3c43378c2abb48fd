"""Prepare and unprepare claims of the ``compute-domain.nvidia.com`` driver.

A claim's allocation (its results for this driver and this node's pool) and its opaque
config (``ComputeDomainChannelConfig`` or ``ComputeDomainDaemonConfig``) say what to do:

- **daemon claim** (the IMEX daemon pod's): write the domain's IMEX config directory
  (:mod:`gpudra.driver.compute_domain_imex`) and mount it into the daemon's container;
- **channel claim** (a workload pod's): once this node's entry in the ComputeDomain's
  ``status.nodes`` is Ready (its IMEX daemon has every peer), hand the channel's device
  node (``/dev/nvidia-caps-imex-channels/channelN``; every channel for
  ``allocationMode: All``) to the container through CDI. Before that the claim gets an
  error naming the claim, the domain and what its status says. With binding conditions the
  scheduler does not bind the pod before the controller saw the daemon Ready, so this is a
  guard, not the usual path.

Unprepare removes the claim's CDI spec and, for the last daemon claim of a domain, the
domain's config directory: the node leaves the domain (the controller removes the daemon
pod once no channel claim on the node names the domain).

Everything read from the API server is untrusted: device names, pools, requests and the
domain uid are validated before they reach a path or a CDI spec, and a claim that fails gets
an error naming it and the field, with nothing changed. Records are two-phase in the
checkpoint (:mod:`gpudra.driver.compute_domain_checkpoint`). Called from the DRA socket's
call threads; API reads run on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudra.api.claims import ClaimRef, PreparedDevice
from gpudra.api.compute_domain import (
    API_VERSION,
    CHANNEL_CONFIG_KIND,
    DAEMON_CONFIG_KIND,
    GROUP,
    PLURAL,
    STATUS_READY,
    VERSION,
    ComputeDomainError,
    parse_channel_config,
    parse_daemon_config,
)
from gpudra.api.identifiers import (
    IdentifierError,
    check_claim,
    check_device,
    check_pool,
    check_request,
    shown,
)
from gpudra.driver import cdi
from gpudra.driver.compute_domain_checkpoint import (
    Checkpoint,
    CheckpointError,
    ClaimEntry,
    Kind,
    PreparedEntry,
)
from gpudra.driver.compute_domain_devices import parse_device
from gpudra.driver.compute_domain_imex import (
    CONTAINER_DIR,
    MAX_CHANNELS,
    channel_node,
    remove_domain,
    write_config,
)
from gpudra.driver.faults import crash_point
from gpudra.kube.errors import ApiCallError
from gpudra.kube.raw_api import RESOURCE_CLAIMS, RawApi, Resource
from gpudra.kubeletplugin.serving.interfaces import PrepareOutcome, always

COMPUTE_DOMAINS = Resource(PLURAL, f"/apis/{GROUP}/{VERSION}", namespaced=True)
API_WAIT = 20.0
"""Seconds a call waits for its API reads before the claim fails (the kubelet retries)."""


class PrepareError(Exception):
    """One claim cannot be prepared; the message names the claim."""


@dataclass(frozen=True)
class NodePaths:
    cdi_root: Path
    imex_root: Path
    """Per-domain IMEX config directories, as this process sees them."""
    host_imex_root: Path
    """The same as the host (the container runtime) sees it, for CDI mounts."""
    dev_root: Path
    """Where ``dev/nvidia-caps-imex-channels`` is, as this process sees it."""
    host_dev_root: Path


@dataclass(frozen=True)
class _Allocated:
    kind: Kind
    domain: str
    all_channels: bool
    devices: tuple[tuple[str, str, int], ...]
    """(request, device name, number)."""


class ComputeDomainPreparer:
    """Implements :class:`gpudra.kubeletplugin.serving.interfaces.ClaimPreparer`."""

    def __init__(self, *, driver: str, node: str, api: RawApi, paths: NodePaths,
                 checkpoint: Checkpoint, loop: asyncio.AbstractEventLoop) -> None:
        self._driver = driver
        self._node = node
        self._api = api
        self._paths = paths
        self._checkpoint = checkpoint
        self._loop = loop
        self._lock = threading.Lock()  # one claim's files at a time: they are few and fast

    # --- the kubelet's calls -------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef], *,
                wanted: Callable[[], bool] = always) -> Mapping[str, PrepareOutcome]:
        out: dict[str, PrepareOutcome] = {}
        for ref in claims:
            try:
                out[ref.uid] = PrepareOutcome(devices=self._prepare(ref, wanted))
            except PrepareError as exc:
                out[ref.uid] = PrepareOutcome(error=str(exc))
        return out

    def unprepare(self, claims: Sequence[ClaimRef], *,
                  wanted: Callable[[], bool] = always) -> Mapping[str, str | None]:
        out: dict[str, str | None] = {}
        for ref in claims:
            try:
                self._unprepare(ref)
                out[ref.uid] = None
            except PrepareError as exc:
                out[ref.uid] = str(exc)
        return out

    # --- prepare ---------------------------------------------------------------------------

    def _prepare(self, ref: ClaimRef, wanted: Callable[[], bool]) -> tuple[PreparedDevice, ...]:
        try:
            check_claim(ref.namespace, ref.name, ref.uid)
        except IdentifierError as exc:
            raise PrepareError(f"claim {shown(ref.namespace)}/{shown(ref.name)}: {exc}") from exc
        try:
            done = self._checkpoint.get(ref.uid)
        except (CheckpointError, OSError) as exc:
            raise PrepareError(f"claim {ref}: {exc}") from exc
        if done is not None and done.state == "completed":
            return _prepared(done)  # a retry or a kubelet restart: no API call
        claim = self._read(ref, self._api.get(RESOURCE_CLAIMS, ref.name,
                                              namespace=ref.namespace))
        allocated = self._allocation(ref, claim)
        if allocated.kind == "channel":
            self._require_ready(ref, allocated.domain)
        if not wanted():
            raise PrepareError(f"claim {ref}: the kubelet stopped waiting; nothing was prepared")
        with self._lock:
            return self._commit(ref, allocated)

    def _commit(self, ref: ClaimRef, allocated: _Allocated) -> tuple[PreparedDevice, ...]:
        """Both phases and the files between them under the checkpoint's lock: the other
        daemon instance (a rolling update) changes nothing in between, so its unprepare of
        a claim of the same domain cannot remove the IMEX directory this one is writing."""
        try:
            with self._checkpoint.locked():
                return self._commit_held(ref, allocated)
        except CheckpointError as exc:
            raise PrepareError(f"claim {ref}: {exc}") from exc

    def _commit_held(self, ref: ClaimRef, allocated: _Allocated) -> tuple[PreparedDevice, ...]:
        entries = tuple(
            PreparedEntry(request, self._node, device,
                          (cdi.qualified_name(self._driver, ref.uid, device),))
            for request, device, _ in allocated.devices)
        started = ClaimEntry(ref.namespace, ref.name, allocated.kind, allocated.domain,
                             "started", entries)
        try:
            self._checkpoint.put(ref.uid, started)
            crash_point("prepare:after-started")
            edits: list[cdi.CdiDevice] = []
            if allocated.kind == "daemon":
                where = write_config(self._paths.imex_root, allocated.domain)
                host = self._paths.host_imex_root / where.name
                edits = [cdi.CdiDevice(device, cdi.ContainerEdits(
                    env=[f"IMEX_CONFIG_DIR={CONTAINER_DIR}"],
                    mounts=[cdi.Mount(str(host), CONTAINER_DIR, ("rw", "nosuid", "nodev",
                                                                 "bind"))]))
                         for _, device, _ in allocated.devices]
            else:
                numbers = (self._present_channels() if allocated.all_channels
                           else [n for _, _, n in allocated.devices])
                nodes = [self._channel_node(ref, n) for n in numbers]
                edits = [cdi.CdiDevice(device, cdi.ContainerEdits(device_nodes=nodes))
                         for _, device, _ in allocated.devices]
            spec = cdi.build_claim_spec(driver=self._driver, claim_uid=ref.uid,
                                        devices=edits, common=cdi.ContainerEdits())
            cdi.write_spec(self._paths.cdi_root, spec, claim_uid=ref.uid)
            crash_point("prepare:after-cdi-write")
            completed = ClaimEntry(ref.namespace, ref.name, allocated.kind, allocated.domain,
                                   "completed", entries)
            self._checkpoint.put(ref.uid, completed)
        except (CheckpointError, cdi.CdiError, OSError, ValueError) as exc:
            raise PrepareError(f"claim {ref}: {exc}") from exc
        return _prepared(completed)

    def _channel_node(self, ref: ClaimRef, number: int) -> cdi.DeviceNode:
        path = channel_node(number)
        local = self._paths.dev_root / path.lstrip("/")
        if not local.exists():
            raise PrepareError(f"claim {ref}: IMEX channel device node {local} does not exist "
                               "(is the NVIDIA driver loaded with IMEX channels?)")
        host = str(self._paths.host_dev_root / path.lstrip("/"))
        return cdi.DeviceNode(path=path, host_path=None if host == path else host)

    def _present_channels(self) -> list[int]:
        folder = self._paths.dev_root / channel_node(0).lstrip("/")
        found = []
        for n in range(MAX_CHANNELS):
            if not folder.with_name(f"channel{n}").exists():
                break
            found.append(n)
        return found

    def _allocation(self, ref: ClaimRef, claim: Mapping[str, Any]) -> _Allocated:
        """Our results on this node and their config, validated; PrepareError names the field."""
        meta = claim.get("metadata") or {}
        if meta.get("uid") != ref.uid:
            raise PrepareError(f"claim {ref}: the API server has another claim of that name "
                               f"(uid {shown(meta.get('uid'))})")
        devices = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
        results = devices.get("results") or []
        mine: list[tuple[str, str, int]] = []
        for i, result in enumerate(results if isinstance(results, list) else []):
            where = f"status.allocation.devices.results[{i}]"
            if not isinstance(result, dict) or result.get("driver") != self._driver:
                continue
            try:
                pool = check_pool(result.get("pool"), f"{where}.pool")
                device = check_device(result.get("device"), f"{where}.device")
                request = check_request(result.get("request"), f"{where}.request")
            except IdentifierError as exc:
                raise PrepareError(f"claim {ref}: {exc}") from exc
            if pool != self._node:
                continue
            parsed = parse_device(device)
            if parsed is None:
                raise PrepareError(f"claim {ref}: {where}.device: {device!r} is not a "
                                   "channel-N or daemon-N device of this driver")
            mine.append((request, device, parsed[1]))
        if not mine:
            raise PrepareError(f"claim {ref}: no device of {self._driver} is allocated on "
                               f"node {self._node}")
        kinds = {parse_device(d)[0] for _, d, _ in mine}  # type: ignore[index]
        if len(kinds) != 1:
            raise PrepareError(f"claim {ref}: channel and daemon devices in one claim")
        kind: Kind = "channel" if kinds == {"channel"} else "daemon"
        config = self._config(ref, devices.get("config"), kind, {r for r, _, _ in mine})
        return _Allocated(kind, config[0], config[1], tuple(mine))

    def _config(self, ref: ClaimRef, configs: object, kind: Kind,
                requests: set[str]) -> tuple[str, bool]:
        """(domain uid, all channels) from the one opaque config of ours for ``requests``."""
        wanted_kind = CHANNEL_CONFIG_KIND if kind == "channel" else DAEMON_CONFIG_KIND
        found: list[tuple[str, bool]] = []
        for i, item in enumerate(configs if isinstance(configs, list) else []):
            where = f"status.allocation.devices.config[{i}].opaque.parameters"
            opaque = item.get("opaque") if isinstance(item, dict) else None
            if not isinstance(opaque, dict) or opaque.get("driver") != self._driver:
                continue
            applies = item.get("requests") or []
            if applies and not requests & {str(r).split("/")[0] for r in applies}:
                continue
            params = opaque.get("parameters")
            if not isinstance(params, dict) or params.get("apiVersion") != API_VERSION:
                raise PrepareError(f"claim {ref}: {where}: expected apiVersion {API_VERSION}")
            if params.get("kind") != wanted_kind:
                raise PrepareError(f"claim {ref}: {where}.kind: {shown(params.get('kind'))} "
                                   f"does not configure {kind} devices (want {wanted_kind})")
            try:
                if kind == "channel":
                    channel = parse_channel_config(params)
                    found.append((channel.domain_id, channel.allocation_mode == "All"))
                else:
                    found.append((parse_daemon_config(params).domain_id, False))
            except ComputeDomainError as exc:
                raise PrepareError(f"claim {ref}: {where}: {exc}") from exc
        if not found:
            raise PrepareError(f"claim {ref}: no {wanted_kind} for driver {self._driver} "
                               "in status.allocation.devices.config (which domain?)")
        if len({d for d, _ in found}) > 1:
            raise PrepareError(f"claim {ref}: its configs name several domains")
        return found[-1]

    def _require_ready(self, ref: ClaimRef, domain: str) -> None:
        """This node's entry of the domain is Ready, else PrepareError saying what is."""
        listed = self._read(ref, self._api.list(COMPUTE_DOMAINS, namespace=ref.namespace))
        items = listed.get("items")
        found = next((cd for cd in (items if isinstance(items, list) else [])
                      if isinstance(cd, dict)
                      and (cd.get("metadata") or {}).get("uid") == domain), None)
        if found is None:
            raise PrepareError(f"claim {ref}: ComputeDomain {domain} not found in namespace "
                               f"{ref.namespace} (deleted?)")
        name = f"{ref.namespace}/{(found.get('metadata') or {}).get('name')}"
        nodes = (found.get("status") or {}).get("nodes") or []
        entry = next((n for n in (nodes if isinstance(nodes, list) else [])
                      if isinstance(n, dict) and n.get("name") == self._node), None)
        if entry is None:
            raise PrepareError(f"claim {ref}: ComputeDomain {name} ({domain}): the IMEX "
                               f"daemon of node {self._node} has not joined the domain yet")
        if entry.get("status") != STATUS_READY:
            raise PrepareError(f"claim {ref}: ComputeDomain {name} ({domain}): the IMEX "
                               f"daemon of node {self._node} is {shown(entry.get('status'))}, "
                               "not Ready")

    def _read(self, ref: ClaimRef, call: Any) -> Mapping[str, Any]:
        future = asyncio.run_coroutine_threadsafe(call, self._loop)
        try:
            result: Mapping[str, Any] = future.result(API_WAIT)
        except TimeoutError as exc:
            future.cancel()
            raise PrepareError(f"claim {ref}: the API server did not answer in time") from exc
        except ApiCallError as exc:
            raise PrepareError(f"claim {ref}: API server: {exc}") from exc
        return result

    # --- unprepare -------------------------------------------------------------------------

    def _unprepare(self, ref: ClaimRef) -> None:
        # Under the checkpoint's lock too: the other instance must not make a claim of the
        # same domain between the look at the other claims and the removal of its directory.
        try:
            with self._lock, self._checkpoint.locked():
                self._unprepare_held(ref)
        except CheckpointError as exc:
            raise PrepareError(f"claim {ref}: {exc}") from exc

    def _unprepare_held(self, ref: ClaimRef) -> None:
        try:
            entry = self._checkpoint.get(ref.uid)
        except (CheckpointError, OSError) as exc:
            raise PrepareError(f"claim {ref}: {exc}") from exc
        if entry is None:
            return  # never prepared here, or already undone: nothing to do
        try:
            cdi.remove_spec(self._paths.cdi_root, self._driver, ref.uid)
            crash_point("unprepare:after-cdi-remove")
            if entry.kind == "daemon" and not any(
                    e.kind == "daemon" and e.domain == entry.domain
                    for uid, e in self._checkpoint.all().items() if uid != ref.uid):
                remove_domain(self._paths.imex_root, entry.domain)
            self._checkpoint.remove(ref.uid)
        except (CheckpointError, cdi.CdiError, OSError) as exc:
            raise PrepareError(f"claim {ref}: {exc}") from exc


def _prepared(entry: ClaimEntry) -> tuple[PreparedDevice, ...]:
    return tuple(PreparedDevice((d.request,), d.pool, d.device, d.cdi_ids)
                 for d in entry.devices)
