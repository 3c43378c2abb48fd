"""Which cluster to talk to and as whom, found the way kubectl finds it; one loader for
``gpudra node``, ``gpudra explain`` and ``gpudra top``.

Order: ``--kubeconfig FILE``; else every file of ``KUBECONFIG`` (``:``-separated, missing
files skipped); else ``~/.kube/config``; else the pod's service account (in-cluster,
:func:`gpudra.kube.connection.in_cluster`). A kubeconfig is loaded by the official
``kubernetes`` package (``kubernetes.config``: merging, contexts, exec plugins and their
refresh, tokens, client certificates, ``proxy-url``, ``tls-server-name``,
``insecure-skip-tls-verify``); what it loaded (:class:`Settings`) is handed to our one
transport as a :class:`~gpudra.kube.connection.Connection`.

Two steps, because the package is slow to import and heavy in memory (measured in
``bench/RESULTS.md``, "Kubernetes client layer"): :func:`plan`
checks, without it, what a kubeconfig nobody could use fails on, in one line naming the
file, context or field (the files are YAML mappings; the context, its cluster and its user
exist, where kubectl would go anonymous without the user and a daemon would fail every
call later; every file an entry names can be read; inline data is base64); then
:meth:`Plan.load` loads it in this process (the command-line tools), or
:meth:`Plan.in_child` in a child process (the node daemon, which checks before it serves
the kubelet sockets). kubectl's one merge rule the package does not follow,
``current-context`` from the first file that sets it, is applied by choosing the context
here; and a ``tokenFile`` is re-read as it changes, as client-go does (the package reads it
once).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudra.kube.connection import SERVICE_ACCOUNT, Connection, KubeconfigError, in_cluster
from gpudra.kube.credentials import Credentials
from gpudra.kube.proxy import proxy_from_environment

__all__ = ["SERVICE_ACCOUNT", "ClusterAccess", "KubeconfigError", "Plan", "plan", "resolve"]


@dataclass(frozen=True)
class ClusterAccess:
    """Where and as whom to connect, and the namespace for objects that name none."""

    connection: Connection
    namespace: str
    source: str
    """For messages: ``context kind-dev in /home/me/.kube/config`` or ``in-cluster``."""


def config_files(flag: str | Path | None, environ: Mapping[str, str],
                 home: Path) -> tuple[tuple[Path, ...], bool]:
    """The kubeconfig files to read and whether they were named explicitly (a missing
    explicit file is an error; missing ``KUBECONFIG`` entries are skipped, as kubectl does)."""
    if flag:
        return (Path(flag).expanduser(),), True
    listed = environ.get("KUBECONFIG", "")
    if listed:
        unique = dict.fromkeys(Path(p).expanduser() for p in listed.split(os.pathsep) if p)
        return tuple(unique), False
    return (home / ".kube" / "config",), False


def resolve(flag: str | Path | None = None, *, context: str | None = None,
            namespace: str | None = None, environ: Mapping[str, str] | None = None,
            home: Path | None = None,
            service_account: Path = SERVICE_ACCOUNT) -> ClusterAccess:
    """The cluster access kubectl would use with these flags and this environment."""
    found = plan(flag, context=context, namespace=namespace, environ=environ, home=home,
                 service_account=service_account)
    return found if isinstance(found, ClusterAccess) else found.load()


@dataclass(frozen=True)
class Plan:
    """A kubeconfig that passed every check made without the ``kubernetes`` package (slow
    to import: the node daemon checks before it serves the kubelet and loads after);
    :meth:`load` loads it."""

    documents: tuple[tuple[Path, Mapping[str, Any]], ...]
    context: str
    namespace: str | None
    environ: Mapping[str, str]
    token_file: Path | None = None
    """The user's ``tokenFile`` (without a ``token``): re-read as it changes, as client-go
    does (the package reads it once)."""

    @property
    def files(self) -> str:
        return os.pathsep.join(str(p) for p, _ in self.documents)

    def load(self) -> ClusterAccess:
        """Loaded in this process (the command-line tools)."""
        return _load(self)

    def in_child(self) -> Callable[[], Connection]:
        """Loaded in a child process, started now; the result's call waits for it (the
        node daemon: the package stays out of its memory)."""
        from gpudra.kube.kubeconfig_child import ChildLoad

        return ChildLoad(self)


def plan(flag: str | Path | None = None, *, context: str | None = None,
         namespace: str | None = None, environ: Mapping[str, str] | None = None,
         home: Path | None = None,
         service_account: Path = SERVICE_ACCOUNT) -> ClusterAccess | Plan:
    """In-cluster access, or the checked kubeconfig to load."""
    environ = os.environ if environ is None else environ
    home = Path(environ.get("HOME") or Path.home()) if home is None else home
    paths, explicit = config_files(flag, environ, home)
    if explicit and not paths[0].is_file():
        raise KubeconfigError(f"--kubeconfig {paths[0]}: no such file")
    documents = [(p, _read(p)) for p in paths if p.is_file()]
    documents = [(p, d) for p, d in documents if d]
    if not documents:
        if explicit:
            raise KubeconfigError(f"--kubeconfig {paths[0]}: empty")
        if environ.get("KUBERNETES_SERVICE_HOST") and environ.get("KUBERNETES_SERVICE_PORT"):
            if context:
                raise KubeconfigError(f"--context {context}: no kubeconfig to take it from "
                                      "(running in-cluster)")
            return ClusterAccess(in_cluster(environ, service_account),
                                 namespace or _in_cluster_namespace(service_account),
                                 "in-cluster service account")
        where = (f"KUBECONFIG={environ['KUBECONFIG']}" if environ.get("KUBECONFIG")
                 else str(paths[0]))
        raise KubeconfigError(f"no cluster configuration: {where} has none and this is not a "
                              "pod (KUBERNETES_SERVICE_HOST is unset); give --kubeconfig FILE")
    return _checked(documents, context, namespace, environ)


def _read(path: Path) -> dict[str, Any]:
    import yaml  # not for a daemon in its pod: it reads no kubeconfig

    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeconfigError(f"kubeconfig {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {path}: not valid YAML: "
                              f"{' '.join(str(exc).split())}") from exc
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (expected a mapping with "
                              "clusters, contexts and users)")
    return document


def _checked(documents: list[tuple[Path, dict[str, Any]]], context: str | None,
             namespace: str | None, environ: Mapping[str, str]) -> Plan:
    """What can be checked on the files as read: the context, its cluster and user, the
    files they name, inline data that must be base64. An entry is the first file's of that
    name, as kubectl and the loader merge them."""
    files = os.pathsep.join(str(p) for p, _ in documents)
    chosen = context or next((d["current-context"] for _, d in documents
                              if d.get("current-context")), None)
    contexts = _all_named(documents, "contexts")
    names = ", ".join(contexts) or "none"
    if not chosen:
        raise KubeconfigError(f"no current-context in {files}; give --context "
                              f"(contexts: {names})")
    if str(chosen) not in contexts:
        flag_name = "--context" if context else "current-context"
        raise KubeconfigError(f"{flag_name} {chosen}: no such context in {files} "
                              f"(contexts: {names})")
    body = contexts[str(chosen)][1].get("context") or {}
    cluster_name, user_name = body.get("cluster"), body.get("user")
    clusters = _all_named(documents, "clusters")
    if not cluster_name or str(cluster_name) not in clusters:
        raise KubeconfigError(f"context {chosen}: cluster {cluster_name!r} is not in {files}")
    where, cluster = clusters[str(cluster_name)]
    if not (cluster.get("cluster") or {}).get("server"):
        raise KubeconfigError(f"cluster {cluster_name!r} has no server")
    _check_entry("cluster", str(cluster_name), cluster.get("cluster") or {}, where)
    token_file = None
    if user_name:
        users = _all_named(documents, "users")
        if str(user_name) not in users:
            raise KubeconfigError(f"user {user_name!r} is not in users "
                                  f"(known: {', '.join(users) or 'none'})")
        where, user = users[str(user_name)]
        body = user.get("user") or {}
        _check_entry("user", str(user_name), body, where)
        _check_user(body, f"user {user_name!r}")
        if body.get("tokenFile") and not body.get("token"):
            token_file = Path(os.path.normpath(where.parent / str(body["tokenFile"])))
    return Plan(tuple(documents), str(chosen), namespace, dict(environ), token_file)


def _all_named(documents: Sequence[tuple[Path, Mapping[str, Any]]],
               kind: str) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Entries of a list by name, each with its file: the first file's wins."""
    out: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path, document in documents:
        entries = document.get(kind)
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                out.setdefault(entry["name"], (path, entry))
    return out


def _load(found: Plan) -> ClusterAccess:
    """Load a checked kubeconfig with the ``kubernetes`` package, in this process."""
    from gpudra.kube.credentials import LoadedCredentials, TokenFile

    settings, configuration = loaded_settings(found)
    credentials: Credentials | None = None
    if found.token_file is not None:
        credentials = TokenFile(found.token_file)
    elif settings.authorization:
        credentials = LoadedCredentials(configuration)
    return ClusterAccess(settings.connection(credentials, found.environ),
                         found.namespace or settings.namespace or "default",
                         f"context {found.context} in {found.files}")


@dataclass(frozen=True)
class Settings:
    """What the ``kubernetes`` loader made of a kubeconfig, as plain data (a child process
    hands it to the node daemon as JSON: :mod:`gpudra.kube.kubeconfig_child`)."""

    server: str
    namespace: str = ""
    ca_pem: str = ""
    cert_pem: str = ""
    key_pem: str = ""
    verify: bool = True
    tls_server_name: str = ""
    proxy_url: str = ""
    authorization: str = ""
    expires: float | None = None
    """When an exec plugin's credential expires (``time.time()``); None: it does not."""

    def connection(self, credentials: Credentials | None,
                   environ: Mapping[str, str]) -> Connection:
        tls = _tls(self) if self.server.startswith("https:") else None
        return Connection(server=self.server, tls=tls,
                          tls_server_name=self.tls_server_name or None,
                          proxy=self.proxy_url or proxy_from_environment(self.server, environ),
                          credentials=credentials)


def loaded_settings(found: Plan) -> tuple[Settings, Any]:
    """The kubeconfig loaded by the ``kubernetes`` package: its settings, and the
    package's ``Configuration`` (which refreshes an exec plugin's credential)."""
    from kubernetes.client import Configuration
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

    merged = KubeConfigMerger(found.files).config  # type: ignore[no-untyped-call]
    chosen = found.context
    body = (_named(merged.value, "contexts", chosen) or {}).get("context") or {}
    cluster_name, user_name = body.get("cluster"), body.get("user")
    cluster = _named(merged.value, "clusters", str(cluster_name)) or {}
    user = _named(merged.value, "users", str(user_name)) if user_name else None
    configuration = Configuration()
    try:
        with _plugin_errors() as plugin_errors:
            loader = KubeConfigLoader(  # type: ignore[no-untyped-call]
                config_dict=merged, active_context=str(chosen), config_base_path=None)
            loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, ValueError, OSError) as exc:
        raise KubeconfigError(f"context {chosen}: {' '.join(str(exc).split())}") from exc
    user_body = (user or {}).get("user") or {}
    authorization = configuration.api_key.get("BearerToken") or ""
    if user_body.get("exec") and not (authorization or configuration.cert_file):
        detail = "; ".join(plugin_errors) or "no token or client certificate"
        raise KubeconfigError(f"user {user_name!r}: exec plugin "
                              f"{user_body['exec'].get('command')!r}: {detail}")
    expiry = getattr(loader, "expiry", None)  # set from an exec plugin's answer
    texts = {}
    for key, path in (("ca_pem", configuration.ssl_ca_cert), ("cert_pem", configuration.cert_file),
                      ("key_pem", configuration.key_file)):
        try:
            texts[key] = Path(path).read_text() if path else ""
        except (OSError, UnicodeDecodeError) as exc:
            raise KubeconfigError(f"cluster {cluster_name!r}: {key.removesuffix('_pem')} "
                                  f"{path}: {exc}") from exc
    cluster_body = cluster.get("cluster") or {}
    return Settings(
        server=str(configuration.host), namespace=str(body.get("namespace") or ""),
        verify=bool(configuration.verify_ssl),
        tls_server_name=str(configuration.tls_server_name or ""),
        proxy_url=str(configuration.proxy or "") if "proxy-url" in cluster_body else "",
        authorization=str(authorization),
        expires=expiry.timestamp() if expiry is not None else None, **texts), configuration


def _entries(config: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    entries = config.get(kind)
    return [e.value if hasattr(e, "value") else e for e in entries or []
            if isinstance(getattr(e, "value", e), dict)]


def _named(config: Mapping[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    return next((e for e in _entries(config, kind) if e.get("name") == name), None)


def _check_user(user: Mapping[str, Any], where: str) -> None:
    if user.get("auth-provider"):
        provider = (user["auth-provider"] or {}).get("name", "?")
        raise KubeconfigError(f"{where}: auth-provider {provider!r} is not supported (it was "
                              "removed from kubectl; use an exec credential plugin)")
    cert = user.get("client-certificate") or user.get("client-certificate-data")
    key = user.get("client-key") or user.get("client-key-data")
    if bool(cert) != bool(key):
        raise KubeconfigError(f"{where}: client-certificate and client-key go together")
    plugin = user.get("exec")
    if plugin is not None and (not isinstance(plugin, dict) or not plugin.get("command")):
        raise KubeconfigError(f"{where}: exec: no command")


def _check_entry(kind: str, name: str, body: Mapping[str, Any], source: Path) -> None:
    """Every file the entry names can be read (relative to the file the entry is in), and
    its inline data is base64."""
    import base64
    import binascii

    fields = ("certificate-authority",) if kind == "cluster" else (
        "client-certificate", "client-key", "tokenFile")
    for field in fields:
        data = body.get(f"{field}-data")
        if data:
            try:
                base64.b64decode(str(data), validate=True)
            except binascii.Error as exc:
                raise KubeconfigError(f"{kind} {name!r}: {field}-data is not base64") from exc
        elif body.get(field) and not (field == "tokenFile" and body.get("token")):
            path = Path(os.path.normpath(source.parent / str(body[field])))
            try:
                if path.is_dir():
                    raise IsADirectoryError(21, "Is a directory")
                with path.open("rb"):
                    pass
            except OSError as exc:
                raise KubeconfigError(f"{kind} {name!r}: {field} {path}: "
                                      f"{exc.strerror or exc}") from exc


def _tls(settings: Settings) -> ssl.SSLContext:
    """The TLS context the settings describe; what is not what its field says is an error
    naming it."""
    try:
        context = ssl.create_default_context(cadata=settings.ca_pem or None)
    except (ValueError, ssl.SSLError) as exc:
        raise KubeconfigError(f"certificate-authority: {exc}") from exc
    if not settings.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if settings.cert_pem and settings.key_pem:
        try:
            _load_chain(context, settings.cert_pem, settings.key_pem)
        except (OSError, ssl.SSLError) as exc:
            raise KubeconfigError(f"client-certificate and client-key: {exc}") from exc
    return context


def _load_chain(context: ssl.SSLContext, cert_pem: str, key_pem: str) -> None:
    """Load an in-memory certificate and key: ``ssl`` only reads them from files, so
    through a private temporary directory removed at once."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpudra-tls-") as directory:
        cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        for path, text in ((cert, cert_pem), (key, key_pem)):
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(text)
        context.load_cert_chain(cert, key)


@contextmanager
def _plugin_errors() -> Iterator[list[str]]:
    """What the loader logs instead of raising (a failing exec plugin), collected."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(" ".join(record.getMessage().split())[:300])

    handler = Collect(logging.ERROR)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield messages
    finally:
        root.removeHandler(handler)


def _in_cluster_namespace(service_account: Path) -> str:
    try:
        return (service_account / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"
