"""``gpudra compute-domain-daemon``: the IMEX daemon workload of one ComputeDomain on one node.

The controller runs it as a pod per (domain, node). It:

1. reads the node's NVLink fabric through NVML (cluster UUID and clique id);
2. upserts **its own** entry in the domain's ``status.nodes`` (name, IP address, clique,
   index, ``NotReady``): a GET, the change to that one entry, and a conditional PUT of the
   status subresource, retried on ``409 Conflict`` — so 18 nodes joining at once each land
   their entry and none is lost;
3. writes the IMEX nodes config from the entries in **its own clique** (other cliques'
   daemons cannot be reached over NVLink) whenever the list changes;
4. runs the IMEX daemon (``nvidia-imex``, or the simulated one) and asks it for its state
   every round; its entry goes ``Ready`` when the daemon reports READY and back to
   ``NotReady`` when it does not (peer unreachable, daemon crashed — the daemon is then
   started again), so the domain's status says what the daemons see;
5. on SIGTERM (the pod deleted: no workload of the domain left on the node) stops the
   IMEX daemon and removes its own entry: the node has left the domain.

Every round is one GET; a write happens only when something changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gpudra.api.compute_domain import (
    STATUS_NOT_READY,
    STATUS_READY,
    NodeStatus,
    node_entry,
)
from gpudra.driver.compute_domain_imex import CONFIG, write_config_in, write_nodes_in
from gpudra.kube.errors import ApiCallError, Conflict, NotFound
from gpudra.kube.raw_api import RawApi
from gpudra.kubeletplugin.claims.compute_domain_preparer import COMPUTE_DOMAINS

log = structlog.get_logger("gpudra.compute_domain_daemon")

CONFLICT_RETRIES = 50
"""Conditional status writes tried before a round gives up (the next round tries again)."""
CONFLICT_BACKOFF = 0.05
CONFLICT_BACKOFF_CAP = 0.5
"""After the n-th conflict a writer waits a random time in [0, min(cap, backoff * 2**n)):
writers that collided spread out instead of colliding again in lockstep (a rack of
daemons starting together), so the retries a domain costs stay near linear in its nodes
(bench/RESULTS.md, "IMEX daemons joining at once")."""
STOP_WAIT = 5.0
"""Seconds the IMEX daemon has to exit after SIGTERM before it is killed."""
RESTART_DELAY = 0.5
RESTART_DELAY_CAP = 30.0
"""An IMEX daemon that keeps exiting is started again after 0.5 s, 1 s, 2 s … at most
30 s apart (reset once it reports READY): a crash loop shows in the entry (NotReady) and in
the log without spinning the node's CPU."""


class WorkloadError(Exception):
    """The daemon cannot run; one line."""


@dataclass(frozen=True)
class WorkloadConfig:
    domain_uid: str
    domain_namespace: str
    domain_name: str
    node: str
    address: str
    """This node's address in the domain (the pod IP; a simulated node's own address)."""
    imex_dir: Path
    """The domain's IMEX config directory (the daemon claim's mount in a pod)."""
    clique: str
    """``<cluster uuid>.<clique id>`` of this node's GPUs."""
    imex_command: Sequence[str]
    """argv of the IMEX daemon; ``-c <config>`` is appended."""
    query: Callable[[], str | None]
    """The IMEX daemon's state (``READY`` …), None when it does not answer."""
    interval: float = 0.5


class ImexWorkload:
    def __init__(self, config: WorkloadConfig, api: RawApi, *,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 jitter: Callable[[], float] = random.random,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._api = api
        self._sleep = sleep
        self._jitter = jitter
        self._child: subprocess.Popen[bytes] | None = None
        self._status: NodeStatus | None = None
        self._peers: tuple[str, ...] | None = None
        self._bad: list[str] = []
        self.starts = 0
        self._clock = clock
        self._exits = 0  # in a row, without a READY in between
        self._start_after = 0.0

    # --- status --------------------------------------------------------------------------

    async def _domain(self) -> dict[str, Any]:
        c = self.config
        obj = await self._api.get(COMPUTE_DOMAINS, c.domain_name, namespace=c.domain_namespace)
        if (obj.get("metadata") or {}).get("uid") != c.domain_uid:
            raise NotFound("get", COMPUTE_DOMAINS.plural, c.domain_name, status=404,
                           reason="NotFound", message="replaced by another domain of that name")
        return obj

    async def upsert(self, status: NodeStatus | None) -> dict[str, Any]:
        """Set this node's entry (``None``: remove it), retrying on conflicts; the domain
        as written (or as read, when nothing had to change)."""
        c = self.config
        for attempt in range(CONFLICT_RETRIES):
            if attempt:
                await self._sleep(self._jitter() * min(
                    CONFLICT_BACKOFF_CAP, CONFLICT_BACKOFF * 2 ** (attempt - 1)))
            obj = await self._domain()
            nodes = list((obj.get("status") or {}).get("nodes") or [])
            others = [n for n in nodes if isinstance(n, dict) and n.get("name") != c.node]
            mine = next((n for n in nodes if isinstance(n, dict) and n.get("name") == c.node),
                        None)
            if status is None:
                if mine is None:
                    return obj
                wanted = others
            else:
                used = {n.get("index") for n in others}
                index = mine.get("index") if isinstance(mine, dict) and mine.get(
                    "index") not in used else min(set(range(len(nodes) + 1)) - used)
                entry = node_entry(c.node, ip_address=c.address, clique_id=c.clique,
                                   index=int(index), status=status)  # type: ignore[arg-type]
                if mine == entry:
                    return obj
                wanted = [*others, entry]
            body = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                    "metadata": obj["metadata"],
                    "spec": obj.get("spec"),
                    "status": {**(obj.get("status") or {}),
                               "nodes": sorted(wanted, key=lambda n: str(n.get("name")))}}
            try:
                return await self._api.replace(COMPUTE_DOMAINS, c.domain_name, body,
                                               namespace=c.domain_namespace,
                                               subresource="status")
            except Conflict:
                continue  # someone else wrote meanwhile: read again, change only ours again
        raise WorkloadError(f"ComputeDomain {c.domain_namespace}/{c.domain_name}: status "
                            f"still conflicting after {CONFLICT_RETRIES} tries")

    # --- the IMEX daemon -----------------------------------------------------------------

    def _ensure_running(self) -> None:
        child = self._child
        if child is not None and child.poll() is None:
            return
        now = self._clock()
        if child is not None:
            self._child = None
            self._exits += 1
            delay = min(RESTART_DELAY_CAP, RESTART_DELAY * 2 ** (self._exits - 1))
            self._start_after = now + delay
            log.warning("IMEX daemon exited; starting it again", code=child.returncode,
                        exits_in_a_row=self._exits, after_seconds=delay)
        if now < self._start_after:
            return
        config = self.config.imex_dir / CONFIG
        self._child = subprocess.Popen([*self.config.imex_command, "-c", str(config)],
                                       stdin=subprocess.DEVNULL)
        self.starts += 1

    @property
    def imex_running(self) -> bool:
        return self._child is not None and self._child.poll() is None

    def _stop_child(self) -> None:
        child = self._child
        if child is None or child.poll() is not None:
            return
        child.terminate()
        try:
            child.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    # --- the loop ------------------------------------------------------------------------

    async def round(self) -> NodeStatus:
        """One look: peers → nodes config, the daemon's state → this node's entry."""
        c = self.config
        obj = await self.upsert(self._status or STATUS_NOT_READY)
        nodes = (obj.get("status") or {}).get("nodes") or []
        addresses = {str(n.get("ipAddress")) for n in nodes
                     if isinstance(n, dict) and n.get("cliqueID") == c.clique
                     and n.get("ipAddress")}
        # Other daemons write these entries: one that is not an address is left out (and
        # said), rather than failing every daemon of the domain at write_nodes_in's check.
        bad = sorted(a for a in addresses if not _is_ip(a))
        if bad and bad != self._bad:
            log.warning("peer entries without an IP address left out",
                        addresses=[a[:64] for a in bad[:8]])
        self._bad = bad
        peers = tuple(sorted((addresses - set(bad)) | {c.address}))
        if peers != self._peers:
            await asyncio.to_thread(write_nodes_in, c.imex_dir, peers)
            self._peers = peers
            log.info("IMEX peers", peers=list(peers))
        crashed = self._child is None or self._child.poll() is not None
        self._ensure_running()
        answer = None if crashed else await asyncio.to_thread(c.query)
        status: NodeStatus = STATUS_READY if answer == "READY" else STATUS_NOT_READY
        if status == STATUS_READY:
            self._exits = 0
        if status != self._status:
            log.info("IMEX daemon state", status=status, daemon=answer or "not answering")
            self._status = status
            await self.upsert(status)
        return status

    async def run(self, stop: asyncio.Event) -> None:
        c = self.config
        # The daemon claim's prepare wrote it; written again (same content) so a daemon
        # whose claim was prepared by an older plugin, or none in a test, still starts.
        await asyncio.to_thread(write_config_in, c.imex_dir)
        try:
            while not stop.is_set():
                try:
                    await self.round()
                except NotFound:
                    log.info("ComputeDomain gone; stopping", domain=c.domain_uid)
                    return
                except (ApiCallError, WorkloadError) as exc:
                    log.warning("API server", error=str(exc))  # next round tries again
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), c.interval)
        finally:
            await asyncio.to_thread(self._stop_child)
            with contextlib.suppress(ApiCallError, WorkloadError):
                await self.upsert(None)  # this node leaves the domain


def simulated_imex(network: Path, address: str, domain: str,
                   interval: float) -> tuple[list[str], Callable[[], str | None]]:
    """argv and query of the simulated IMEX daemon (:mod:`gpudra.driver.sim.imex_daemon`)."""
    from gpudra.driver.sim import imex_daemon

    argv = [sys.executable, "-m", "gpudra.driver.sim.imex_daemon", "run", "--network",
            str(network), "--address", address, "--domain", domain, "--interval",
            str(interval)]
    return argv, lambda: imex_daemon.query(network, address, domain)


def real_imex(binary: str, ctl: str) -> tuple[list[str], Callable[[], str | None]]:
    """argv of ``nvidia-imex`` (in the foreground) and its state from ``nvidia-imex-ctl -q``."""

    def query() -> str | None:
        try:
            done = subprocess.run([ctl, "-q"], capture_output=True, text=True, timeout=5,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() or None

    return [binary], query


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
