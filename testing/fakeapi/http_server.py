"""HTTP/1.1 on top of ``http.server``: one thread per connection, keep-alive, chunked watch
streams, and a shutdown that leaves no thread or socket behind.

``ThreadingHTTPServer`` alone cannot shut down cleanly while clients hold keep-alive
connections open (their handler threads sit in ``readline``), so this server tracks its
connections and shuts them down itself.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from gpudra.testing.fakeapi import discovery, routing, versions
from gpudra.testing.fakeapi.errors import ApiError, bad_request, page_not_found
from gpudra.testing.fakeapi.faults import Faults, RequestRecord
from gpudra.testing.fakeapi.hostile import AsGiven
from gpudra.testing.fakeapi.operations import Api
from gpudra.testing.fakeapi.request import Request
from gpudra.testing.fakeapi.watch import WatchControl, WatchStream

_HEALTH = {"/healthz", "/livez", "/readyz"}


class ApiHttpServer(ThreadingHTTPServer):
    daemon_threads = True  # a wedged client can never keep the interpreter alive
    # The default backlog of 5 drops SYNs when a kubelet call fetches 64 claims at once
    # (each retried after 1 s, 3 s, 7 s); a real API server accepts far more.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], api: Api, faults: Faults,
                 control: WatchControl, as_given: AsGiven | None = None,
                 served: versions.Served = versions.MODES["v1"]) -> None:
        super().__init__(address, ApiHandler)
        self.api = api
        self.served = served
        # (resource, name, field) of every field a write lost to the served version.
        self.pruned: list[tuple[str, str, str]] = []
        self.faults = faults
        self.as_given = as_given or AsGiven()
        self.control = control
        self.stopping = threading.Event()  # also cuts injected delays short
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._conn_threads: set[threading.Thread] = set()

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host!s}:{port}"

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(target=self._serve, args=(request, client_address),
                                  name=f"fakeapi-conn-{client_address[1]}", daemon=True)
        with self._lock:
            if self.stopping.is_set():
                self.shutdown_request(request)
                return
            self._connections.add(request)
            self._conn_threads.add(thread)
        thread.start()

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except (ConnectionError, OSError):
            pass  # the client went away mid-request; nothing to report
        except Exception:  # pragma: no cover - a bug in the fake; show it, keep serving
            traceback.print_exc(file=sys.stderr)
        finally:
            self.shutdown_request(request)
            with self._lock:
                self._connections.discard(request)
                self._conn_threads.discard(threading.current_thread())

    def close_connections(self, timeout: float = 5.0) -> None:
        """Stop accepting work, unblock every connection thread, and wait for them."""
        with self._lock:
            self.stopping.set()
            connections = list(self._connections)
            threads = list(self._conn_threads)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout)


class ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ApiHttpServer
    server_version = "fakeapi"
    # Headers and body go out in separate writes; with Nagle + delayed ACK every response
    # would wait for the client's delayed ACK.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests assert on server.requests instead of reading logs

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ---- plumbing ------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, code: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(code, json.dumps(obj, separators=(",", ":")).encode(), "application/json",
                   headers)

    def _peer_alive(self) -> bool:
        """False once the client closed its end (a watch client that stopped watching)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return True
            return bool(self.connection.recv(1, socket.MSG_PEEK) != b"")
        except (OSError, ValueError):
            return False

    def _stream(self, stream: WatchStream,
                from_hub: Callable[[Any], Any] = lambda obj: obj) -> None:
        stream.alive = self._peer_alive
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.server.control.opened(1)
        frames = stream.frames()
        try:
            for frame in frames:
                shown = frame if frame.get("type") == "ERROR" else {
                    **frame, "object": from_hub(frame.get("object"))}
                data = json.dumps(shown, separators=(",", ":")).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")  # a clean end: the connection stays usable
        except OSError:
            self.close_connection = True  # the client stopped reading
        except Exception:  # pragma: no cover - a bug in the fake; headers are already sent
            traceback.print_exc(file=sys.stderr)
            self.close_connection = True
        finally:
            frames.close()
            self.server.control.opened(-1)

    # ---- dispatch ------------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        body = self._read_body()
        record: RequestRecord | None = None
        try:
            route = routing.parse(split.path, self.server.served)
            if route is None:
                self._serve_discovery(method, split.path)
                return
            watch = query.get("watch", "").lower() in ("true", "1")
            verb = routing.verb(method, route, watch)
            record = RequestRecord(method, split.path, query, verb, route.audit_resource,
                                   route.namespace, route.name, self.headers.get("Content-Type"))
            action = self.server.faults.on_request(record)
            if action.delay:
                self.server.stopping.wait(action.delay)
            if action.drop:
                self.close_connection = True
                self.server.faults.set_status(record, 0)
                return
            if action.error is not None:
                raise action.error
            req = Request(route.resource, route.namespace, route.name, route.subresource, query,
                          body, self.headers.get("Content-Type", ""),
                          self.headers.get("User-Agent", ""))
            warnings: list[str] = []
            if route.view is not None:
                req.to_hub, req.from_hub = self._converters(
                    route, route.view, warnings, strict=query.get("fieldValidation") == "Strict")
            if verb == "get" and self._serve_as_given(record, route):
                return
            api = self.server.api
            if verb == "watch":
                self.server.faults.set_status(record, 200)
                self._stream(api.watch(req), req.from_hub)
                return
            if verb in ("get", "list"):
                code, obj = 200, (api.get(req) if verb == "get" else api.list(req))
            else:
                code, obj = {"create": api.create, "update": api.update, "patch": api.patch,
                             "delete": api.delete,
                             "deletecollection": api.delete_collection}[verb](req)
            if route.view is not None:
                obj = self._answer_in_view(obj, req.from_hub)
            # Record the outcome before answering, so a client never sees it unrecorded.
            self.server.faults.set_status(record, code)
            headers = None
            if warnings:  # as the apiserver's fieldValidation=Warn: one header per field
                headers = {"Warning": ", ".join(f'299 - "unknown field \\"{w}\\""'
                                                for w in warnings)}
            self._send_json(code, obj, headers)
        except ApiError as err:
            if record is not None:
                self.server.faults.set_status(record, err.code)
            self._send_json(err.code, err.status(), err.headers)
        except OSError:
            raise
        except Exception as exc:  # a bug in the fake: answer like the apiserver would
            traceback.print_exc(file=sys.stderr)
            internal = ApiError(500, "InternalError", f"Internal error occurred: {exc!r}")
            self._send_json(500, internal.status())

    def _converters(self, route: routing.Route, view: str, warnings: list[str], *,
                    strict: bool = False,
                    ) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """Bodies of ``view`` → stored form (dropping what the served release does not
        know, into ``warnings`` and the server's ``pruned``; refusing it under
        ``fieldValidation=Strict``, as kubectl asks), and back."""
        plural = route.resource.plural
        schema = self.server.served.schema(view, plural)
        pruned = self.server.pruned

        def to_hub(obj: Any) -> Any:
            if schema is not None and isinstance(obj, dict):
                dropped: list[str] = []
                obj = versions.prune(obj, schema, "", dropped)
                name = str((obj.get("metadata") or {}).get("name") or route.name or "")
                if strict and dropped:
                    raise bad_request("strict decoding error: " + ", ".join(
                        f'unknown field "{where}"' for where in dropped))
                warnings.extend(dropped)
                pruned.extend((plural, name, where) for where in dropped)
            return versions.to_hub(plural, view, obj)

        def from_hub(obj: Any) -> Any:
            shown = versions.from_hub(plural, view, obj)
            if schema is not None and isinstance(shown, dict):
                shown = versions.prune(shown, schema, "", [])
            return shown

        return to_hub, from_hub

    @staticmethod
    def _answer_in_view(obj: Any, from_hub: Callable[[Any], Any]) -> Any:
        """An answer (an object, a list of them, or a Status) in the version asked for."""
        if not isinstance(obj, dict) or obj.get("kind") == "Status":
            return obj
        if isinstance(obj.get("items"), list) and str(obj.get("kind", "")).endswith("List"):
            shown = from_hub({"apiVersion": obj.get("apiVersion")})
            return {**obj, "apiVersion": shown.get("apiVersion"),
                    "items": [from_hub(item) for item in obj["items"]]}
        return from_hub(obj)

    def _serve_as_given(self, record: RequestRecord, route: routing.Route) -> bool:
        """Answer with the body a test set for this object, unchecked; whether there was one."""
        key = (route.audit_resource, route.namespace or "", unquote(route.name or ""))
        body = self.server.as_given.get(key)
        if body is None:
            return False
        self.server.faults.set_status(record, 200)
        self._send(200, body, "application/json")
        return True

    def _serve_discovery(self, method: str, path: str) -> None:
        if method != "GET":
            raise page_not_found()
        if path in _HEALTH:
            self._send(200, b"ok", "text/plain; charset=utf-8")
            return
        doc = discovery.document(path, self.server.address, self.server.served)
        if doc is None:
            raise page_not_found()
        self._send_json(200, doc)
