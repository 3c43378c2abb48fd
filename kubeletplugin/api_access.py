"""How the node daemon reaches the API server: read and checked before the kubelet sockets
are served, so a kubeconfig the daemon could not use stops it before the kubelet sees it.

One reader for kubeconfigs: :func:`gpudra.kube.kubeconfig.resolve` (as kubectl resolves
them) then :func:`gpudra.kube.connection.connection_settings` (files read, fields checked).
The daemon's ``--kubeconfig`` names one file; without it the daemon runs in-cluster. Errors
are one line, led by the flag.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpudra.kube.connection import Connection, connection_settings, in_cluster
from gpudra.kube.kubeconfig import SERVICE_ACCOUNT, KubeconfigError, resolve

if TYPE_CHECKING:
    from gpudra.kube.session import ApiSession


class ApiAccessError(Exception):
    """No usable API-server configuration; the message is one line naming what is wrong."""


def check_api_access(kubeconfig: str | None, *, environ: Mapping[str, str] | None = None,
                     service_account: Path = SERVICE_ACCOUNT) -> Connection:
    """The connection ``kubeconfig`` (None: the pod's in-cluster service account) gives;
    :class:`ApiAccessError` when the daemon could not use it."""
    if kubeconfig is None:
        try:
            return in_cluster(os.environ if environ is None else environ, service_account)
        except KubeconfigError as exc:
            raise ApiAccessError(f"no --kubeconfig given and {_one_line(exc)}") from exc
    flag = f"--kubeconfig {kubeconfig}"
    try:
        return connection_settings(resolve(kubeconfig, environ={}, home=Path("/")))
    except KubeconfigError as exc:
        message = _one_line(exc)
        # resolve() names the file itself; the flag is what the operator typed.
        for prefix in (f"{flag}: ", f"kubeconfig {kubeconfig}: "):
            message = message.removeprefix(prefix)
        raise ApiAccessError(f"{flag}: {message}") from exc


def api_session(connection: Connection) -> ApiSession:
    """The daemon's session to the API server (opened on its first request). The client's
    modules are imported here, after registration, not when the daemon starts."""
    from gpudra.kube.session import ApiSession

    return ApiSession(connection)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
