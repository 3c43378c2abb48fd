"""What a daemon Pod's status says: running, ready, failed or crash-looping, and why.

Pure functions over the Pod's raw JSON. A daemon that restarts over and over is Running as
far as the Pod's phase goes; here it counts as failed once it crash-loops, so the domain and
its claims say so instead of waiting for a timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpudra.api import compute_domain as cd

CRASH_LOOP_REASON: Final = "CrashLoopBackOff"
FAILED_WAITING_REASONS: Final = frozenset(
    {CRASH_LOOP_REASON, "ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError",
     "CreateContainerError", "InvalidImageName", "RunContainerError"})
"""Waiting reasons that do not end by themselves: the daemon is failing, not starting."""


@dataclass(frozen=True)
class DaemonPod:
    name: str
    domain_uid: str
    node: str
    phase: str
    deleting: bool
    created: str
    failure: str
    """Why the daemon is failing ("" when it is not)."""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def read_pod(pod: Mapping[str, Any], *, crash_restarts: int) -> DaemonPod | None:
    """The daemon pod ``pod`` is, or None if it is not one of ours (no domain label)."""
    meta = _map(pod.get("metadata"))
    labels = _map(meta.get("labels"))
    domain = labels.get(cd.LABEL_DOMAIN)
    # The annotation has the node's full name; the label only when it fits one.
    node = _map(meta.get("annotations")).get(cd.LABEL_NODE) or labels.get(cd.LABEL_NODE)
    if not isinstance(domain, str) or not isinstance(node, str):
        return None
    status = _map(pod.get("status"))
    phase = str(status.get("phase") or "Pending")
    return DaemonPod(str(meta.get("name") or ""), domain, node, phase,
                     meta.get("deletionTimestamp") is not None,
                     str(meta.get("creationTimestamp") or ""),
                     _failure(status, phase, crash_restarts))


def _failure(status: Mapping[str, Any], phase: str, crash_restarts: int) -> str:
    if phase == "Failed":
        why = str(status.get("message") or status.get("reason") or "")
        return f"daemon pod failed{': ' + why if why else ''}" + _last_exit(status)
    for container in _list(status.get("containerStatuses")):
        c = _map(container)
        waiting = _map(_map(c.get("state")).get("waiting"))
        reason = str(waiting.get("reason") or "")
        restarts = c.get("restartCount")
        if reason in FAILED_WAITING_REASONS:
            message = str(waiting.get("message") or "")
            return (f"daemon container {reason}" + (f": {message}" if message else "")
                    + _last_exit(status))
        if isinstance(restarts, int) and crash_restarts and restarts >= crash_restarts:
            return f"daemon container restarted {restarts} times" + _last_exit(status)
    return ""


def _last_exit(status: Mapping[str, Any]) -> str:
    """`` (last exit: code 1, Error: message)`` from the first container that has one."""
    for container in _list(status.get("containerStatuses")):
        c = _map(container)
        for state in (_map(c.get("lastState")), _map(c.get("state"))):
            term = _map(state.get("terminated"))
            if term:
                parts = [f"code {term.get('exitCode')}"]
                if term.get("reason"):
                    parts.append(str(term["reason"]))
                text = ", ".join(parts)
                if term.get("message"):
                    text += f": {str(term['message'])[:200]}"
                return f" (last exit: {text})"
    return ""
