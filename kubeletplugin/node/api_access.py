"""How the node daemon reaches the API server: read and checked before the kubelet sockets
are served, so a kubeconfig the daemon could not use stops it before the kubelet sees it.

The one loader of ``gpudra node``, ``explain`` and ``top``:
:func:`gpudra.kube.kubeconfig.resolve`, as kubectl resolves a kubeconfig. ``--kubeconfig``
(env ``KUBECONFIG``, which may list several files) names the kubeconfig; without one, and
without ``~/.kube/config``, the daemon runs in-cluster. Errors are one line, led by the flag.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpudra.kube.connection import SERVICE_ACCOUNT, KubeconfigError, in_cluster
from gpudra.kube.kubeconfig import Plan, config_files, plan

if TYPE_CHECKING:
    from gpudra.kube.session import ApiSession, ConnectionSource


class ApiAccessError(Exception):
    """No usable API-server configuration; the message is one line naming what is wrong."""


def check_api_access(kubeconfig: str | None, *, environ: Mapping[str, str] | None = None,
                     home: Path | None = None,
                     service_account: Path = SERVICE_ACCOUNT) -> ConnectionSource:
    """The connection ``kubeconfig`` (None: ``~/.kube/config`` if there is one, else the
    pod's in-cluster service account) gives, or a checked kubeconfig that a child process
    loads meanwhile (:mod:`gpudra.kube.kubeconfig_child`), for the first API call to wait
    for; :class:`ApiAccessError` when the daemon could not use it."""
    environ = dict(os.environ if environ is None else environ)
    home = Path(environ.get("HOME") or Path.home()) if home is None else home
    flag: str | None = kubeconfig
    if kubeconfig and os.pathsep in kubeconfig:  # KUBECONFIG's list, merged as kubectl does
        environ["KUBECONFIG"], flag = kubeconfig, None
    else:
        environ.pop("KUBECONFIG", None)
    if not flag and not any(p.is_file() for p in config_files(None, environ, home)[0]):
        try:
            return in_cluster(environ, service_account)
        except KubeconfigError as exc:
            raise ApiAccessError(f"no --kubeconfig given and {_one_line(exc)}") from exc
    where = f"--kubeconfig {kubeconfig}" if kubeconfig else "kubeconfig"
    try:
        found = plan(flag, environ=environ, home=home, service_account=service_account)
        # A kubeconfig is loaded by the kubernetes package in a child process, from now.
        return found.in_child() if isinstance(found, Plan) else found.connection
    except KubeconfigError as exc:
        message = _one_line(exc)
        # resolve() names the file itself; the flag is what the operator typed.
        for prefix in (f"{where}: ", f"kubeconfig {kubeconfig}: "):
            message = message.removeprefix(prefix)
        raise ApiAccessError(f"{where}: {message}") from exc


def api_session(connection: ConnectionSource, resource_api: str = "auto") -> ApiSession:
    """The daemon's session to the API server (opened on its first request). The client's
    modules are imported here, after registration, not when the daemon starts.
    ``resource_api``: ``--resource-api-version`` (``auto``: the server is asked)."""
    from gpudra.kube.session import ApiSession

    return ApiSession(connection, resource_api=resource_api)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
