"""The API-server stand-in in its own process, driven over plain HTTP.

Benchmarks must not run the stand-in inside their own interpreter: its request handling
would share a GIL with the kubelet emulator and distort every latency. This starts
``python -m gpudra.testing.fakeapi`` as a child process and talks to it the way any client
does, with JSON over loopback HTTP.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any, Final

Obj = dict[str, Any]

_PATHS: Final = {
    "Node": ("/api/v1", "nodes", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
}


class RemoteApi:
    """A ``python -m gpudra.testing.fakeapi`` child process and a tiny JSON client for it."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> RemoteApi:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "gpudra.testing.fakeapi", "--port", "0"],
            stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        self.url = self._process.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the API-server stand-in did not start (said {self.url!r})")
        return self

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
            self._process = None

    def __enter__(self) -> RemoteApi:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def _path(self, kind: str, namespace: str | None, name: str | None = None) -> str:
        prefix, plural, namespaced = _PATHS[kind]
        path = f"{prefix}/namespaces/{namespace or 'default'}/{plural}" if namespaced else (
            f"{prefix}/{plural}")
        return f"{path}/{name}" if name else path

    def _send(self, method: str, path: str, body: Obj | None = None, *,
              query: str = "") -> Obj:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}{path}{'?' + query if query else ''}", data=data, method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answer: Obj = json.loads(response.read())
                return answer
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:300]!r}") from exc

    def put(self, obj: Obj) -> Obj:
        """Create ``obj``; a ``status`` in it is written through the status subresource,
        as the scheduler writes a claim's allocation."""
        meta = obj["metadata"]
        namespace = meta.get("namespace")
        status = obj.get("status")
        created = self._send("POST", self._path(obj["kind"], namespace),
                             {k: v for k, v in obj.items() if k != "status"})
        if status is not None:
            created["status"] = status
            created = self._send(
                "PUT", self._path(obj["kind"], namespace, meta["name"]) + "/status", created)
        return created

    def list(self, kind: str, *, field_selector: str = "") -> list[Obj]:
        query = f"fieldSelector={field_selector}" if field_selector else ""
        items: list[Obj] = self._send("GET", self._path(kind, None), query=query)["items"]
        return items

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        self._send("DELETE", self._path(kind, namespace, name))

    def delete_collection(self, kind: str, *, field_selector: str) -> None:
        self._send("DELETE", self._path(kind, None), query=f"fieldSelector={field_selector}")
