"""How the node daemon reaches the API server: checked cheaply before the kubelet sockets are
served, the client itself loaded after.

The Kubernetes client is the heaviest import of the daemon and is not needed to register,
so the daemon loads it once its sockets are up. A kubeconfig the client would refuse must
not get that far: :func:`check_api_access` reads the file (YAML only, no client) and checks
what loading it needs, so a bad ``--kubeconfig`` stops the daemon before the kubelet ever
sees it. It is stricter than the client in one way: a context naming a user that is not
there is an error, not an anonymous connection that fails every call later.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Files a kubeconfig may name, per entry kind; each has a ``<key>-data`` inline form, which
# the client prefers. (tokenFile has none.)
_CLUSTER_FILES = ("certificate-authority",)
_USER_FILES = ("client-certificate", "client-key", "tokenFile")


class ApiAccessError(Exception):
    """No usable API-server configuration; the message is one line naming what is wrong."""


def check_api_access(kubeconfig: str | None, *, environ: Mapping[str, str] | None = None,
                     service_account: Path = SERVICE_ACCOUNT) -> None:
    """Raise :class:`ApiAccessError` when the client could not be configured from
    ``kubeconfig`` (None: the pod's in-cluster service account)."""
    if kubeconfig is None:
        _check_in_cluster(os.environ if environ is None else environ, service_account)
    else:
        _check_kubeconfig(Path(kubeconfig))


async def load_api_client(kubeconfig: str | None) -> Any:
    """A ``kubernetes.aio`` ApiClient configured from ``kubeconfig`` (None: in-cluster)."""
    from kubernetes.aio import client as aio_client
    from kubernetes.aio import config as aio_config

    configuration = aio_client.Configuration()
    if kubeconfig:
        try:
            await aio_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration)
        except Exception as exc:  # ConfigException, bad certificates …
            raise ApiAccessError(f"--kubeconfig {kubeconfig}: {_one_line(exc)}") from exc
    else:
        try:
            aio_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
        except aio_config.ConfigException as exc:
            raise ApiAccessError("no --kubeconfig given and not running in a cluster "
                                 f"({exc})") from exc
    return aio_client.ApiClient(configuration)


def _check_in_cluster(environ: Mapping[str, str], service_account: Path) -> None:
    """What ``load_incluster_config`` needs: the service's address and the pod's token."""
    problem = None
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        if not environ.get(name):
            problem = f"{name} is not set"
            break
    else:
        for name in ("token", "ca.crt"):
            problem = _unreadable(service_account / name, nonempty=True)
            if problem:
                problem = f"service account {problem}"
                break
    if problem:
        raise ApiAccessError(f"no --kubeconfig given and not running in a cluster ({problem})")


def _check_kubeconfig(path: Path) -> None:
    flag = f"--kubeconfig {path}"
    if not path.is_file():
        raise ApiAccessError(f"{flag}: no such file")
    import yaml  # light, unlike the client; only needed here

    try:
        config = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ApiAccessError(f"{flag}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ApiAccessError(f"{flag}: not valid YAML: {_one_line(exc)}") from exc
    if not isinstance(config, dict):
        raise ApiAccessError(f"{flag}: not a kubeconfig (expected a mapping with clusters, "
                             "contexts and users)")
    name = config.get("current-context")
    if not name:
        raise ApiAccessError(f"{flag}: no current-context")
    context = _named(config, "contexts", str(name), flag).get("context") or {}
    if not isinstance(context, dict) or not context.get("cluster"):
        raise ApiAccessError(f"{flag}: context {name!r} names no cluster")
    cluster = _named(config, "clusters", str(context["cluster"]), flag).get("cluster") or {}
    if not isinstance(cluster, dict) or not cluster.get("server"):
        raise ApiAccessError(f"{flag}: cluster {context['cluster']!r} has no server")
    base = path.resolve().parent  # relative file names are relative to the kubeconfig
    _check_files(cluster, _CLUSTER_FILES, base, f"{flag}: cluster {context['cluster']!r}")
    if context.get("user"):
        user = _named(config, "users", str(context["user"]), flag).get("user") or {}
        if isinstance(user, dict):
            _check_files(user, _USER_FILES, base, f"{flag}: user {context['user']!r}")


def _named(config: Mapping[str, Any], kind: str, name: str, flag: str) -> dict[str, Any]:
    """The entry called ``name`` in the list ``kind`` (contexts, clusters, users)."""
    entries = config.get(kind)
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    singular = kind.removesuffix("s")
    known = ", ".join(str(e.get("name")) for e in entries or [] if isinstance(e, dict))
    raise ApiAccessError(f"{flag}: {singular} {name!r} is not in {kind} "
                         f"(known: {known or 'none'})")


def _check_files(entry: Mapping[str, Any], keys: tuple[str, ...], base: Path,
                 where: str) -> None:
    for key in keys:
        data = entry.get(f"{key}-data")
        if data:  # the client uses the inline form when both are given
            try:  # as leniently as the client (which skips non-alphabet characters)
                base64.b64decode(str(data))
            except binascii.Error as exc:
                raise ApiAccessError(f"{where}: {key}-data is not base64 ({exc})") from exc
        elif entry.get(key):
            problem = _unreadable(base / str(entry[key]), nonempty=False)
            if problem:
                raise ApiAccessError(f"{where}: {key} {problem}")


def _unreadable(path: Path, *, nonempty: bool) -> str | None:
    """Why ``path`` cannot be read as a file, or None."""
    try:
        with path.open("rb") as f:
            if nonempty and not f.read(1):
                return f"{path}: empty"
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
