"""A kubelet stand-in for ordinary Pods on one simulated node: runs their processes.

Tests that make the driver create Pods (an MPS control daemon, an IMEX daemon) need
something to run them, as a node's kubelet would. :class:`PodRunner` watches the Pods of
one node (``spec.nodeName``) on an API server (the project's stand-in,
:mod:`gpudra.testing.fakeapi`, over real HTTP) and, for each:

- runs the first container's ``command`` + ``args`` (``$(VAR)`` expanded from its
  environment, as the kubelet does) as a local process, through a small shim
  (:mod:`gpudra.testing.pod_shim`) that outlives the runner and records the pid and the exit
  code, as a container runtime's shim does;
- with the container's ``env`` (``value`` and the ``fieldRef`` fields the downward API
  offers: ``metadata.name``, ``metadata.namespace``, ``metadata.uid``, ``spec.nodeName``,
  ``spec.serviceAccountName``, ``status.podIP``, ``status.hostIP``) on top of a small base
  (``PATH`` with this Python's ``bin`` first, ``HOSTNAME``) and the ``env`` the test gives
  (e.g. the simulator's state path);
- hostPath volumes are the host's own paths: a mount at the same path needs nothing; one
  whose ``mountPath`` differs has that prefix rewritten to the host path in the argv, the
  environment and ``workingDir`` (text only: files the process reads are not rewritten).
  ``DirectoryOrCreate`` is created; a missing ``Directory`` fails the pod;
- writes the pod's status: ``Running`` with ``Ready`` and ``ContainersReady`` True, podIP
  127.0.0.1 and a running container status once the process started (probes are not run);
  when it ends, ``Succeeded`` or ``Failed`` with the exit code (128 + signal number when a
  signal ended it), or, under ``restartPolicy`` ``Always`` / ``OnFailure``, a restart with
  ``restartCount`` raised and a short back-off;
- when the pod is deleted (or gets a ``deletionTimestamp``), sends SIGTERM, then SIGKILL
  after ``terminationGracePeriodSeconds`` (at most ``max_grace``), as the kubelet does; a pod
  marked deleting is then deleted for good (grace 0) once its process is gone.

API::

    with PodRunner(api.url, "node-a", env={"GPUDRA_SIM": str(state)}) as runner:
        ...                                   # create pods through the API server
        pid = runner.wait_running("ns", "pod-name")
        runner.wait_gone("ns", "pod-name")    # after deleting it: its process has exited
        runner.log("ns", "pod-name")          # the container's stdout + stderr

    runner.close()    # (also on leaving ``with``) every process: SIGTERM, then SIGKILL
    runner.detach()   # "node restart": stop watching, leave every process running
    PodRunner(url, node, state_dir=old.state_dir).start()   # adopts them again

``state_dir`` (a fresh temporary directory unless given) keeps one record per container
(``<pod uid>.json``, ``.pid``, ``.exit``, ``.log``); a runner started on the records of a
detached one adopts each process whose pod still exists (same pid, nothing restarted) and
stops the processes of pods deleted meanwhile, as a restarted kubelet does. It removes the
directory on :meth:`close` only if it created it.

Other calls: :meth:`pid` (the running process of a pod, or ``None``), :meth:`exit_code`,
:meth:`pids` (every running container process). The runner's threads only poll local
files every few milliseconds and react to watch events; no test needs to sleep for it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

Obj = dict[str, Any]

SHIM = Path(__file__).resolve().parent / "pod_shim.py"
POLL = 0.005
"""Seconds between the runner's looks at its processes' record files."""
DEFAULT_GRACE = 30.0
"""The API's default ``terminationGracePeriodSeconds``."""
RESTART_BACKOFF = (0.05, 2.0)
"""First and longest pause before a container is restarted (the kubelet's is 10 s to 5 min)."""
HTTP_TIMEOUT = 10.0
_FIELD_REFS = {
    "metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace"),
    "metadata.uid": ("metadata", "uid"), "spec.nodeName": ("spec", "nodeName"),
    "spec.serviceAccountName": ("spec", "serviceAccountName"),
    "status.podIP": ("status", "podIP"), "status.hostIP": ("status", "hostIP"),
}
POD_IP = "127.0.0.1"


class PodRunnerError(Exception):
    """A pod the runner cannot run as asked (reported in the pod's status too)."""


@dataclass
class _Container:
    """What the runner knows of one pod's container process."""

    namespace: str
    name: str
    uid: str
    pod: Obj
    restarts: int = 0
    pid: int | None = None
    started_at: str = ""
    deleting_since: float | None = None
    """When SIGTERM was sent (the pod is being deleted); SIGKILL follows after the grace."""
    killed: bool = False
    exit_code: int | None = None
    restart_at: float | None = None
    finished: bool = False
    """Exited for good (no restart): its status is written, nothing more to do."""
    deleted: bool = False
    """The pod object is gone from the API server."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _read_json(path: Path) -> Obj | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _expand(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` from the container's environment, ``$$`` an escaped ``$``; an unknown
    variable stays as written, as the kubelet leaves it."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if text.startswith("$(", i):
            end = text.find(")", i + 2)
            if end > 0 and text[i + 2:end] in env:
                out.append(env[text[i + 2:end]])
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


class PodRunner:
    """Runs the processes of node ``node``'s Pods found on the API server at ``url``.

    ``env``: added to every container's environment (under the pod's own variables).
    ``state_dir``: the records of a detached runner to adopt, or where to keep new ones.
    ``max_grace``: the longest a deleted pod's process gets between SIGTERM and SIGKILL.
    """

    def __init__(self, url: str, node: str, *, env: dict[str, str] | None = None,
                 state_dir: Path | None = None, max_grace: float = 5.0,
                 python: str = sys.executable) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or parsed.hostname is None:
            raise PodRunnerError(f"PodRunner: {url!r} is not an http:// URL")
        self.url = url.rstrip("/")
        self.node = node
        self.env = dict(env or {})
        self.max_grace = max_grace
        self.python = python
        self._own_dir = state_dir is None
        self.state_dir = Path(tempfile.mkdtemp(prefix="pods-")) if state_dir is None \
            else state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._host = parsed.hostname
        self._port = parsed.port or 80
        self._containers: dict[str, _Container] = {}
        self._lock = threading.Lock()
        self._events: queue.Queue[tuple[str, Obj]] = queue.Queue()
        self._stopping = threading.Event()
        self._watch_conn: http.client.HTTPConnection | None = None
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []
        """What went wrong running pods (also written into their status): for assertions."""

    # --- life cycle ------------------------------------------------------------------------

    def start(self) -> PodRunner:
        """Adopt the records in ``state_dir``, then watch and run; returns ``self``."""
        self._adopt_records()
        for target, name in ((self._watch, "pod-runner-watch"), (self._loop, "pod-runner")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __enter__(self) -> PodRunner:
        return self.start() if not self._threads else self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def detach(self) -> None:
        """Stop watching and writing status, leave every process running (the node's
        kubelet restarts; a runner on the same ``state_dir`` adopts them)."""
        self._stop_threads()

    def close(self) -> None:
        """Stop every process (SIGTERM, SIGKILL after ``max_grace``), then the threads."""
        self._stop_threads()
        with self._lock:
            live = [c for c in self._containers.values() if self._running(c)]
        for c in live:
            self._signal(c, signal.SIGTERM)
        deadline = time.monotonic() + self.max_grace
        while any(self._running(c) for c in live) and time.monotonic() < deadline:
            time.sleep(POLL)
        for c in live:
            if self._running(c):
                self._signal(c, signal.SIGKILL)
        deadline = time.monotonic() + self.max_grace
        while any(self._running(c) for c in live) and time.monotonic() < deadline:
            time.sleep(POLL)
        if self._own_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _stop_threads(self) -> None:
        self._stopping.set()
        conn = self._watch_conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)  # ends the blocked read at once
        for thread in self._threads:
            thread.join(10)
        self._threads = []

    # --- what tests ask --------------------------------------------------------------------

    def _find(self, namespace: str, name: str) -> _Container | None:
        with self._lock:
            found = [c for c in self._containers.values()
                     if c.namespace == namespace and c.name == name]
        # The newest: a pod deleted and created again under the same name is a new uid.
        return found[-1] if found else None

    def pid(self, namespace: str, name: str) -> int | None:
        """The pod's running container process, or ``None``."""
        c = self._find(namespace, name)
        return c.pid if c is not None and self._running(c) else None

    def pids(self) -> dict[str, int]:
        """``namespace/name`` → pid of every running container process."""
        with self._lock:
            containers = list(self._containers.values())
        return {f"{c.namespace}/{c.name}": c.pid for c in containers
                if c.pid is not None and self._running(c)}

    def exit_code(self, namespace: str, name: str) -> int | None:
        c = self._find(namespace, name)
        return None if c is None else c.exit_code

    def log(self, namespace: str, name: str) -> str:
        c = self._find(namespace, name)
        if c is None:
            return ""
        path = self._record(c.uid).with_suffix(".log")
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_running(self, namespace: str, name: str, timeout: float = 20.0) -> int:
        """The pid once the pod's process runs; :class:`PodRunnerError` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.pid(namespace, name)
            if pid is not None:
                return pid
            time.sleep(POLL)
        raise PodRunnerError(f"pod {namespace}/{name} not running after {timeout:g}s "
                             f"(errors: {self.errors})")

    def wait_gone(self, namespace: str, name: str, timeout: float = 20.0) -> None:
        """Until the pod's process has exited (deleted pods: after SIGTERM/SIGKILL)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            c = self._find(namespace, name)
            if c is None or not self._running(c):
                return
            time.sleep(POLL)
        raise PodRunnerError(f"pod {namespace}/{name} still running after {timeout:g}s")

    # --- records ---------------------------------------------------------------------------

    def _record(self, uid: str) -> Path:
        return self.state_dir / uid

    def _running(self, c: _Container) -> bool:
        """The process runs: started, no exit recorded by its shim, alive in /proc."""
        return (c.pid is not None and not self._record(c.uid).with_suffix(".exit").exists()
                and _alive(c.pid))

    def _adopt_records(self) -> None:
        """Containers a detached runner left: known again, with their pid; whether their
        pod still exists is settled by the first list."""
        for meta_path in sorted(self.state_dir.glob("*.json")):
            meta = _read_json(meta_path)
            if meta is None or not isinstance(meta.get("pod"), dict):
                continue
            uid = meta_path.stem
            pid_rec = _read_json(meta_path.with_suffix(".pid")) or {}
            pid = pid_rec.get("pid")
            c = _Container(namespace=str(meta["namespace"]), name=str(meta["name"]), uid=uid,
                           pod=meta["pod"], restarts=int(meta.get("restarts", 0)),
                           pid=pid if isinstance(pid, int) else None,
                           started_at=str(meta.get("startedAt", "")))
            c.finished = bool(meta.get("finished", False))
            exited = _read_json(meta_path.with_suffix(".exit"))
            if exited is not None and c.finished:
                c.exit_code = int(exited.get("exitCode", -1))
            # An exit while no runner watched is noticed (status, restart) by the first tend.
            self._containers[uid] = c

    # --- watching --------------------------------------------------------------------------

    def _watch(self) -> None:
        """List, then watch from the list's version; again from a fresh list whenever the
        stream ends (a 410, a server that closed it), so no deletion is missed."""
        selector = urllib.parse.quote(f"spec.nodeName={self.node}")
        while not self._stopping.is_set():
            try:
                listed = self._http("GET", f"/api/v1/pods?fieldSelector={selector}")
                self._events.put(("LIST", listed))
                version = listed.get("metadata", {}).get("resourceVersion", "")
                self._stream(f"/api/v1/pods?watch=1&fieldSelector={selector}"
                             f"&resourceVersion={urllib.parse.quote(str(version))}")
            except (OSError, http.client.HTTPException, ValueError, PodRunnerError) as exc:
                if self._stopping.is_set():
                    return
                self.errors.append(f"watch: {exc}")
                self._stopping.wait(0.1)

    def _stream(self, path: str) -> None:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=None)
        self._watch_conn = conn
        try:
            conn.request("GET", path, headers={"Accept": "application/json"})
            if self._stopping.is_set():
                return
            response = conn.getresponse()
            if response.status != 200:
                raise PodRunnerError(f"watch answered HTTP {response.status}")
            while not self._stopping.is_set():
                line = response.readline()
                if not line:
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                if kind == "ERROR":
                    return  # e.g. 410 Expired: list again
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._events.put((kind, event["object"]))
        finally:
            self._watch_conn = None
            conn.close()

    def _http(self, method: str, path: str, body: Obj | None = None,
              content_type: str = "application/json") -> Obj:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": content_type,
                                                  "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as answer:
                result = json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise PodRunnerError(f"{method} {path}: HTTP {exc.code}") from exc
        return result if isinstance(result, dict) else {}

    # --- the loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                kind, obj = self._events.get(timeout=POLL)
            except queue.Empty:
                pass
            else:
                try:
                    self._handle(kind, obj)
                except (OSError, PodRunnerError) as exc:
                    self.errors.append(f"{kind}: {exc}")
            try:
                self._tend()
            except (OSError, PodRunnerError) as exc:
                self.errors.append(f"tending: {exc}")

    def _handle(self, kind: str, obj: Obj) -> None:
        if kind == "LIST":
            items = [p for p in obj.get("items") or [] if isinstance(p, dict)]
            present = {p["metadata"]["uid"] for p in items}
            with self._lock:
                gone = [c for uid, c in self._containers.items() if uid not in present]
            for c in gone:
                self._pod_deleted(c)
            for pod in items:
                self._pod_seen(pod)
        elif kind == "DELETED":
            deleted = self._containers.get(obj["metadata"]["uid"])
            if deleted is not None:
                self._pod_deleted(deleted)
        else:
            self._pod_seen(obj)

    def _pod_seen(self, pod: Obj) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        c = self._containers.get(uid)
        if c is None:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") \
                    or meta.get("deletionTimestamp"):
                return  # ran (on an earlier runner whose records are gone) or going
            c = _Container(namespace=meta["namespace"], name=meta["name"], uid=uid, pod=pod)
            with self._lock:
                self._containers[uid] = c
            self._start(c)
            return
        c.pod = pod
        if meta.get("deletionTimestamp"):
            self._terminate(c)

    def _pod_deleted(self, c: _Container) -> None:
        c.deleted = True
        self._terminate(c)

    def _terminate(self, c: _Container) -> None:
        c.restart_at = None  # no restart for a pod that is going
        if c.deleting_since is None and self._running(c):
            c.deleting_since = time.monotonic()
            self._signal(c, signal.SIGTERM)

    def _signal(self, c: _Container, sig: int) -> None:
        if c.pid is not None and self._running(c):
            with contextlib.suppress(ProcessLookupError):
                os.kill(c.pid, sig)

    def _grace(self, c: _Container) -> float:
        grace = (c.pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE)
        return min(float(grace), self.max_grace)

    def _tend(self) -> None:
        """Per container: SIGKILL after the grace, the exit noticed, a restart due."""
        with self._lock:
            containers = list(self._containers.values())
        for c in containers:
            if c.pid is not None and c.exit_code is None:
                exited = _read_json(self._record(c.uid).with_suffix(".exit"))
                if exited is not None:
                    c.exit_code = int(exited.get("exitCode", -1))
                    self._exited(c)
                elif c.deleting_since is not None and not c.killed and \
                        time.monotonic() - c.deleting_since > self._grace(c):
                    c.killed = True
                    self._signal(c, signal.SIGKILL)
            elif c.pid is None and c.exit_code is None and not c.finished \
                    and c.restart_at is None and c.deleted:
                c.finished = True
            if c.restart_at is not None and time.monotonic() >= c.restart_at:
                c.restart_at = None
                c.restarts += 1
                self._start(c)
            if c.deleted and (c.finished or (c.exit_code is not None and c.restart_at is None)):
                with self._lock:
                    self._containers.pop(c.uid, None)
                self._forget(c)

    def _exited(self, c: _Container) -> None:
        code = c.exit_code if c.exit_code is not None else -1
        if c.deleted:
            return
        if (c.pod.get("metadata") or {}).get("deletionTimestamp"):
            # The kubelet's last word on a pod marked deleting: remove it for good.
            with contextlib.suppress(PodRunnerError):
                self._http("DELETE", self._pod_path(c), {"gracePeriodSeconds": 0})
            return
        policy = (c.pod.get("spec") or {}).get("restartPolicy", "Always")
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            first, longest = RESTART_BACKOFF
            c.restart_at = time.monotonic() + min(first * (2 ** c.restarts), longest)
            self._write_status(c, phase="Running", ready=False, terminated=code)
            return
        c.finished = True
        self._save_meta(c)
        self._write_status(c, phase="Succeeded" if code == 0 else "Failed", ready=False,
                           terminated=code)

    def _forget(self, c: _Container) -> None:
        for suffix in (".json", ".pid", ".exit", ".log"):
            self._record(c.uid).with_suffix(suffix).unlink(missing_ok=True)

    # --- starting ----------------------------------------------------------------------------

    def _start(self, c: _Container) -> None:
        try:
            argv, env, cwd = self._command(c.pod)
        except PodRunnerError as exc:
            self.errors.append(str(exc))
            c.finished = True
            c.exit_code = 128
            self._write_status(c, phase="Failed", ready=False, terminated=None,
                               message=str(exc))
            return
        record = self._record(c.uid)
        for suffix in (".pid", ".exit", ".pid.tmp", ".exit.tmp"):
            record.with_suffix(suffix).unlink(missing_ok=True)
        c.pid, c.exit_code, c.deleting_since, c.killed = None, None, None, False
        c.started_at = _now()
        self._save_meta(c)
        # The launcher forks the shim off and exits at once (reaped here): the shim belongs
        # to no runner, so a detached runner's processes live on.
        subprocess.run([self.python, "-IS", str(SHIM), str(record), str(record) + ".log",
                        *argv], env=env, cwd=cwd, check=True, start_new_session=True,
                       stdin=subprocess.DEVNULL, timeout=HTTP_TIMEOUT)
        deadline = time.monotonic() + HTTP_TIMEOUT
        while True:
            rec = _read_json(record.with_suffix(".pid"))
            if rec is not None:
                c.pid = int(rec["pid"])
                break
            exited = _read_json(record.with_suffix(".exit"))
            if exited is not None or time.monotonic() > deadline:
                c.exit_code = 127 if exited is None else int(exited.get("exitCode", 127))
                self._exited(c)
                return
            time.sleep(POLL / 5)
        self._write_status(c, phase="Running", ready=True, terminated=None)

    def _save_meta(self, c: _Container) -> None:
        path = self._record(c.uid).with_suffix(".json")
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"namespace": c.namespace, "name": c.name, "pod": c.pod,
                                   "restarts": c.restarts, "startedAt": c.started_at,
                                   "finished": c.finished}))
        tmp.replace(path)

    def _command(self, pod: Obj) -> tuple[list[str], dict[str, str], str]:
        """argv, environment and working directory of the pod's first container."""
        where = f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']}"
        containers = (pod.get("spec") or {}).get("containers") or []
        if not containers:
            raise PodRunnerError(f"{where}: no containers")
        container = containers[0]
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if not argv:
            raise PodRunnerError(f"{where}: container {container.get('name')!r} has no "
                                 "command (an image's entrypoint cannot be run here)")
        remap = self._volume_paths(pod, container, where)
        env = {"PATH": os.pathsep.join([str(Path(self.python).parent), "/usr/local/bin",
                                        "/usr/bin", "/bin"]),
               "HOSTNAME": pod["metadata"]["name"], **self.env}
        for item in container.get("env") or []:
            env[item["name"]] = self._env_value(pod, item, env, where)
        argv = [_expand(a, env) for a in argv]

        def mapped(text: str) -> str:
            for inside, host in remap:
                if text == inside or text.startswith(inside.rstrip("/") + "/"):
                    return host + text[len(inside.rstrip("/")):]
            return text

        argv = [mapped(a) for a in argv]
        env = {k: mapped(v) for k, v in env.items()}
        return argv, env, mapped(container.get("workingDir") or "/")

    def _env_value(self, pod: Obj, item: Obj, env: dict[str, str], where: str) -> str:
        if "value" in item:
            return _expand(str(item["value"]), env)
        ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if ref not in _FIELD_REFS:
            raise PodRunnerError(f"{where}: env {item.get('name')!r}: only value and fieldRef "
                                 f"({', '.join(sorted(_FIELD_REFS))}) are supported")
        if ref in ("status.podIP", "status.hostIP"):
            return POD_IP
        section, key = _FIELD_REFS[ref]
        return str((pod.get(section) or {}).get(key, ""))

    @staticmethod
    def _volume_paths(pod: Obj, container: Obj, where: str) -> list[tuple[str, str]]:
        """(mountPath, host path) of each hostPath mount whose paths differ, deepest first;
        ``DirectoryOrCreate`` made, a missing ``Directory`` refused."""
        host_paths = {v["name"]: v["hostPath"] for v in (pod.get("spec") or {}).get(
            "volumes") or [] if isinstance(v, dict) and "hostPath" in v}
        remap = []
        for mount in container.get("volumeMounts") or []:
            source = host_paths.get(mount.get("name"))
            if source is None:
                continue  # emptyDir, configMap, ...: nothing on the host to map
            path = Path(source["path"])
            kind = source.get("type", "")
            if kind == "DirectoryOrCreate":
                path.mkdir(mode=0o755, parents=True, exist_ok=True)
            elif kind == "Directory" and not path.is_dir():
                raise PodRunnerError(f"{where}: hostPath {path} (volume {mount.get('name')!r}) "
                                     "is not a directory")
            sub = mount.get("subPath")
            host = str(path / sub) if sub else str(path)
            if mount["mountPath"] != host:
                remap.append((str(mount["mountPath"]), host))
        return sorted(remap, key=lambda pair: -len(pair[0]))

    # --- status ------------------------------------------------------------------------------

    def _pod_path(self, c: _Container) -> str:
        return (f"/api/v1/namespaces/{urllib.parse.quote(c.namespace)}/pods/"
                f"{urllib.parse.quote(c.name)}")

    def _write_status(self, c: _Container, *, phase: str, ready: bool,
                      terminated: int | None, message: str = "") -> None:
        if c.deleted:
            return
        container = ((c.pod.get("spec") or {}).get("containers") or [{}])[0]
        now = _now()
        state: Obj
        if phase == "Running" and ready:
            state = {"running": {"startedAt": c.started_at}}
        elif c.restart_at is not None:
            state = {"waiting": {"reason": "CrashLoopBackOff"}}
        else:
            state = {"terminated": {
                "exitCode": terminated if terminated is not None else 128,
                "reason": "Completed" if terminated == 0 else "Error",
                "startedAt": c.started_at or now, "finishedAt": now,
                **({"message": message} if message else {})}}
        status_word = "True" if ready else "False"
        status: Obj = {
            "phase": phase, "hostIP": POD_IP, "hostIPs": [{"ip": POD_IP}], "podIP": POD_IP,
            "podIPs": [{"ip": POD_IP}], "startTime": c.started_at or now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": status_word, "lastTransitionTime": now},
                {"type": "Ready", "status": status_word, "lastTransitionTime": now}],
            "containerStatuses": [{
                "name": container.get("name", ""), "image": container.get("image", ""),
                "imageID": "", "ready": ready, "started": phase == "Running",
                "restartCount": c.restarts, "state": state}],
        }
        if message:
            status["message"] = message
        try:
            self._http("PATCH", self._pod_path(c) + "/status", {"status": status},
                       content_type="application/merge-patch+json")
        except PodRunnerError as exc:
            if "HTTP 404" not in str(exc):  # deleted meanwhile: nothing to report on
                self.errors.append(f"status of pod {c.namespace}/{c.name}: {exc}")
