"""The files of one ComputeDomain's IMEX daemon on a node, and the channel device nodes.

Per domain, under the node's IMEX root: ``<root>/<domain uid>/config.cfg`` (the daemon's
settings, as ``nvidia-imex -c`` reads them; written when the daemon claim is prepared) and
``nodes_config.cfg`` (the peers' addresses, one a line; written by the daemon workload,
``gpudra compute-domain-daemon``, from the domain's status). The daemon claim's CDI spec
mounts the directory at :data:`CONTAINER_DIR`, where ``nvidia-imex`` looks.

Every path is built from a validated domain uid (a UUID) and stays under the root.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from gpudra.api.identifiers import check_uid
from gpudra.driver.files import DIR_MODE, FILE_MODE, atomic_write, make_dirs

CONFIG = "config.cfg"
NODES_CONFIG = "nodes_config.cfg"
CONTAINER_DIR = "/etc/nvidia-imex"
SERVER_PORT = 50000
"""nvidia-imex's default port."""
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
MAX_CHANNELS = 2048
"""The kernel module's default ``NVreg_ImexChannelCount``."""


def domain_dir(root: Path, domain_uid: str) -> Path:
    """``<root>/<uid>``; ValueError for a uid that is not a UUID (it becomes a path)."""
    return Path(root) / check_uid(domain_uid, "domainID")


def config_text(port: int = SERVER_PORT) -> str:
    """config.cfg: the nodes config sits beside it (a relative path: the same file is read
    through the container's mount and, in simulation, on the host)."""
    return ("# written by gpudra for one ComputeDomain; the IMEX daemon reads it\n"
            f"IMEX_NODE_CONFIG_FILE={NODES_CONFIG}\n"
            f"SERVER_PORT={port}\n"
            "IMEX_WAIT_FOR_QUORUM=FULL\n")


def write_config(root: Path, domain_uid: str, port: int = SERVER_PORT) -> Path:
    """Create the domain's directory and its config.cfg (idempotent); returns the directory."""
    return write_config_in(domain_dir(root, domain_uid), port)


def write_config_in(where: Path, port: int = SERVER_PORT) -> Path:
    """config.cfg (and an empty nodes config) in the domain directory ``where``."""
    make_dirs(where, DIR_MODE)
    _replace(where / CONFIG, config_text(port))
    if not (where / NODES_CONFIG).exists():
        _replace(where / NODES_CONFIG, "")
    return where


def write_nodes(root: Path, domain_uid: str, addresses: Sequence[str]) -> bool:
    """Replace the nodes config with ``addresses`` (validated IPs, sorted, once each);
    True when it changed."""
    return write_nodes_in(domain_dir(root, domain_uid), addresses)


def write_nodes_in(where: Path, addresses: Sequence[str]) -> bool:
    """:func:`write_nodes` in the domain directory ``where``."""
    checked = sorted({str(ipaddress.ip_address(a)) for a in addresses})
    make_dirs(where, DIR_MODE)
    text = "".join(f"{a}\n" for a in checked)
    path = where / NODES_CONFIG
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    _replace(path, text)
    return True


def remove_domain(root: Path, domain_uid: str) -> None:
    """The domain's files, gone (a domain this node left)."""
    where = domain_dir(root, domain_uid)
    for name in (CONFIG, NODES_CONFIG):
        (where / name).unlink(missing_ok=True)
    try:
        where.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        pass  # something else is inside: not ours to delete


def channel_node(channel: int) -> str:
    if not 0 <= channel < MAX_CHANNELS:
        raise ValueError(f"IMEX channel {channel} is outside 0..{MAX_CHANNELS - 1}")
    return f"{CHANNEL_DIR}/channel{channel}"


def _replace(path: Path, text: str) -> None:
    atomic_write(path, text.encode(), tmp=path.with_name(f".{path.name}.tmp-{os.getpid()}"),
                 mode=FILE_MODE)
