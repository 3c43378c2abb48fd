"""The ``Authorization`` header of each request, kept current the way client-go keeps it.

A token file (a projected service-account token rotates every hour or so) is re-read when
its modification time changes and at least once a minute; an exec credential plugin is run
again when its credential expires or after the server answers 401.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpudra.kube.connection import Connection, ExecPlugin
from gpudra.kube.kubeconfig import KubeconfigError

TOKEN_FILE_MAX_AGE = 60.0
"""Seconds a token file's content is trusted without a re-read (client-go: one minute)."""
EXEC_TIMEOUT = 30.0


@dataclass(frozen=True)
class ExecCredential:
    """What an exec plugin answered."""

    token: str | None
    client_cert_pem: str | None
    client_key_pem: str | None
    expires: float | None
    """``time.time()`` after which it must be fetched again; None: never."""


class CredentialPending(Exception):
    """The exec plugin's credential has to be fetched (again) before the next request."""


class Credentials:
    """The current ``Authorization`` header of one connection."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._file_token: str | None = None
        self._file_stamp: tuple[int, float] | None = None  # (mtime_ns, read at)
        self._exec: ExecCredential | None = None
        self._exec_lock = asyncio.Lock()

    async def header(self) -> str | None:
        if self._connection.exec_plugin is not None:
            credential = await self.exec_credential()
            if credential.token:
                return f"Bearer {credential.token}"
        return self._without_exec()

    def header_now(self) -> str | None:
        """:meth:`header` from any thread, without the event loop; CredentialPending when
        an exec plugin must run first (that takes the loop)."""
        if self._connection.exec_plugin is not None:
            credential = self._exec
            if credential is None or _expiring(credential):
                raise CredentialPending
            if credential.token:
                return f"Bearer {credential.token}"
        return self._without_exec()

    def _without_exec(self) -> str | None:
        c = self._connection
        if c.token:
            return f"Bearer {c.token}"
        if c.token_file is not None:
            return f"Bearer {self._read_token_file(c.token_file)}"
        if c.username is not None:
            basic = base64.b64encode(f"{c.username}:{c.password or ''}".encode()).decode()
            return f"Basic {basic}"
        return None

    def rejected(self) -> None:
        """The server answered 401: fetch the exec credential again next time."""
        self._exec = None
        self._file_stamp = None

    async def exec_credential(self) -> ExecCredential:
        plugin = self._connection.exec_plugin
        assert plugin is not None
        async with self._exec_lock:
            current = self._exec
            if current is None or _expiring(current):
                current = self._exec = await run_exec_plugin(plugin)
            return current

    def _read_token_file(self, path: Path) -> str:
        now = time.monotonic()
        try:
            mtime = path.stat().st_mtime_ns
            stamp = self._file_stamp
            if (self._file_token is None or stamp is None or stamp[0] != mtime
                    or now - stamp[1] > TOKEN_FILE_MAX_AGE):
                self._file_token = path.read_text().strip()
                self._file_stamp = (mtime, now)
        except OSError:
            if self._file_token is None:
                raise
        return self._file_token


def _expiring(credential: ExecCredential) -> bool:
    """Expired, or about to: fetch a new one before the next request."""
    return credential.expires is not None and credential.expires <= time.time() + 10


async def run_exec_plugin(plugin: ExecPlugin) -> ExecCredential:
    """Run the plugin and read its ``ExecCredential``; a failure is a KubeconfigError."""
    where = f"exec plugin {plugin.command}"
    if plugin.interactive:
        raise KubeconfigError(f"{where}: interactiveMode Always needs a terminal; this "
                              "process has none")
    request: dict[str, Any] = {"apiVersion": plugin.api_version, "kind": "ExecCredential",
                               "spec": {"interactive": False}}
    if plugin.cluster is not None:
        request["spec"]["cluster"] = _cluster_info(plugin.cluster)
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(request)}
    try:
        process = await asyncio.create_subprocess_exec(
            plugin.command, *plugin.args, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        raise KubeconfigError(f"{where}: {exc.strerror or exc}") from exc
    try:
        async with asyncio.timeout(EXEC_TIMEOUT):
            out, err = await process.communicate()
    except TimeoutError as exc:
        process.kill()
        await process.wait()
        raise KubeconfigError(f"{where}: no answer within {EXEC_TIMEOUT:g}s") from exc
    if process.returncode:
        detail = " ".join(err.decode(errors="replace").split())[:300]
        raise KubeconfigError(f"{where}: exit status {process.returncode}"
                              + (f": {detail}" if detail else ""))
    return parse_exec_credential(out, where, plugin.api_version)


def parse_exec_credential(out: bytes, where: str, api_version: str) -> ExecCredential:
    try:
        answer = json.loads(out)
    except ValueError as exc:
        raise KubeconfigError(f"{where}: did not print an ExecCredential (invalid JSON)"
                              ) from exc
    if not isinstance(answer, dict) or answer.get("kind") != "ExecCredential":
        raise KubeconfigError(f"{where}: did not print an ExecCredential")
    if answer.get("apiVersion") != api_version:
        raise KubeconfigError(f"{where}: answered apiVersion {answer.get('apiVersion')!r}, "
                              f"expected {api_version}")
    status = answer.get("status") or {}
    token = status.get("token") or None
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    if not token and not (cert and key):
        raise KubeconfigError(f"{where}: status has neither token nor "
                              "clientCertificateData and clientKeyData")
    expires = None
    if status.get("expirationTimestamp"):
        try:
            expires = datetime.fromisoformat(
                str(status["expirationTimestamp"]).replace("Z", "+00:00")).timestamp()
        except ValueError as exc:
            raise KubeconfigError(f"{where}: status.expirationTimestamp "
                                  f"{status['expirationTimestamp']!r} is not RFC 3339") from exc
    return ExecCredential(token=token, client_cert_pem=cert or None,
                          client_key_pem=key or None, expires=expires)


def _cluster_info(cluster: Any) -> dict[str, Any]:
    """``spec.cluster`` of the ExecCredential request, from the kubeconfig's cluster."""
    info: dict[str, Any] = {"server": cluster.get("server")}
    if cluster.get("certificate-authority-data"):
        info["certificate-authority-data"] = cluster["certificate-authority-data"]
    if cluster.get("insecure-skip-tls-verify"):
        info["insecure-skip-tls-verify"] = True
    if cluster.get("tls-server-name"):
        info["tls-server-name"] = cluster["tls-server-name"]
    extensions = cluster.get("extensions") or []
    for entry in extensions if isinstance(extensions, list) else []:
        if isinstance(entry, dict) and entry.get("name") == "client.authentication.k8s.io/exec":
            info["config"] = entry.get("extension")
    return info
