"""The simulated IMEX daemon: readiness over real TCP between processes, peer unreachable,
crash, two domains side by side on the same nodes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.driver.compute_domain_imex import write_config, write_nodes
from gpudra.driver.sim import imex_daemon

DOMAIN = "5f0c9a4e-8d2b-4c1e-9a7f-3b6d2e1c0a99"
ADDRESSES = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def _until(check, what: str, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def network(tmp_path: Path) -> Path:
    return tmp_path / "net"


@pytest.fixture
def start(tmp_path: Path, network: Path) -> Iterator:  # type: ignore[type-arg]
    procs: list[subprocess.Popen[bytes]] = []

    def run(address: str, peers: list[str], domain: str = DOMAIN) -> subprocess.Popen[bytes]:
        root = tmp_path / address
        where = write_config(root, domain)
        write_nodes(root, domain, peers)
        proc = subprocess.Popen([sys.executable, "-m", "gpudra.driver.sim.imex_daemon", "run",
                                 "-c", str(where / "config.cfg"), "--network", str(network),
                                 "--address", address, "--domain", domain,
                                 "--interval", "0.05"])
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(10)


def test_ready_once_every_peer_answers(start, network: Path) -> None:  # type: ignore[no-untyped-def]
    start("10.0.0.1", ADDRESSES)
    _until(lambda: imex_daemon.query(network, "10.0.0.1", DOMAIN), "the first daemon to answer")
    assert imex_daemon.query(network, "10.0.0.1", DOMAIN) == "NOT_READY: peer 10.0.0.2 unreachable"
    start("10.0.0.2", ADDRESSES)
    start("10.0.0.3", ADDRESSES)
    for address in ADDRESSES:
        _until(lambda a=address: imex_daemon.query(network, a, DOMAIN) == "READY",
               f"{address} READY")


def test_crash_makes_peers_not_ready_and_ctl_says_so(start, network: Path) -> None:  # type: ignore[no-untyped-def]
    procs = [start(a, ADDRESSES) for a in ADDRESSES]
    for address in ADDRESSES:
        _until(lambda a=address: imex_daemon.query(network, a, DOMAIN) == "READY",
               f"{address} READY")
    imex_daemon.crash_file(network, "10.0.0.3", DOMAIN).touch()
    assert procs[2].wait(10) == 1
    _until(lambda: imex_daemon.query(network, "10.0.0.1", DOMAIN) == "NOT_READY: peer 10.0.0.3 "
           "unreachable", "10.0.0.1 to see its peer gone")
    ctl = subprocess.run([sys.executable, "-m", "gpudra.driver.sim.imex_daemon", "ctl", "-q",
                          "--network", str(network), "--address", "10.0.0.3",
                          "--domain", DOMAIN],
                         capture_output=True, text=True, check=False)
    assert ctl.returncode == 2 and "does not answer" in ctl.stderr
    ok = subprocess.run([sys.executable, "-m", "gpudra.driver.sim.imex_daemon", "ctl", "-q",
                         "--network", str(network), "--address", "10.0.0.1",
                         "--domain", DOMAIN],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 1 and ok.stdout.startswith("NOT_READY")


def test_two_domains_on_the_same_nodes_are_apart(start, network: Path) -> None:  # type: ignore[no-untyped-def]
    other = "0b6a2f1c-7e3d-4a5b-8c9d-1e2f3a4b5c6d"
    pair = ADDRESSES[:2]
    for address in pair:
        start(address, pair)
        start(address, pair, other)
    for domain in (DOMAIN, other):
        for address in pair:
            _until(lambda a=address, d=domain: imex_daemon.query(network, a, d) == "READY",
                   f"{address} READY in {domain}")
    imex_daemon.crash_file(network, "10.0.0.2", other).touch()
    _until(lambda: imex_daemon.query(network, "10.0.0.1", other) == "NOT_READY: peer "
           "10.0.0.2 unreachable", "the other domain to lose its peer")
    assert imex_daemon.query(network, "10.0.0.1", DOMAIN) == "READY"  # untouched


def test_write_nodes_refuses_what_is_not_an_address(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_nodes(tmp_path, DOMAIN, ["10.0.0.1\n10.0.0.2"])
    with pytest.raises(ValueError):
        write_config(tmp_path, "../../etc")
    assert not any(tmp_path.iterdir())
