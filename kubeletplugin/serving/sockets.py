"""Where the node daemon's sockets live, named the way the Go ``kubeletplugin`` helper does.

- registration socket: ``<registrar_dir>/<driver>-reg.sock`` (the kubelet watches that dir);
- DRA socket: ``<plugins_dir>/<driver>/dra.sock`` (advertised as ``PluginInfo.endpoint``);
- with a pod UID (rolling update: old and new pod serve side by side) both names are unique
  per pod: ``dra-<podUID>.sock`` and the first registration name that fits (see
  :func:`registration_socket_path`).

Modes do not follow the umask: whoever can connect to the DRA socket can unprepare any
claim, so both sockets are :data:`SOCKET_MODE` (the kubelet, their only client, runs as
root); the directories the daemon creates for them get ``gpudra.driver.files``' modes.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

# sun_path is 108 bytes and grpc needs room for the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


SOCKET_MODE = 0o600
_BIND_UMASK = 0o177
"""While a server binds: the socket file is never more open than :data:`SOCKET_MODE`, not
even between its creation and the ``chmod`` that follows."""


class SocketPathError(ValueError):
    """A socket path cannot be built (bad name, or no form fits in a unix socket path)."""


def plugin_data_dir(plugins_dir: str | os.PathLike[str], driver: str) -> Path:
    """The driver's own directory under the kubelet plugins dir (shared across pods)."""
    _check_component("driver name", driver)
    return _clean(plugins_dir) / driver


def dra_socket_path(
    plugins_dir: str | os.PathLike[str], driver: str, pod_uid: str | None = None
) -> Path:
    """The socket the kubelet calls the DRA services on."""
    name = "dra.sock"
    if pod_uid:
        _check_component("pod UID", pod_uid)
        name = f"dra-{pod_uid}.sock"
    path = plugin_data_dir(plugins_dir, driver) / name
    if _path_bytes(path) > MAX_SOCKET_PATH_BYTES:
        raise SocketPathError(
            f"DRA socket path {str(path)!r} is {_path_bytes(path)} bytes; a unix socket path "
            f"may have at most {MAX_SOCKET_PATH_BYTES}: use a shorter plugins dir"
        )
    return path


def registration_socket_path(
    registrar_dir: str | os.PathLike[str], driver: str, pod_uid: str | None = None
) -> Path:
    """The registration socket the kubelet discovers in ``registrar_dir``."""
    _check_component("driver name", driver)
    directory = _clean(registrar_dir)
    candidates: tuple[str, ...]
    if pod_uid:
        _check_component("pod UID", pod_uid)
        candidates = _rolling_update_names(driver, pod_uid)
    else:
        candidates = (f"{driver}-reg.sock",)
    for name in candidates:
        if _path_bytes(directory / name) <= MAX_SOCKET_PATH_BYTES:
            return directory / name
    shortest = directory / candidates[-1]
    raise SocketPathError(
        f"registration socket path {str(shortest)!r} is {_path_bytes(shortest)} bytes; a unix "
        f"socket path may have at most {MAX_SOCKET_PATH_BYTES}: use a shorter registrar dir"
    )


def _rolling_update_names(driver: str, pod_uid: str) -> tuple[str, str, str]:
    # Same forms and order as the Go helper's RollingUpdateRegistrarSocketFile: readable
    # first, then ever shorter hashes; the last one no longer depends on the driver length.
    uid_hash = _b64(hashlib.sha256(pod_uid.encode()).digest()[:8])
    both_hash = _b64(hashlib.sha256(f"{driver}\x00{pod_uid}".encode()).digest()[:16])
    return (
        f"{driver}-{pod_uid}-reg.sock",
        f"{driver}-{uid_hash}-reg.sock",
        f"dra-{both_hash}-reg.sock",
    )


def _b64(data: bytes) -> str:
    """Unpadded base64url, Go's ``base64.RawURLEncoding``."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _clean(directory: str | os.PathLike[str]) -> Path:
    # normpath like Go's path.Join, so "/a/./b/" costs what "/a/b" costs in the length check.
    return Path(os.path.normpath(os.fspath(directory)))


def _path_bytes(path: Path) -> int:
    return len(os.fsencode(path))


def _check_component(what: str, value: str) -> None:
    """A name becomes one path component: refuse what would escape or split it."""
    if not value or value in {".", ".."} or "/" in value or "\x00" in value:
        raise SocketPathError(f"{what} {value!r} cannot be used in a socket file name")


@contextlib.contextmanager
def binding(socket: Path) -> Iterator[None]:
    """Around a gRPC server's ``add_insecure_port`` for ``socket``: the file is created
    under a umask that leaves at most :data:`SOCKET_MODE`, then given exactly that mode.

    The umask is the process's: files other threads create meanwhile get it too, which can
    only make them less open, and the window is one ``bind``.
    """
    previous = os.umask(_BIND_UMASK)
    try:
        yield
    finally:
        os.umask(previous)
    if socket.exists():
        socket.chmod(SOCKET_MODE)
