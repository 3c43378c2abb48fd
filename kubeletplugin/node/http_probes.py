"""HTTP endpoints for operators: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

Served from a thread, not the event loop, so ``/healthz`` can tell when the loop is stuck:
it calls the daemon's own registration ``GetInfo`` over its unix socket, which only answers
when the gRPC server (on the loop) does. Kubelet calls stuck in their own threads (a GPU
that hangs in NVML) do not fail it: restarting the daemon would not free that GPU. A
failing probe answers 503 with one line per problem, so ``kubectl describe`` and ``curl``
say what is wrong.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

Check = Callable[[], Sequence[str]]
"""What is wrong, one line each; empty when all is well."""


class ProbeServer:
    def __init__(self, address: tuple[str, int], *, live: Check, ready: Check,
                 notes: Check | None = None) -> None:
        """``notes``: lines ``/readyz`` shows after its verdict without failing it (held
        hardware: the node serves its other devices)."""
        host, port = address
        self._live = live
        self._ready = ready
        self._notes = notes
        probes = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                probes.handle(self)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the daemon's own log

        self._server = ThreadingHTTPServer((host or "0.0.0.0", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http-probes",
                                        daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(request, 200, generate_latest(), CONTENT_TYPE_LATEST)
        elif path in ("/healthz", "/livez"):
            self._check(request, self._live)
        elif path == "/readyz":
            self._check(request, self._ready, self._notes)
        else:
            self._send(request, 404, b"not found\n", "text/plain")

    def _check(self, request: BaseHTTPRequestHandler, check: Check,
               notes: Check | None = None) -> None:
        try:
            problems = list(check())
            extra = list(notes()) if notes is not None else []
        except Exception as exc:  # a failing probe must answer, not kill the thread
            problems, extra = [f"error: {exc}"], []
        body = "".join(f"{line}\n" for line in problems) if problems else "ok\n"
        body += "".join(f"{line}\n" for line in extra)
        self._send(request, 503 if problems else 200, body.encode(), "text/plain")

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, status: int, body: bytes, kind: str) -> None:
        request.send_response(status)
        request.send_header("Content-Type", kind)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
