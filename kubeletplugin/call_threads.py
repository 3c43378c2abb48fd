"""The threads gRPC's synchronous server runs the DRA socket's calls in, where the installed
grpcio lacks the core API :mod:`.core_server` is built on (which saves this server's hand-off
to a pool thread and back: 0.1-0.15 ms and ~0.14 ms of CPU per call).

A kubelet call runs start to end in one of these threads: checkpoint lookup, device work
(NVML, files, the durable commit) and the answer, with no hop to another thread; only the
GETs of a call with several claims go through the event loop. Measured, a do-nothing unary
call costs the sync server 0.335 ms of CPU and a 0.50 ms round trip against grpc.aio's
0.377 / 0.53, and the hop to a device thread and back that grpc.aio needed cost ~0.2 ms
more.

Not ``ThreadPoolExecutor``: its threads are not daemon threads and the interpreter joins
them at exit, so a call stuck in NVML or in a MIG operation would hold SIGTERM's exit up
past any bound. These are daemon threads; :meth:`CallThreads.close` is what waits, for as
long as the daemon chooses.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

R = TypeVar("R")

_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class CallThreads(Executor):
    """An executor of daemon threads: one starts when every one is busy, up to
    ``max_threads``, and then stays (a kubelet sends bursts; a thread costs a stack)."""

    def __init__(self, max_threads: int, *, name: str = "gpudra-call") -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self._max = max_threads
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._busy = 0  # jobs queued or running
        self._closed = False

    @property
    def started(self) -> int:
        """Threads started so far."""
        return len(self._threads)

    @property
    def max_threads(self) -> int:
        return self._max

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        future: Future[R] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the call threads are closed")
            self._busy += 1
            if self._busy > len(self._threads) and len(self._threads) < self._max:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}-{len(self._threads)}")
                try:
                    thread.start()
                except RuntimeError as exc:  # "can't start new thread": a pids limit
                    if not self._threads:
                        # Nobody would ever run it. Fail this job, not gRPC's serving
                        # thread (an exception from submit would end it for good).
                        self._busy -= 1
                        future.set_exception(exc)
                        return future
                    # The threads there are take it when one is free.
                else:
                    self._threads.append(thread)
        self._jobs.put((future, fn, args, kwargs))
        return future

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new jobs, let the ones given finish, end the threads; wait up to
        ``timeout`` seconds (None: for ever). True if every thread ended."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """``Executor.shutdown``: jobs already given always run (a call half done on a GPU
        is finished, not dropped), so ``cancel_futures`` changes nothing."""
        self.close(None if wait else 0.0)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args, kwargs = job
            del job  # nothing of a finished job stays referenced while the thread waits
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # the future's owner (gRPC) reports it
                    outcome: tuple[Any, BaseException | None] = (None, exc)
                    del exc
                else:
                    outcome = (result, None)
                    del result
                # Free before the future wakes anyone: a submit right after the answer
                # must find this thread idle, not start another.
                with self._lock:
                    self._busy -= 1
                if outcome[1] is not None:
                    future.set_exception(outcome[1])
                else:
                    future.set_result(outcome[0])
                del outcome
            else:
                with self._lock:
                    self._busy -= 1
            del future, fn, args, kwargs
