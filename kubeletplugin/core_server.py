"""The DRA socket's gRPC server: grpc core's completion queue, polled by the threads that
also run the calls.

gRPC's synchronous server has one thread poll the completion queue and hand each call to a
pool thread; that thread asks for the request, waits for the poller to hand it over, runs
the handler and gives the answer back to the poller to send: two wake-ups of another thread
per call. Here several threads poll the one queue, and the thread whose poll returns a
call's request runs the handler itself and starts the answer's send. Measured with a
do-nothing unary call between two processes (``bench.floors``, one run): round trip
0.56 -> 0.42 ms, server CPU 0.38 -> 0.24 ms per call.

A thread about to run a handler first makes sure another thread still polls, starting one
up to the limit; at the limit the last poller queues the call for the next thread that
finishes one, instead of running it, because a server stream waits for its sends to
complete and only a poller sees that. Threads beyond two spare pollers end after
:data:`SPARE_IDLE` seconds without work, so a burst reuses the threads of the one before.

Servers can share one queue and its threads (:class:`CallQueue`): the daemon serves its
registration socket beside the DRA socket that way, each server stopping on its own.

It serves what the node daemon registers: unary-unary and unary-stream methods, through
the same ``add_to_server`` code as ``grpc.server``; handlers get a context with
``is_active``, ``abort``, ``set_code``, ``set_details``, ``add_callback``,
``time_remaining``, ``invocation_metadata`` and ``peer``; statuses are those
``grpc.server`` sends. Anything else is UNIMPLEMENTED. It is built on
``grpc._cython.cygrpc``, the layer grpcio's own servers are built on; :func:`available`
says whether the installed grpcio has what it needs (if not, the daemon uses gRPC's
synchronous server).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn

import grpc
import structlog

try:
    from grpc._cython import cygrpc
except ImportError:  # pragma: no cover - a grpcio without its Cython core
    cygrpc = None

log = structlog.get_logger(__name__)

SPARE_POLLERS = 2
"""Threads that poll without running a call; more end once idle for :data:`SPARE_IDLE`
seconds (each idle poller wakes five times a second to let Python see signals)."""
SPARE_IDLE = 10.0
"""Seconds a poller beyond the spare ones waits for work before it ends: a burst of calls
reuses the threads the previous one started."""

_NEEDED = ("CompletionQueue", "Server", "CompletionType", "StatusCode", "CallError",
           "ReceiveMessageOperation", "ReceiveCloseOnServerOperation",
           "SendInitialMetadataOperation", "SendMessageOperation",
           "SendStatusFromServerOperation")

Job = Callable[[], None]


class _Idle:
    """What a poll returns when it waited its whole deadline."""


IDLE = _Idle()


def available() -> bool:
    """Whether the installed grpcio has the core API this server is built on."""
    return cygrpc is not None and all(hasattr(cygrpc, name) for name in _NEEDED)


class _Abort(Exception):
    """Raised by :meth:`CallContext.abort`; ends the call with ``code`` and ``details``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _HandlerCallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]
    def __init__(self, method: str, invocation_metadata: Sequence[tuple[str, Any]]) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


class CallServer:
    """A gRPC server whose calls run in the threads that poll its completion queue.

    The ``grpc.Server`` subset the daemon uses: ``add_generic_rpc_handlers``,
    ``add_registered_method_handlers``, ``add_insecure_port``, ``start``, ``stop`` (an
    event set once every call ended); and :meth:`close`, which waits for the threads.
    """

    def __init__(self, max_threads: int = 1, *, name: str = "gpudra-call",
                 spare_idle: float = SPARE_IDLE, queue: CallQueue | None = None) -> None:
        """``queue``: share another server's queue and threads (``max_threads``, ``name``
        and ``spare_idle`` are the queue's then); else this server has its own."""
        if not available():
            raise RuntimeError("this grpcio lacks the core API CallServer needs")
        self.queue = queue if queue is not None else CallQueue(
            max_threads, name=name, spare_idle=spare_idle)
        self.queue.attach()
        self._cq = self.queue.cq
        self._server = cygrpc.Server((), False)
        self._server.register_completion_queue(self._cq)
        self._registered: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []
        self._lock = threading.Lock()
        self._calls: set[_Call] = set()
        self._stage = "new"  # new, started, stopping, stopped
        self._request_due = False
        self._shutdown_done = False
        self._stopped: list[threading.Event] = []

    @property
    def threads_started(self) -> int:
        """Threads started so far, ended ones included (the queue's)."""
        return self.queue.threads_started

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(
            self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            self._registered[f"/{service}/{name}"] = handler

    def add_insecure_port(self, address: str) -> int:
        """Listen on ``address``; RuntimeError if it cannot (as ``grpc.server`` raises: gRPC
        core only answers port 0)."""
        port = int(self._server.add_http2_port(address.encode()))
        if port == 0:
            raise RuntimeError(f"Failed to bind to address {address}")
        return port

    def start(self) -> None:
        with self._lock:
            if self._stage != "new":
                raise RuntimeError("CallServer.start() called twice")
            self._server.start()
            self._stage = "started"
            self._request_call()
        if not self.queue.start():
            self.stop(None)
            raise RuntimeError("cannot start a thread to serve gRPC calls")

    def stop(self, grace: float | None) -> threading.Event:
        """Take no new calls; cancel the ones in flight after ``grace`` seconds (None: at
        once). The event is set once every call ended; handlers may still be running."""
        stopped = threading.Event()
        with self._lock:
            if self._stage in {"stopped", "new"}:
                if self._stage == "new":
                    self.queue.release()
                self._stage = "stopped"
                stopped.set()
                return stopped
            self._stopped.append(stopped)
            if self._stage == "started":
                self._stage = "stopping"
                self._server.shutdown(self._cq, self._on_shutdown)
        if grace is None:
            self._cancel_all()
        else:
            threading.Thread(target=self._cancel_after, args=(stopped, grace), daemon=True,
                             name="gpudra-call-grace").start()
        return stopped

    def close(self, timeout: float | None = None) -> bool:
        """After :meth:`stop` of every server on the queue: see :meth:`CallQueue.close`."""
        return self.queue.close(timeout)

    # -- in the polling threads ---------------------------------------------------------

    def _request_call(self) -> None:  # under self._lock
        self._server.request_call(self._cq, self._cq, self._on_request_call)
        self._request_due = True

    def _on_request_call(self, event: Any) -> Job | None:
        with self._lock:
            self._request_due = False
            if self._stage == "started":
                self._request_call()
            if not event.success:  # the server is shutting down
                self._finish_stop()
                return None
            method = event.call_details.method.decode("utf-8", "replace")
            call = _Call(self, event, method)
            self._calls.add(call)
        try:
            handler = self._handler(method, event.invocation_metadata)
        except Exception:
            log.exception("gRPC handler lookup failed", method=method)
            call.reject(grpc.StatusCode.UNKNOWN, "Error in service handler!")
            return None
        if handler is None or handler.request_streaming:
            call.reject(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        else:
            call.begin(handler)
        return None

    def _handler(self, method: str, metadata: Sequence[tuple[str, Any]],
                 ) -> grpc.RpcMethodHandler | None:
        handler = self._registered.get(method)
        if handler is not None:
            return handler
        details = _HandlerCallDetails(method, metadata)
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    def _call_ended(self, call: _Call) -> None:
        with self._lock:
            self._calls.discard(call)
            self._finish_stop()

    def _on_shutdown(self, event: Any) -> None:
        with self._lock:
            self._shutdown_done = True
            self._finish_stop()

    def _finish_stop(self) -> None:  # under self._lock
        if (self._stage != "stopping" or not self._shutdown_done or self._calls
                or self._request_due):
            return
        self._stage = "stopped"
        self._server.destroy()
        self.queue.release()
        for stopped in self._stopped:
            stopped.set()

    def _cancel_after(self, stopped: threading.Event, grace: float) -> None:
        if not stopped.wait(grace):
            self._cancel_all()

    def _cancel_all(self) -> None:
        with self._lock:
            if self._stage == "stopping":
                self._server.cancel_all_calls()


class CallQueue:
    """A completion queue and the threads that poll it and run its calls, for the servers
    attached to it; shut down once the last of them stopped.

    A process serves all its sockets from one queue: with gRPC's socket polling in the
    queue's threads (:mod:`.grpc_env`), every thread polling any queue takes part in the
    same polling, so a second queue's threads would pick up this one's socket events and
    hand them over (measured: a do-nothing call's server CPU 0.20 -> 0.26 ms with an idle
    second queue in the process).
    """

    def __init__(self, max_threads: int, *, name: str = "gpudra-call",
                 spare_idle: float = SPARE_IDLE) -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self.cq = cygrpc.CompletionQueue()
        self._threads = _Pollers(self._poll, max_threads, name, spare_idle)
        self._lock = threading.Lock()
        self._servers = 0  # attached and not stopped
        self._started = False
        self._shut = False

    @property
    def threads_started(self) -> int:
        """Threads started so far, ended ones included."""
        return self._threads.started

    def attach(self) -> None:
        """A server uses the queue until it calls :meth:`release`."""
        with self._lock:
            if self._shut:
                raise RuntimeError("the completion queue is shut down")
            self._servers += 1

    def start(self) -> bool:
        """Start the pollers (once); False if not even one could start."""
        with self._lock:
            if self._started:
                return True
            self._started = self._threads.start(SPARE_POLLERS)
            return self._started

    def release(self) -> None:
        """A server stopped: after the last one, shut the queue (each poller's next poll
        says so, and it ends)."""
        with self._lock:
            self._servers -= 1
            if self._servers > 0 or self._shut:
                return
            self._shut = True
        self.cq.shutdown()

    def close(self, timeout: float | None = None) -> bool:
        """After every server on the queue stopped: wait up to ``timeout`` seconds (None:
        for ever) for every thread to end, handlers still running included. True if they
        all did, or if no handler runs any more (the pollers end as soon as they see the
        queue shut)."""
        return self._threads.join(timeout) or self._threads.idle()

    def _poll(self, deadline: float) -> Job | _Idle | None:
        """Wait until ``deadline`` (``time.time()``) for one event and handle it; a job to
        run means a handler is due. Raises :class:`_QueueShutdown` when the queue is done."""
        event = self.cq.poll(deadline)
        kind = event.completion_type
        if kind == cygrpc.CompletionType.queue_timeout:
            return IDLE
        if kind == cygrpc.CompletionType.queue_shutdown:
            raise _QueueShutdown
        tag: Callable[[Any], Job | None] = event.tag
        try:
            return tag(event)
        except Exception:  # a bug here; the thread must go on polling
            log.exception("gRPC event handling failed")
            return None


class _QueueShutdown(Exception):
    """The completion queue is shut down: the polling thread ends."""


class _Pollers:
    """The threads polling the queue, and the rule that one always does.

    ``polling`` counts threads in the poll loop (not in a handler). A thread leaves to run
    a handler only while another polls or one can be started; otherwise the job waits in
    ``pending`` for the next thread that finishes a handler.
    """

    def __init__(self, poll: Callable[[float], Job | _Idle | None], max_threads: int,
                 name: str, spare_idle: float) -> None:
        self._poll = poll
        self._spare_idle = spare_idle
        self._max = max_threads + 1  # the handlers' threads, and one that always polls
        self._name = name
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()  # alive
        self._started = 0
        self._polling = 0
        self._pending: collections.deque[Job] = collections.deque()

    @property
    def started(self) -> int:
        return self._started

    def start(self, count: int) -> bool:
        """Start ``count`` pollers; False if not even one could start."""
        with self._lock:
            return sum(self._spawn() for _ in range(count)) > 0

    def join(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    def idle(self) -> bool:
        """No handler runs and none waits for a thread."""
        with self._lock:
            return self._polling == len(self._threads) and not self._pending

    def _spawn(self, first: Job | None = None) -> bool:  # under self._lock
        """Start a thread: a poller, or one that runs ``first`` and then polls."""
        thread = threading.Thread(target=self._run, args=(first,), daemon=True,
                                  name=f"{self._name}-{self._started}")
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": a pids limit
            return False
        self._threads.add(thread)
        self._started += 1
        if first is None:
            self._polling += 1
        return True

    def _run(self, job: Job | None) -> None:
        polling = job is None  # whether this thread is counted in self._polling
        ended = True  # False: it ended as a spare poller, with nothing queued
        try:
            while True:
                if job is None:
                    polled = self._poll(time.time() + self._spare_idle)
                    if isinstance(polled, _Idle):
                        if self._end_spare():
                            polling = ended = False  # counted out already
                            return
                        continue
                    if polled is None or not self._leave(polled):
                        continue
                    job, polling = polled, False
                while job is not None:
                    _run_job(job)
                    job = self._back()
                polling = True
        except (_QueueShutdown, SystemExit):
            pass  # (a handler's SystemExit ends its thread, as threading's hook would)
        finally:
            # Also when a handler raised past _run_job (a BaseException): the counts stay
            # true, and a queued call gets a thread of its own.
            with self._lock:
                if polling:
                    self._polling -= 1
                self._threads.discard(threading.current_thread())
                if self._pending and not polling and ended:
                    self._spawn(self._pending.popleft())

    def _leave(self, job: Job) -> bool:
        """Stop polling to run ``job``; False: it was queued (this is the last poller)."""
        with self._lock:
            if (self._polling > 1 or (len(self._threads) < self._max and self._spawn())
                    or len(self._threads) == 1):
                # (a single thread: none could be started and none would come back for a
                # queued job, so this one runs it, with nobody polling meanwhile.)
                self._polling -= 1
                return True
            self._pending.append(job)
            return False

    def _back(self) -> Job | None:
        """A handler finished: the next queued job, or None to poll again."""
        with self._lock:
            if self._pending:
                return self._pending.popleft()
            self._polling += 1
            return None

    def _end_spare(self) -> bool:
        """An idle poller ends if more than the spare ones poll."""
        with self._lock:
            if self._polling > SPARE_POLLERS:
                self._polling -= 1
                self._threads.discard(threading.current_thread())
                return True
            return False


def _run_job(job: Job) -> None:
    try:
        job()
    except Exception:  # a call's own errors are its status; this is a bug here
        log.exception("gRPC call handling failed")


class _Call:
    """One call's state: its batches in flight, whether it ended or was cancelled.

    Batches start outside the lock: gRPC may complete one in another thread at once, and
    that thread must not wait for this one. A batch is counted under the lock before it
    starts, so the call cannot look ended (and the server cannot be destroyed) meanwhile.
    """

    def __init__(self, server: CallServer, event: Any, method: str) -> None:
        self._server = server
        self._call = event.call
        self.method = method
        self.deadline: float = event.call_details.deadline
        self.metadata: Sequence[tuple[str, Any]] = event.invocation_metadata
        self._handler: grpc.RpcMethodHandler | None = None
        self._changed = threading.Condition(threading.Lock())
        self._batches = 0  # counted and not completed; -1 once the server was told
        self._closed = False  # the call ended (answered or cancelled)
        self._metadata_sent = False
        self._status_sent = False
        self._sending = False
        self._callbacks: list[Callable[[], None]] = []
        self.code = grpc.StatusCode.OK  # what the handler set (context.set_code)
        self.details = ""

    # -- handler side ------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return not self._closed

    def peer(self) -> str:
        return str(self._call.peer().decode("utf-8", "replace"))

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._changed:
            if self._closed:
                return False
            self._callbacks.append(callback)
            return True

    def begin(self, handler: grpc.RpcMethodHandler) -> None:
        """Ask for the request, and for the call's end (to see a cancellation at once)."""
        self._handler = handler
        with self._changed:
            self._batches += 2
        self._start((cygrpc.ReceiveCloseOnServerOperation(0),), self._on_close)
        self._start((cygrpc.ReceiveMessageOperation(0),), self._on_message)

    def reject(self, code: grpc.StatusCode, details: str) -> None:
        with self._changed:
            self._batches += 2
            status = self._status(code, details, None)
        self._start((cygrpc.ReceiveCloseOnServerOperation(0),), self._on_close)
        self._start(status, self._on_sent)

    def _respond(self, data: bytes) -> None:
        handler = self._handler
        assert handler is not None
        if self._closed:  # cancelled (its deadline passed) while it waited for a thread
            return
        try:
            request = handler.request_deserializer(data) if handler.request_deserializer \
                else data
        except Exception:
            log.exception("cannot decode a gRPC request", method=self.method)
            self._finish(grpc.StatusCode.INTERNAL, "Exception deserializing request!")
            return
        context = CallContext(self)
        try:
            if handler.unary_unary is not None:
                answer = self._serialized(handler, handler.unary_unary(request, context))
                if answer is not None:
                    self._finish(self.code, self.details, answer)
            else:
                self._stream(handler, handler.unary_stream(request, context))
        except _Abort as abort:
            self._finish(abort.code, abort.details)
        except BaseException as exc:
            log.exception("gRPC handler failed", method=self.method)
            what = "calling application" if handler.unary_unary is not None \
                else "iterating responses"
            self._finish(grpc.StatusCode.UNKNOWN, f"Exception {what}: {exc}")
            if not isinstance(exc, Exception):
                raise

    def _stream(self, handler: grpc.RpcMethodHandler, responses: Iterator[Any]) -> None:
        try:
            for response in responses:
                answer = self._serialized(handler, response)
                if answer is None or not self._send(answer):
                    return
            self._finish(self.code, self.details)
        finally:
            close = getattr(responses, "close", None)
            if close is not None:
                close()

    def _serialized(self, handler: grpc.RpcMethodHandler, response: Any) -> bytes | None:
        try:
            answer = handler.response_serializer(response) \
                if handler.response_serializer else response
            if not isinstance(answer, bytes):
                raise TypeError(f"a response serialized to {type(answer).__name__}, not bytes")
            return answer
        except Exception:
            log.exception("cannot encode a gRPC response", method=self.method)
            self._finish(grpc.StatusCode.INTERNAL, "Failed to serialize response!")
            return None

    def _send(self, message: bytes) -> bool:
        """Send one stream message and wait until it went; False: the call ended."""
        with self._changed:
            if self._closed:
                return False
            operations: list[Any] = []
            if not self._metadata_sent:
                operations.append(cygrpc.SendInitialMetadataOperation(None, 0))
                self._metadata_sent = True
            operations.append(cygrpc.SendMessageOperation(message, 0))
            self._sending = True
            self._batches += 1
        self._start(tuple(operations), self._on_sent)
        with self._changed:
            self._changed.wait_for(lambda: not self._sending or self._closed)
            return not self._closed

    def _finish(self, code: grpc.StatusCode, details: str, answer: bytes | None = None,
                ) -> None:
        """Send the status (and the answer) unless the call ended or has one already."""
        with self._changed:
            if self._closed or self._status_sent:
                return
            self._batches += 1
            status = self._status(code, details, answer)
        self._start(status, self._on_sent)

    def _status(self, code: grpc.StatusCode, details: str, answer: bytes | None,
                ) -> tuple[Any, ...]:
        """The operations that end the call (under ``self._changed``)."""
        operations: list[Any] = []
        if not self._metadata_sent:
            operations.append(cygrpc.SendInitialMetadataOperation(None, 0))
            self._metadata_sent = True
        if answer is not None:
            operations.append(cygrpc.SendMessageOperation(answer, 0))
        operations.append(cygrpc.SendStatusFromServerOperation(
            None, code.value[0], details.encode("utf-8"), 0))
        self._status_sent = True
        return tuple(operations)

    def _start(self, operations: tuple[Any, ...], tag: Callable[[Any], Job | None]) -> None:
        """Start a batch already counted in ``self._batches``."""
        try:
            error = self._call.start_server_batch(operations, tag)
            if error != cygrpc.CallError.ok:
                raise RuntimeError(f"gRPC refused the batch: call error {error}")
        except Exception:
            log.exception("cannot start a gRPC batch", method=self.method)
            with self._changed:
                ended = self._completed(close=True)
            if ended:
                self._server._call_ended(self)

    # -- in the polling threads: a batch completed --------------------------------------

    def _on_message(self, event: Any) -> Job | None:
        data = event.batch_operations[0].message()
        status = None
        with self._changed:
            ended = self._completed()
            closed = self._closed
            if data is None and not closed:
                self._batches += 1
                status = self._status(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f'"{self.method}" requires exactly one request message.', None)
        if status is not None:
            self._start(status, self._on_sent)
        if ended:
            self._server._call_ended(self)
        # A call already cancelled runs no handler (as with grpc.server).
        return None if data is None or closed else lambda: self._respond(data)

    def _on_sent(self, event: Any) -> Job | None:
        with self._changed:
            self._sending = False
            ended = self._completed()
        if ended:
            self._server._call_ended(self)
        return None

    def _on_close(self, event: Any) -> Job | None:
        with self._changed:
            callbacks, self._callbacks = self._callbacks, []
            ended = self._completed(close=True)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("gRPC call callback failed", method=self.method)
        if ended:
            self._server._call_ended(self)
        return None

    def _completed(self, *, close: bool = False) -> bool:
        """Count one batch as done (``close``: the call ended with it) and wake whoever
        waits on the call; then :meth:`_ended` (under ``self._changed``)."""
        self._batches -= 1
        if close:
            self._closed = True
        self._changed.notify_all()
        return self._ended()

    def _ended(self) -> bool:
        """Whether nothing of this call is pending in gRPC any more, the first time it is
        so (under ``self._changed``)."""
        if self._batches == 0 and self._closed:
            self._batches = -1
            return True
        return False


class CallContext:
    """What a handler gets as its context: the ``grpc.ServicerContext`` calls the
    daemon's servicers make."""

    def __init__(self, call: _Call) -> None:
        self._call = call

    def is_active(self) -> bool:
        return self._call.active

    def time_remaining(self) -> float:
        return max(self._call.deadline - time.time(), 0.0)

    def invocation_metadata(self) -> Sequence[tuple[str, Any]]:
        return self._call.metadata

    def peer(self) -> str:
        return self._call.peer()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` when the call ends; False if it already has."""
        return self._call.add_callback(callback)

    def set_code(self, code: grpc.StatusCode) -> None:
        """The status the call ends with when the handler returns."""
        self._call.code = code

    def set_details(self, details: str) -> None:
        self._call.details = details

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        if code == grpc.StatusCode.OK:  # not an abort: grpc.server makes it UNKNOWN, too
            code, details = grpc.StatusCode.UNKNOWN, ""
        raise _Abort(code, details)
