"""Stand-in for ``nvidia-imex`` (the IMEX daemon of a multi-node NVLink domain) and
``nvidia-imex-ctl -q``, on simulated nodes.

Like the real daemon it reads ``-c config.cfg``, whose ``IMEX_NODE_CONFIG_FILE`` names the
nodes config (one peer IP address a line, this node's own among them), listens on
``SERVER_PORT`` and is READY once every peer in the nodes config answers. It re-reads the
nodes config when it changes (the real one needs SIGHUP; the stand-in saves the
supervisor that step), so a domain that grows or shrinks is seen within one check round.

Simulated network: every daemon listens on 127.0.0.1 (an ephemeral port) and registers
its *logical* address (the pod IP the domain's status lists) as a file
``<network dir>/<domain>/<ip>`` holding that port; peers resolve a logical address through
the directory. A domain is a network of its own, as daemon pods with IPs of their own are,
so several domains on one node run side by side; and several simulated nodes run on one
machine with their own addresses and real TCP between them.

Failure modes:

- **peer unreachable**: a peer without a registration (never started, stopped) or one that
  refuses the connection (killed) keeps this daemon NOT_READY, naming the peer;
- **crash**: ``<network dir>/<domain>/<ip>.crash`` present (:func:`crash_file`) makes the
  daemon exit with status 1 at its next check round, as a crashing ``nvidia-imex`` would
  (its registration stays, its port refuses); SIGKILL does the same at once. SIGTERM is a
  clean stop (registration removed, status 0).

Run: ``python -m gpudra.driver.sim.imex_daemon run -c config.cfg --network DIR --address IP
--domain UID``. Query: ``… ctl -q --network DIR --address IP --domain UID`` prints
``READY`` or ``NOT_READY: <why>`` (exit 0 / 1), or says the daemon does not answer (exit 2); from
Python, :func:`query`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

READY = "READY"
NOT_READY = "NOT_READY"
CHECK_INTERVAL = 0.2
"""Seconds between rounds of asking every peer."""
PEER_TIMEOUT = 1.0
"""Seconds a peer has to answer one round's hello."""
_MAX_LINE = 4096


@dataclass(frozen=True)
class ImexConfig:
    """What one simulated daemon needs: its config file's two keys, and where it sits on the
    simulated network (command-line options, not config keys, so the config file stays
    the real daemon's)."""

    nodes_config: Path
    port: int
    network_dir: Path
    address: str
    domain: str

    @classmethod
    def read(cls, path: Path, *, network_dir: Path, address: str, domain: str) -> ImexConfig:
        """``KEY=VALUE`` lines as nvidia-imex's config.cfg has them; ``#`` comments."""
        values: dict[str, str] = {}
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                values[key.strip()] = value.strip()
        if not values.get("IMEX_NODE_CONFIG_FILE"):
            raise ValueError(f"{path}: no IMEX_NODE_CONFIG_FILE")
        nodes = Path(values["IMEX_NODE_CONFIG_FILE"])
        if not nodes.is_absolute():
            nodes = path.parent / nodes
        # Each domain's daemons are a network of their own (in a cluster each daemon pod has
        # its own IP): several domains on one node use the node's address side by side.
        return cls(nodes, int(values.get("SERVER_PORT", "0") or 0), network_dir / domain,
                   address, domain)


def read_peers(nodes_config: Path) -> list[str]:
    """The addresses of a nodes config, in order, without blanks and comments."""
    try:
        lines = nodes_config.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ask(network_dir: Path, address: str, line: str) -> str | None:
    """One request to the daemon registered as ``address``; None if it does not answer."""
    try:
        port = int((network_dir / address).read_text())
    except (OSError, ValueError):
        return None
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PEER_TIMEOUT) as conn:
            conn.sendall(line.encode() + b"\n")
            with conn.makefile("r", encoding="utf-8") as answer:
                return answer.readline(_MAX_LINE).strip()
    except OSError:
        return None


def query(network_dir: Path, address: str, domain: str) -> str | None:
    """``READY`` or ``NOT_READY: …`` from the daemon of ``domain`` registered as ``address``;
    None when no daemon answers (not started, crashed, stopped)."""
    return _ask(network_dir / domain, address, "STATUS")


def crash_file(network_dir: Path, address: str, domain: str) -> Path:
    """Present: the daemon of ``domain`` at ``address`` crashes (again, once restarted)."""
    return network_dir / domain / f"{address}.crash"


class _Daemon:
    def __init__(self, cfg: ImexConfig, interval: float) -> None:
        self.cfg = cfg
        self.interval = interval
        self.status = f"{NOT_READY}: starting"
        self.stop = threading.Event()
        self.crashed = False

    def check(self) -> str:
        peers = [p for p in read_peers(self.cfg.nodes_config) if p != self.cfg.address]
        if self.cfg.address not in read_peers(self.cfg.nodes_config):
            return f"{NOT_READY}: this node ({self.cfg.address}) is not in the nodes config"
        for peer in peers:
            answer = _ask(self.cfg.network_dir, peer, f"HELLO {self.cfg.domain}")
            if answer is None:
                return f"{NOT_READY}: peer {peer} unreachable"
            if answer != f"IMEX {self.cfg.domain}":
                return f"{NOT_READY}: peer {peer} serves another domain ({answer})"
        return READY

    def answer(self, line: str) -> str:
        if line == "STATUS":
            return self.status
        if line.startswith("HELLO "):
            return f"IMEX {self.cfg.domain}"
        return "ERROR unknown request"

    def run(self) -> int:
        daemon = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(_MAX_LINE).decode(errors="replace").strip()
                self.wfile.write(daemon.answer(line).encode() + b"\n")

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        # SERVER_PORT is the port on the simulated address; on 127.0.0.1, shared by every
        # simulated node, each daemon takes a free port and registers it.
        with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler) as server:
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, name="imex-server",
                             daemon=True).start()
            registration = self.cfg.network_dir / self.cfg.address
            self.cfg.network_dir.mkdir(parents=True, exist_ok=True)
            tmp = registration.with_name(f".{registration.name}.tmp")
            tmp.write_text(str(server.server_address[1]))
            tmp.replace(registration)
            crash = self.cfg.network_dir / f"{self.cfg.address}.crash"
            parent = os.getppid()
            while not self.stop.is_set():
                if os.getppid() != parent:
                    # Its supervisor is gone: in a pod the container's end takes the daemon
                    # with it; here nothing else would.
                    print("nvidia-imex (simulated): supervisor gone, exiting", file=sys.stderr,
                          flush=True)
                    return 1
                if crash.exists():
                    print(f"nvidia-imex (simulated): crash injected ({crash})", file=sys.stderr,
                          flush=True)
                    return 1  # registration stays behind, the port stops answering
                status = self.check()
                if status != self.status:
                    print(f"nvidia-imex (simulated) {self.cfg.address}: {status}",
                          file=sys.stderr, flush=True)
                self.status = status
                self.stop.wait(self.interval)
            server.shutdown()
            registration.unlink(missing_ok=True)
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-imex (simulated)")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("-c", "--config", type=Path, required=True)
    run.add_argument("--interval", type=float, default=CHECK_INTERVAL)
    run.add_argument("--domain", required=True)
    ctl = sub.add_parser("ctl", help="nvidia-imex-ctl")
    ctl.add_argument("-q", "--query", action="store_true", required=True)
    ctl.add_argument("--domain", required=True)
    for sub_parser in (run, ctl):
        sub_parser.add_argument("--network", type=Path, required=True,
                                help="the simulated network's registration directory")
        sub_parser.add_argument("--address", required=True, help="this node's address")
    args = parser.parse_args(argv)
    if args.command == "ctl":
        status = query(args.network, args.address, args.domain)
        if status is None:
            print(f"the IMEX daemon at {args.address} does not answer", file=sys.stderr)
            return 2
        print(status)
        return 0 if status == READY else 1
    try:
        cfg = ImexConfig.read(args.config, network_dir=args.network, address=args.address,
                              domain=args.domain)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    daemon = _Daemon(cfg, args.interval)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        return daemon.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
