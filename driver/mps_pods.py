"""MPS control daemons as Pods of their own, outside the plugin pod.

A control daemon started inside the plugin container dies with it: a ``helm upgrade``, a
crash or an OOM kill of the plugin would take every MPS client's server on the node along.
So each daemon (a shared GPU's, ``shared-<GPU uuid>``, or a claim's) runs as a Pod the node
daemon creates through the API server:

- pinned to the node (``spec.nodeName``), in the driver's namespace, named from the node and
  the daemon's key (:func:`pod_name`) and labelled with both (and the GPU's UUID), so a
  restarted node daemon finds it again (:meth:`MpsPods.find`, :meth:`MpsPods.keys`);
- owned by nothing: an owner reference to the plugin pod would have the garbage collector
  delete it with the plugin pod, exactly what it must survive;
- hostPath mounts of the daemon's directory (the same path inside, so the pipe and log
  directories the claims' CDI specs name are the daemon's too), its ``shm/`` as the pod's
  ``/dev/shm`` (the MPS server's shared memory with its clients), and the driver root;
- running ``gpudra mps-control-daemon`` (:mod:`gpudra.cli.mps_daemon_cmd`), which executes
  the driver root's ``nvidia-cuda-mps-control -f``, or the simulator's stand-in;
- ``restartPolicy: OnFailure``: the kubelet restarts a daemon that crashes; one told to
  ``quit`` stays down until the node daemon deletes its pod.

The node daemon creates the pod with a GPU's first share and waits until it serves (the pod
runs and its control socket answers), adopts a running one after its own restart without
touching it, and deletes it after the last share. Start-up reconciliation deletes the pods
of keys that have no prepared claim (a crash between creating the pod and committing the
claim), so none leaks.

The API is reached through :class:`PodApi` (synchronous, bound to the namespace), which
``gpudra.kubeletplugin`` implements over its API session: this layer does not import the
client.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import structlog

from gpudra.driver import mps_process
from gpudra.driver.commands import CommandError

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
COMPONENT: Final = "mps-control-daemon"
CONTAINER: Final = "mps-control-daemon"
DRIVER_ROOT_MOUNT: Final = "/driver-root"
SHM_MOUNT: Final = "/dev/shm"
STATUS_POLL: Final = 0.5
"""Seconds between looks at a starting pod's status while its socket has not appeared:
a pod that failed is reported then, not after the whole start timeout."""


class PodApi(Protocol):
    """Pods of one namespace, synchronously (called from the node daemon's worker threads)."""

    namespace: str

    def get(self, name: str) -> Obj | None:
        """The pod, or ``None`` when there is none."""

    def list_on_node(self, node: str) -> list[Obj]:
        """Every pod of the namespace on ``node``."""

    def create(self, body: Obj) -> Obj: ...

    def delete(self, name: str) -> None:
        """Delete; a pod that is already gone is not an error."""


class PodApiError(Exception):
    """The API server refused or did not answer; the message says which call."""


@dataclass(frozen=True)
class MpsPodSettings:
    driver: str
    """The driver name: the prefix of the pods' labels (two drivers never share pods)."""
    node: str
    image: str
    pull_policy: str = "IfNotPresent"
    host_driver_root: Path | None = None
    """The driver root as the host sees it; ``None``: a simulated node (no driver)."""
    start_timeout: float = 30.0
    """Seconds a new pod has to serve: an image pull (the plugin's own image, so usually
    cached) and the daemon's start, inside the kubelet's 45 s call deadline."""


def pod_name(node: str, key: str) -> str:
    """``gpudra-mps-<digest>``: the same for the same node and daemon key, valid whatever
    the node's name (a GPU UUID's capitals, or a 253-character node name, would not be)."""
    return "gpudra-mps-" + hashlib.sha256(f"{node}\0{key}".encode()).hexdigest()[:20]


def _label_value(text: str) -> str:
    """``text`` when it is a valid label value, else a digest of it (a long node name)."""
    if len(text) <= 63 and text.replace("-", "").replace("_", "").replace(".", "").isalnum() \
            and text[:1].isalnum() and text[-1:].isalnum():
        return text
    return "sha256-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def deleting(pod: Obj) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _why_failed(pod: Obj) -> str:
    """The container's last exit, as the kubelet reported it."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = status.get("state") or {}
        last = status.get("lastState") or {}
        ended = state.get("terminated") or last.get("terminated")
        if ended:
            return (f"exit code {ended.get('exitCode')}"
                    + (f": {ended.get('message')}" if ended.get("message") else ""))
        waiting = state.get("waiting")
        if waiting:
            return f"{waiting.get('reason')}: {waiting.get('message', '')}".rstrip(": ")
    return str((pod.get("status") or {}).get("message") or "no container status")


class MpsPods:
    """Control daemons' pods for one node (see the module docstring)."""

    def __init__(self, api: PodApi, settings: MpsPodSettings, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.api = api
        self.settings = settings
        self._sleep = sleep

    @property
    def namespace(self) -> str:
        return self.api.namespace

    def name(self, key: str) -> str:
        return pod_name(self.settings.node, key)

    def where(self, key: str) -> str:
        """``<namespace>/<pod>``: how logs, ``gpudra top`` and claim status name it."""
        return f"{self.namespace}/{self.name(key)}"

    @property
    def _label_prefix(self) -> str:
        return self.settings.driver + "/"

    def labels(self, key: str, uuids: Sequence[str]) -> dict[str, str]:
        labels = {"app.kubernetes.io/name": "gpudra", "app.kubernetes.io/component": COMPONENT,
                  self._label_prefix + "node": _label_value(self.settings.node),
                  self._label_prefix + "mps-daemon": key}
        if len(uuids) == 1:
            labels[self._label_prefix + "gpu-uuid"] = _label_value(uuids[0])
        return labels

    def pod_for(self, key: str, directory: Path, uuids: Sequence[str]) -> Obj:
        """The pod that runs ``key``'s control daemon in ``directory`` for ``uuids``."""
        settings = self.settings
        pipe, logs, shm = directory / "pipe", directory / "log", directory / "shm"
        args = ["mps-control-daemon", f"--pipe-dir={pipe}", f"--log-dir={logs}",
                *(f"--gpu-uuid={u}" for u in uuids)]
        mounts: list[Obj] = [{"name": "mps", "mountPath": str(directory)},
                             {"name": "shm", "mountPath": SHM_MOUNT}]
        volumes: list[Obj] = [
            {"name": "mps", "hostPath": {"path": str(directory), "type": "Directory"}},
            {"name": "shm", "hostPath": {"path": str(shm), "type": "Directory"}}]
        # tini as PID 1 on a real node, as in the plugin's pod: it passes the kubelet's
        # SIGTERM on and reaps whatever the daemon leaves (the simulated one leaves nothing).
        command = ["gpudra"]
        if settings.host_driver_root is None:
            args.append("--simulate")
        else:
            command = ["/usr/bin/tini", "--", "gpudra"]
            args.append(f"--driver-root={DRIVER_ROOT_MOUNT}")
            mounts.append({"name": "driver-root", "mountPath": DRIVER_ROOT_MOUNT,
                           "readOnly": True, "mountPropagation": "HostToContainer"})
            volumes.append({"name": "driver-root", "hostPath": {
                "path": str(settings.host_driver_root), "type": "Directory"}})
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": self.name(key), "namespace": self.namespace,
                "labels": self.labels(key, uuids),
                "annotations": {self._label_prefix + "mps-directory": str(directory),
                                self._label_prefix + "gpu-uuids": ",".join(uuids)}},
            "spec": {
                "nodeName": settings.node,
                "restartPolicy": "OnFailure",
                # It talks to no API server, and nothing of the cluster's should reach it.
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                # It has been told to quit before its pod is deleted; a daemon that did not
                # answer is killed well inside the wait for the deletion (start_timeout).
                "terminationGracePeriodSeconds": 10,
                # Whatever taints the node or its GPUs get, the daemon its clients depend on
                # stays until its last share is gone.
                "tolerations": [{"operator": "Exists"}],
                "containers": [{
                    "name": CONTAINER, "image": settings.image,
                    "imagePullPolicy": settings.pull_policy,
                    "command": command, "args": args,
                    # The GPUs' device nodes and a chroot into the driver root, as the
                    # plugin container has them; a simulated node needs neither (and its
                    # namespace need not admit privileged pods).
                    **({} if settings.host_driver_root is None
                       else {"securityContext": {"privileged": True}}),
                    # Requests, so the pod is not BestEffort: the first evicted under
                    # memory pressure would be the daemon every share of the GPU uses.
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                    "volumeMounts": mounts}],
                "volumes": volumes}}

    # --- finding ------------------------------------------------------------------------------

    def find(self, key: str) -> Obj | None:
        name = self.name(key)
        found: Obj | None = self._api(lambda: self.api.get(name),
                                      f"get pod {self.namespace}/{name}")
        return found

    def keys(self) -> dict[str, str]:
        """Daemon key → pod name of every control daemon pod of this node and driver."""
        found = {}
        node = self.settings.node
        listed: list[Obj] = self._api(lambda: self.api.list_on_node(node),
                                      f"list pods of node {node} in {self.namespace}")
        for pod in listed:
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            key = labels.get(self._label_prefix + "mps-daemon")
            if labels.get("app.kubernetes.io/component") == COMPONENT and isinstance(key, str) \
                    and meta.get("name") == self.name(key):
                found[key] = str(meta["name"])
        return found

    def serving_pid(self, key: str, directory: Path) -> int | None:
        """The daemon's pid (as its pid file names it) when its pod runs and its control
        socket is there; else ``None``."""
        pod = self.find(key)
        if pod is None or deleting(pod) or phase(pod) != "Running":
            return None
        return self._socket_pid(directory)

    @staticmethod
    def _socket_pid(directory: Path) -> int | None:
        from gpudra.driver.mps import CONTROL_SOCKET, NATIVE_PID_FILE

        pipe = directory / "pipe"
        if not (pipe / CONTROL_SOCKET).exists():
            return None
        return mps_process.read_pid(pipe / NATIVE_PID_FILE)

    # --- start and stop ----------------------------------------------------------------------

    def ensure(self, key: str, directory: Path, uuids: Sequence[str],
               clear: Callable[[], None]) -> int:
        """Create the pod unless one serves ``key`` already, and wait until it serves; its
        daemon's pid. A pod that ended, is being deleted or was made for another directory
        or other GPUs is replaced. ``clear`` empties the pipe directory before a new pod
        starts (a killed daemon leaves its socket behind). :class:`CommandError` when it
        does not serve in time (the pod is left for the caller's undo, :meth:`remove`)."""
        name = self.name(key)
        pod = self._api(lambda: self.api.get(name), f"get pod {self.namespace}/{name}")
        if pod is not None and not self._reusable(pod, directory, uuids):
            log.info("replacing MPS control daemon pod", pod=f"{self.namespace}/{name}",
                     phase=phase(pod), deleting=deleting(pod))
            self._delete_and_wait(name)
            pod = None
        if pod is None:
            clear()
            body = self.pod_for(key, directory, uuids)
            self._api(lambda: self.api.create(body), f"create pod {self.namespace}/{name}")
            log.info("created MPS control daemon pod", pod=f"{self.namespace}/{name}",
                     gpus=list(uuids))
        return self._wait_serving(name, directory)

    def _reusable(self, pod: Obj, directory: Path, uuids: Sequence[str]) -> bool:
        notes = (pod.get("metadata") or {}).get("annotations") or {}
        return (not deleting(pod) and phase(pod) in ("Pending", "Running")
                and notes.get(self._label_prefix + "mps-directory") == str(directory)
                and notes.get(self._label_prefix + "gpu-uuids") == ",".join(uuids))

    def _wait_serving(self, name: str, directory: Path) -> int:
        deadline = time.monotonic() + self.settings.start_timeout
        where = f"MPS control daemon pod {self.namespace}/{name}"
        found: list[int] = []

        def serving() -> bool:
            pid = self._socket_pid(directory)
            if pid is not None:
                found.append(pid)
            return pid is not None

        while True:
            remaining = deadline - time.monotonic()
            up = mps_process.wait_for(serving, max(0.0, min(STATUS_POLL, remaining)))
            pod = self._api(lambda: self.api.get(name), f"get pod {self.namespace}/{name}")
            if up and pod is not None and phase(pod) == "Running" and not deleting(pod):
                return found[-1]
            if up:
                self._sleep(STATUS_POLL / 10)  # serving; the kubelet's status is behind
            if pod is None:
                raise CommandError(f"{where} was deleted while starting")
            if phase(pod) in ("Failed", "Succeeded"):
                raise CommandError(f"{where} ended ({phase(pod)}, {_why_failed(pod)})")
            if time.monotonic() >= deadline:
                raise CommandError(
                    f"{where} does not serve after {self.settings.start_timeout:g}s (phase "
                    f"{phase(pod)}; {directory / 'pipe'} has "
                    f"{'a' if self._socket_pid(directory) else 'no'} live control socket)")

    def remove(self, key: str, quit_daemon: Callable[[], object]) -> None:
        """Tell the daemon to quit (its clients' servers end cleanly) when its pod runs,
        delete the pod, and wait until the API server no longer has it. Idempotent."""
        name = self.name(key)
        pod = self._api(lambda: self.api.get(name), f"get pod {self.namespace}/{name}")
        if pod is None:
            return
        if phase(pod) == "Running" and not deleting(pod):
            try:
                quit_daemon()
            except CommandError as exc:
                log.warning("MPS control daemon did not take quit; deleting its pod",
                            pod=f"{self.namespace}/{name}", error=str(exc))
        self._delete_and_wait(name)
        log.info("deleted MPS control daemon pod", pod=f"{self.namespace}/{name}")

    def _delete_and_wait(self, name: str) -> None:
        self._api(lambda: self.api.delete(name), f"delete pod {self.namespace}/{name}")
        deadline = time.monotonic() + self.settings.start_timeout
        pause = 0.005
        while self._api(lambda: self.api.get(name), f"get pod {self.namespace}/{name}"):
            if time.monotonic() > deadline:
                raise CommandError(f"MPS control daemon pod {self.namespace}/{name} is still "
                                   f"there {self.settings.start_timeout:g}s after its deletion")
            self._sleep(pause)
            pause = min(pause * 2, 0.5)

    @staticmethod
    def _api(call: Callable[[], Any], what: str) -> Any:
        try:
            return call()
        except PodApiError as exc:
            raise CommandError(f"{what}: {exc}") from exc
