"""Which cluster to talk to, found the way kubectl finds it.

Order: ``--kubeconfig FILE``; else every file of ``KUBECONFIG`` (``:``-separated, missing
files skipped) merged as kubectl merges them (the first file to set a name or a key wins);
else ``~/.kube/config``; else the pod's service account (in-cluster). ``--context`` picks a
context other than ``current-context``; the namespace is ``--namespace``, else the context's,
else ``default``. :func:`resolve` only reads files; :func:`gpudra.kube.connection` checks
and reads what it names (our own client, for the node daemon), :func:`api_client` turns it
into a ``kubernetes`` client for the command-line tools.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The named lists of a kubeconfig: merged by name, the first file's entry wins.
NAMED_LISTS = ("clusters", "contexts", "users")
# Relative file references, resolved against the directory of the file that names them
# (kubectl's ResolveLocalPaths): the named list, then the keys down to the path.
LOCAL_PATHS = (
    ("clusters", ("cluster", "certificate-authority")),
    ("users", ("user", "client-certificate")),
    ("users", ("user", "client-key")),
    ("users", ("user", "tokenFile")),
    ("users", ("user", "exec", "command")),
)


class KubeconfigError(Exception):
    """No usable cluster configuration; the message names the file, context or variable."""


@dataclass(frozen=True)
class ClusterAccess:
    """Where and as whom to connect: a merged kubeconfig and a context, or in-cluster."""

    config: dict[str, Any] | None
    """The merged kubeconfig; ``None``: the pod's service account."""
    context: str | None
    """The context to use (``None`` with in-cluster access)."""
    namespace: str
    files: tuple[Path, ...] = ()
    """The kubeconfig files read, in precedence order."""

    def describe(self) -> str:
        """For messages: ``context kind-dev in /home/me/.kube/config`` or ``in-cluster``."""
        if self.config is None:
            return "in-cluster service account"
        return f"context {self.context} in {os.pathsep.join(map(str, self.files))}"


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


def _read(path: Path) -> dict[str, Any]:
    # Imported when a file is read: a node daemon in its pod uses the service account and
    # reads none, and PyYAML is ~0.9 MiB of resident memory (issue 14).
    import yaml

    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeconfigError(f"kubeconfig {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {path}: not valid YAML: {exc}") from exc
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (expected a mapping with "
                              "clusters, contexts and users)")
    return document


def _rebased(node: Any, keys: Sequence[str], base: Path) -> Any:
    """``node`` with the relative path at ``keys`` made absolute against ``base``."""
    if keys:
        if not isinstance(node, dict) or keys[0] not in node:
            return node
        return {**node, keys[0]: _rebased(node[keys[0]], keys[1:], base)}
    if isinstance(node, str) and node and not Path(node).is_absolute():
        return str(base / node)
    return node


def _absolute(config: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The config with its relative file references made absolute against ``base``."""
    out = dict(config)
    for list_name, keys in LOCAL_PATHS:
        if not isinstance(out.get(list_name), list):
            continue
        command = keys[-1] == "command"
        out[list_name] = [
            # An exec command without a separator is looked up in PATH, not in the directory.
            entry if command and os.sep not in str(_leaf(entry, keys))
            else _rebased(entry, keys, base)
            for entry in out[list_name]]
    return out


def _leaf(node: Any, keys: Sequence[str]) -> Any:
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def merge(configs: Sequence[tuple[Path, Mapping[str, Any]]]) -> dict[str, Any]:
    """kubectl's merge: for each named cluster, context and user, and for every other
    top-level key, the first file that sets it wins and later files never change it."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    for list_name in NAMED_LISTS:
        merged[list_name] = []
    seen: dict[str, set[str]] = {name: set() for name in NAMED_LISTS}
    for path, raw in configs:
        config = _absolute(raw, path.parent)
        for key, value in config.items():
            if key in NAMED_LISTS:
                for entry in value or []:
                    name = entry.get("name") if isinstance(entry, dict) else None
                    if isinstance(name, str) and name not in seen[key]:
                        seen[key].add(name)
                        merged[key].append(entry)
            elif key not in merged or merged[key] in (None, "", {}):
                merged[key] = value
    return merged


def _named(config: Mapping[str, Any], list_name: str, name: str) -> dict[str, Any] | None:
    for entry in config.get(list_name) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    return None


def _in_cluster_namespace(service_account: Path) -> str:
    try:
        return (service_account / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"


def resolve(flag: str | Path | None = None, *, context: str | None = None,
            namespace: str | None = None, environ: Mapping[str, str] | None = None,
            home: Path | None = None,
            service_account: Path = SERVICE_ACCOUNT) -> ClusterAccess:
    """The cluster access kubectl would use with these flags and this environment."""
    environ = os.environ if environ is None else environ
    home = Path(environ.get("HOME") or Path.home()) if home is None else home
    paths, explicit = config_files(flag, environ, home)
    if explicit and not paths[0].is_file():
        raise KubeconfigError(f"--kubeconfig {paths[0]}: no such file")
    configs = [(p, _read(p)) for p in paths if p.is_file()]
    if not any(config for _, config in configs):
        if explicit:
            raise KubeconfigError(f"--kubeconfig {paths[0]}: empty")
        if environ.get("KUBERNETES_SERVICE_HOST") and environ.get("KUBERNETES_SERVICE_PORT"):
            if context:
                raise KubeconfigError(f"--context {context}: no kubeconfig to take it from "
                                      "(running in-cluster)")
            return ClusterAccess(None, None, namespace or _in_cluster_namespace(service_account))
        where = (f"KUBECONFIG={environ['KUBECONFIG']}" if environ.get("KUBECONFIG")
                 else str(paths[0]))
        raise KubeconfigError(f"no cluster configuration: {where} has none and this is not a "
                              "pod (KUBERNETES_SERVICE_HOST is unset); give --kubeconfig FILE")
    merged = merge(configs)
    files = tuple(p for p, _ in configs)
    chosen = context or merged.get("current-context")
    names = ", ".join(str(c.get("name")) for c in merged["contexts"]) or "none"
    if not chosen:
        raise KubeconfigError(f"no current-context in {os.pathsep.join(map(str, files))}; "
                              f"give --context (contexts: {names})")
    entry = _named(merged, "contexts", chosen)
    if entry is None:
        flag_name = "--context" if context else "current-context"
        raise KubeconfigError(f"{flag_name} {chosen}: no such context in "
                              f"{os.pathsep.join(map(str, files))} (contexts: {names})")
    body = entry.get("context") or {}
    cluster = body.get("cluster")
    if not cluster or _named(merged, "clusters", str(cluster)) is None:
        raise KubeconfigError(f"context {chosen}: cluster {cluster!r} is not in "
                              f"{os.pathsep.join(map(str, files))}")
    return ClusterAccess(merged, str(chosen), namespace or body.get("namespace") or "default",
                         files)


def api_client(access: ClusterAccess) -> Any:
    """A synchronous ``kubernetes.client.ApiClient`` for the command-line tools."""
    from kubernetes import client, config

    try:
        if access.config is None:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        return config.new_client_from_config_dict(  # type: ignore[no-untyped-call]
            config_dict=access.config, context=access.context, persist_config=False)
    except Exception as exc:  # ConfigException, bad certificates, missing files …
        raise KubeconfigError(f"{access.describe()}: {exc}") from exc
