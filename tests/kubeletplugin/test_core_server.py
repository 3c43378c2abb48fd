"""The DRA socket's completion-queue server over real gRPC on a unix socket: calls answered
in the polling threads, at once up to the limit; statuses as ``grpc.server`` gives them;
the handler's context; server streams; the rule that one thread always polls; stop/close;
and the fallback to gRPC's synchronous server."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc._cython import cygrpc

from gpudra.api.proto import dra_v1_pb2, dra_v1_pb2_grpc, registration_pb2, registration_pb2_grpc
from gpudra.kubeletplugin import core_server
from gpudra.kubeletplugin import server as plugin_server
from gpudra.kubeletplugin.call_threads import CallThreads
from gpudra.kubeletplugin.core_server import SPARE_POLLERS, CallQueue, CallServer
from gpudra.kubeletplugin.dra_service import ClaimCalls, DraV1Servicer
from gpudra.kubeletplugin.registration import RegistrationServicer, RegistrationState
from tests.kubeletplugin.conftest import TestPreparer

SERVICE = "test.Core"
WAIT = 5.0
"""Seconds any wait in these tests gives up after: a broken server fails, never hangs."""

Handler = Callable[[Any, Any], Any]
_names = itertools.count()


@dataclass
class Served:
    """A started :class:`CallServer` on a unix socket, and a channel to it."""

    server: CallServer
    channel: grpc.Channel
    socket: Path
    name: str

    def unary(self, method: str, request: bytes = b"", **kwargs: Any) -> Any:
        return self.channel.unary_unary(f"/{SERVICE}/{method}")(
            request, timeout=kwargs.pop("timeout", WAIT), **kwargs)

    def unary_future(self, method: str, request: bytes = b"", **kwargs: Any) -> Any:
        return self.channel.unary_unary(f"/{SERVICE}/{method}").future(
            request, timeout=kwargs.pop("timeout", WAIT), **kwargs)

    def stream(self, method: str, request: bytes = b"", **kwargs: Any) -> Any:
        return self.channel.unary_stream(f"/{SERVICE}/{method}")(
            request, timeout=kwargs.pop("timeout", WAIT), **kwargs)

    def live_threads(self) -> int:
        return sum(t.name.startswith(f"{self.name}-") for t in threading.enumerate())


Serve = Callable[..., Served]


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path is often too deep.
    root = Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def serve(socket_dir: Path) -> Iterator[Serve]:
    """Start a server with the given handlers; stopped and closed (all threads ended) on
    the way out."""
    started: list[Served] = []

    def start(unary: dict[str, Handler] | None = None, *,
              streams: dict[str, Handler] | None = None,
              handlers: dict[str, grpc.RpcMethodHandler] | None = None,
              registered: dict[str, grpc.RpcMethodHandler] | None = None,
              generic: tuple[grpc.GenericRpcHandler, ...] = (),
              max_threads: int = 4, spare_idle: float = core_server.SPARE_IDLE,
              queue: CallQueue | None = None) -> Served:
        name = f"core-test-{next(_names)}"
        server = CallServer(max_threads, name=name, spare_idle=spare_idle, queue=queue)
        methods: dict[str, grpc.RpcMethodHandler] = {
            **{m: grpc.unary_unary_rpc_method_handler(h) for m, h in (unary or {}).items()},
            **{m: grpc.unary_stream_rpc_method_handler(h) for m, h in (streams or {}).items()},
            **(handlers or {}),
        }
        server.add_generic_rpc_handlers(generic)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, methods)])
        if registered:
            server.add_registered_method_handlers(SERVICE, registered)
        socket = socket_dir / f"{len(started)}.sock"
        assert server.add_insecure_port(f"unix:{socket}") == 1
        served = Served(server, grpc.insecure_channel(f"unix:{socket}"), socket, name)
        started.append(served)
        server.start()
        return served

    try:
        yield start
    finally:
        # All stopped before any is closed: servers sharing a queue end its threads together.
        for served in started:
            served.channel.close()
            assert served.server.stop(None).wait(WAIT)
        for served in started:
            assert served.server.close(WAIT), "a call's thread outlived the test"


class Held:
    """A handler that says when it runs, then answers ``answer`` once released (at the
    latest after :data:`WAIT`)."""

    def __init__(self, answer: bytes = b"") -> None:
        self.answer = answer
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, request: bytes, context: Any) -> bytes:
        self.entered.set()
        self.release.wait(WAIT)
        return self.answer


def echo(request: bytes, context: Any) -> bytes:
    return b"echo:" + request


def where(request: bytes, context: Any) -> bytes:
    return threading.current_thread().name.encode()


def prepare_one(channel: grpc.Channel) -> Any:
    """A v1 ``NodePrepareResources`` of claim uid-1, as the kubelet sends it."""
    stub = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
    return stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[dra_v1_pb2.Claim(namespace="ns", name="claim-1", uid="uid-1")]), timeout=WAIT)


def failure(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


# -- 1. unary calls, at once --------------------------------------------------------------


def test_a_unary_call_is_answered_in_one_of_the_servers_threads(serve: Serve) -> None:
    served = serve({"Echo": echo, "Where": where})
    assert served.unary("Echo", b"hi") == b"echo:hi"
    assert served.unary("Where").decode().startswith(f"{served.name}-")


def test_many_calls_from_several_client_threads_are_all_answered(serve: Serve) -> None:
    served = serve({"Echo": echo}, max_threads=4)
    requests = [str(n).encode() for n in range(200)]
    with ThreadPoolExecutor(8) as clients:
        answers = list(clients.map(lambda r: served.unary("Echo", r), requests))
    assert answers == [b"echo:" + r for r in requests]


def test_handlers_run_at_once_up_to_max_threads(serve: Serve) -> None:
    # Each handler waits for all the others: they finish only if N threads run them at once.
    count = 6
    barrier = threading.Barrier(count, timeout=WAIT)

    def meet(request: bytes, context: Any) -> bytes:
        return str(barrier.wait()).encode()

    served = serve({"Meet": meet}, max_threads=count)
    futures = [served.unary_future("Meet") for _ in range(count)]
    assert sorted(int(f.result(WAIT)) for f in futures) == list(range(count))
    assert served.server.threads_started >= count + 1  # one more kept polling


def test_calls_beyond_max_threads_wait_for_a_thread(serve: Serve) -> None:
    running, most = 0, 0
    lock = threading.Lock()
    release = threading.Event()
    two_in = threading.Semaphore(0)

    def busy(request: bytes, context: Any) -> bytes:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        two_in.release()
        release.wait(WAIT)
        with lock:
            running -= 1
        return request

    served = serve({"Busy": busy}, max_threads=2)
    futures = [served.unary_future("Busy", str(n).encode()) for n in range(5)]
    assert two_in.acquire(timeout=WAIT) and two_in.acquire(timeout=WAIT)
    assert not two_in.acquire(timeout=0.2)  # the third waits for one of the two
    release.set()
    assert [f.result(WAIT) for f in futures] == [str(n).encode() for n in range(5)]
    assert most == 2


# -- 2. handlers: registered, generic, unknown ---------------------------------------------


def test_the_generated_dra_v1_servicer_serves_through_registered_handlers(socket_dir: Path) -> None:
    preparer = TestPreparer()
    server = CallServer(2, name="core-test-dra")
    DraV1Servicer(ClaimCalls(preparer)).add_to_server(server)
    server.add_insecure_port(f"unix:{socket_dir}/dra.sock")
    server.start()
    try:
        with grpc.insecure_channel(f"unix:{socket_dir}/dra.sock") as channel:
            answer = prepare_one(channel)
            assert answer.claims["uid-1"].error == ""
            assert [d.device_name for d in answer.claims["uid-1"].devices] == ["gpu-0"]
            assert [c.uid for c in preparer.prepared[0]] == ["uid-1"]
    finally:
        assert server.stop(None).wait(WAIT)
        assert server.close(WAIT)


def test_registered_handlers_alone_serve(serve: Serve) -> None:
    served = serve(registered={"Echo": grpc.unary_unary_rpc_method_handler(echo)})
    assert served.unary("Echo", b"r") == b"echo:r"


def test_an_unknown_method_is_unimplemented(serve: Serve) -> None:
    served = serve({"Echo": echo})
    error = failure(lambda: served.unary("Nope"))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    error = failure(lambda: served.channel.unary_unary("/other.Service/Echo")(b"", timeout=WAIT))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert served.unary("Echo", b"still") == b"echo:still"


def test_client_streaming_methods_are_unimplemented(serve: Serve) -> None:
    served = serve(handlers={
        "Sum": grpc.stream_unary_rpc_method_handler(lambda requests, context: b"sum"),
        "Chat": grpc.stream_stream_rpc_method_handler(lambda requests, context: iter([b"x"])),
    })
    error = failure(lambda: served.channel.stream_unary(f"/{SERVICE}/Sum")(
        iter([b"a", b"b"]), timeout=WAIT))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    error = failure(lambda: list(served.channel.stream_stream(f"/{SERVICE}/Chat")(
        iter([b"a"]), timeout=WAIT)))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_unary_method_called_without_a_request_is_unimplemented(serve: Serve) -> None:
    ran = threading.Event()

    def handler(request: bytes, context: Any) -> bytes:
        ran.set()
        return b""

    served = serve({"Once": handler})
    error = failure(lambda: served.channel.stream_unary(f"/{SERVICE}/Once")(
        iter(()), timeout=WAIT))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "requires exactly one request message" in (error.details() or "")
    assert not ran.is_set()


# -- 3. statuses ---------------------------------------------------------------------------


def test_a_handler_that_raises_gives_unknown_and_its_message(serve: Serve) -> None:
    def broken(request: bytes, context: Any) -> bytes:
        raise ValueError("the GPU fell off")

    served = serve({"Broken": broken, "Echo": echo}, max_threads=1)
    error = failure(lambda: served.unary("Broken"))
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert error.details() == "Exception calling application: the GPU fell off"
    assert served.unary("Echo", b"after") == b"echo:after"  # the thread went on


def test_abort_gives_its_code_and_details_and_ok_becomes_unknown(serve: Serve) -> None:
    def abort(request: bytes, context: Any) -> bytes:
        context.abort(grpc.StatusCode[request.decode()], "claim uid-1: no such device")
        raise AssertionError("abort returned")

    served = serve({"Abort": abort})
    error = failure(lambda: served.unary("Abort", b"FAILED_PRECONDITION"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details() == "claim uid-1: no such device"
    error = failure(lambda: served.unary("Abort", b"OK"))
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert error.details() == ""  # as grpc.server: an abort with OK is no status to send


def test_a_request_that_fails_to_decode_gives_internal(serve: Serve) -> None:
    ran = threading.Event()

    def undecodable(data: bytes) -> bytes:
        raise ValueError("garbage")

    served = serve(handlers={"Decode": grpc.unary_unary_rpc_method_handler(
        lambda request, context: ran.set(), request_deserializer=undecodable)})
    error = failure(lambda: served.unary("Decode", b"\xff"))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert error.details() == "Exception deserializing request!"
    assert not ran.is_set()


def test_a_response_that_fails_to_encode_gives_internal(serve: Serve) -> None:
    def unencodable(answer: object) -> bytes:
        raise TypeError("not bytes")

    handler = grpc.unary_unary_rpc_method_handler(
        lambda request, context: object(), response_serializer=unencodable)
    stream = grpc.unary_stream_rpc_method_handler(
        lambda request, context: iter([object()]), response_serializer=unencodable)
    served = serve(handlers={"Encode": handler, "EncodeStream": stream})
    error = failure(lambda: served.unary("Encode"))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert error.details() == "Failed to serialize response!"
    error = failure(lambda: list(served.stream("EncodeStream")))
    assert error.code() == grpc.StatusCode.INTERNAL


# -- 4. the handler's context -------------------------------------------------------------


def test_context_in_a_normal_call(serve: Serve) -> None:
    seen: dict[str, Any] = {}
    ended = threading.Event()

    def look(request: bytes, context: Any) -> bytes:
        seen["active"] = context.is_active()
        seen["remaining"] = context.time_remaining()
        seen["metadata"] = dict(context.invocation_metadata())
        seen["peer"] = context.peer()
        seen["callback"] = context.add_callback(ended.set)
        return b""

    served = serve({"Look": look})
    served.unary("Look", timeout=3.0, metadata=(("x-claim", "uid-7"),))
    assert seen["active"] is True
    assert 2.0 < seen["remaining"] <= 3.1  # the timeout travels rounded up
    assert seen["metadata"]["x-claim"] == "uid-7"
    assert isinstance(seen["peer"], str) and seen["peer"]
    assert seen["callback"] is True
    assert ended.wait(WAIT)  # the callback runs once the call ended


def test_a_cancelled_call_turns_inactive_runs_its_callbacks_and_refuses_new_ones(
        serve: Serve) -> None:
    entered, callback_ran, done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def wait_for_cancel(request: bytes, context: Any) -> bytes:
        context.add_callback(callback_ran.set)
        entered.set()
        deadline = time.monotonic() + WAIT
        while context.is_active() and time.monotonic() < deadline:
            time.sleep(0.005)
        seen["active"] = context.is_active()
        seen["callback_ran"] = callback_ran.is_set()
        seen["late_callback"] = context.add_callback(lambda: None)
        done.set()
        return b""

    served = serve({"Wait": wait_for_cancel})
    future = served.unary_future("Wait")
    assert entered.wait(WAIT)
    assert future.cancel()
    assert done.wait(WAIT)
    assert seen == {"active": False, "callback_ran": True, "late_callback": False}


def test_a_client_timeout_turns_the_call_inactive(serve: Serve) -> None:
    done = threading.Event()
    seen: dict[str, Any] = {}

    def outlive(request: bytes, context: Any) -> bytes:
        deadline = time.monotonic() + WAIT
        while context.is_active() and time.monotonic() < deadline:
            time.sleep(0.005)
        seen["active"] = context.is_active()
        seen["remaining"] = context.time_remaining()
        done.set()
        return b""

    served = serve({"Outlive": outlive})
    error = failure(lambda: served.unary("Outlive", timeout=0.2))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert done.wait(WAIT)
    assert seen == {"active": False, "remaining": 0.0}


# -- 5. server streams --------------------------------------------------------------------


def test_a_stream_sends_its_messages_in_order_then_ok(serve: Serve) -> None:
    def count(request: bytes, context: Any) -> Iterator[bytes]:
        for n in range(int(request)):
            yield str(n).encode()

    served = serve(streams={"Count": count})
    call = served.stream("Count", b"50")
    assert list(call) == [str(n).encode() for n in range(50)]
    assert call.code() == grpc.StatusCode.OK
    assert list(served.stream("Count", b"0")) == []


def test_a_stream_the_client_cancels_closes_its_generator_and_frees_the_thread(
        serve: Serve) -> None:
    closed = threading.Event()

    def forever(request: bytes, context: Any) -> Iterator[bytes]:
        try:
            for n in itertools.count():
                yield str(n).encode()
                time.sleep(0.005)
        finally:
            closed.set()

    kept: list[Iterator[bytes]] = []  # a generator nobody holds closes anyway when dropped

    def keep(request: bytes, context: Any) -> Iterator[bytes]:
        kept.append(forever(request, context))
        return kept[-1]

    served = serve({"Where": where}, streams={"Forever": keep}, max_threads=1)
    call = served.stream("Forever")
    assert next(call) == b"0"
    call.cancel()
    assert closed.wait(WAIT)
    # The one call thread is free again.
    assert served.unary("Where", timeout=2.0).decode().startswith(served.name)


def test_a_stream_that_aborts_midway_gives_its_status_after_its_messages(serve: Serve) -> None:
    def partial(request: bytes, context: Any) -> Iterator[bytes]:
        yield b"first"
        yield b"second"
        context.abort(grpc.StatusCode.DATA_LOSS, "health source gone")

    def raising(request: bytes, context: Any) -> Iterator[bytes]:
        yield b"only"
        raise OSError("nvml gone")

    served = serve(streams={"Partial": partial, "Raising": raising})
    call = served.stream("Partial")
    assert next(call) == b"first" and next(call) == b"second"
    error = failure(lambda: next(call))
    assert error.code() == grpc.StatusCode.DATA_LOSS
    assert error.details() == "health source gone"
    call = served.stream("Raising")
    assert next(call) == b"only"
    error = failure(lambda: next(call))
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert error.details() == "Exception iterating responses: nvml gone"  # as grpc.server


# -- 6. one thread always polls; spare threads end ------------------------------------------


def test_a_call_queued_for_the_only_thread_leaves_a_poller_for_the_streams_sends(
        serve: Serve) -> None:
    # One call thread, busy with a stream. A unary call arriving meanwhile must wait in the
    # queue while the other thread goes on polling: the stream's sends complete only when
    # someone polls. Had that thread left to run the unary handler (which waits for the
    # stream to get on), nobody would poll: the stream stalls until the handler gives up,
    # and the handler answers "late".
    unary_seen = threading.Event()
    stream_went_on = threading.Event()

    class Spy(grpc.GenericRpcHandler):  # type: ignore[misc]
        """Flags the unary call's arrival (its handler is looked up as it arrives)."""

        def service(self, details: Any) -> None:
            if details.method.endswith("/Late"):
                unary_seen.set()

    def late(request: bytes, context: Any) -> bytes:
        return b"ok" if stream_went_on.wait(2.0) else b"late"

    def stream(request: bytes, context: Any) -> Iterator[bytes]:
        yield b"start"
        assert unary_seen.wait(WAIT)
        for n in range(10):  # ~0.1 s of sends, each waiting for its completion
            time.sleep(0.01)
            yield str(n).encode()
        stream_went_on.set()
        yield b"end"

    served = serve({"Late": late}, streams={"Stream": stream}, generic=(Spy(),),
                   max_threads=1)
    call = served.stream("Stream", timeout=4.0)
    assert next(call) == b"start"
    unary = served.unary_future("Late", timeout=4.0)
    assert list(call) == [str(n).encode() for n in range(10)] + [b"end"]
    assert unary.result(WAIT) == b"ok"
    assert served.server.threads_started == SPARE_POLLERS  # none beyond the limit


def test_threads_beyond_the_spare_pollers_end_once_idle(serve: Serve) -> None:
    count = 8
    barrier = threading.Barrier(count, timeout=WAIT)

    def meet(request: bytes, context: Any) -> bytes:
        barrier.wait()
        return b""

    served = serve({"Meet": meet}, max_threads=count, spare_idle=0.5)
    assert served.server.threads_started == SPARE_POLLERS
    futures = [served.unary_future("Meet") for _ in range(count)]
    assert [f.result(WAIT) for f in futures] == [b""] * count
    assert served.server.threads_started >= count + 1
    # A burst right after reuses the threads of the one before: none start.
    started = served.server.threads_started
    for _ in range(3):
        futures = [served.unary_future("Meet") for _ in range(count)]
        assert [f.result(WAIT) for f in futures] == [b""] * count
    assert served.server.threads_started == started
    assert served.live_threads() >= count
    deadline = time.monotonic() + WAIT
    while served.live_threads() > SPARE_POLLERS + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.live_threads() <= SPARE_POLLERS + 1
    # The ones left still serve, and threads start again for the next burst.
    started = served.server.threads_started
    futures = [served.unary_future("Meet") for _ in range(count)]
    assert [f.result(WAIT) for f in futures] == [b""] * count
    assert served.server.threads_started > started


# -- 7. stop and close ---------------------------------------------------------------------


def test_stop_now_cancels_calls_in_flight_and_close_waits_for_their_handlers(serve: Serve) -> None:
    stuck = Held(b"too late")
    served = serve({"Stuck": stuck})
    future = served.unary_future("Stuck")
    assert stuck.entered.wait(WAIT)
    stopped = served.server.stop(None)
    assert stopped.wait(WAIT)  # every call ended, its handler still running
    error = failure(lambda: future.result(WAIT))
    assert error.code() in {grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE}
    assert served.server.close(0.1) is False
    stuck.release.set()
    assert served.server.close(WAIT) is True


def test_stop_with_grace_lets_a_call_finish_and_refuses_new_ones(serve: Serve) -> None:
    slow = Held(b"done")
    served = serve({"Slow": slow, "Echo": echo})
    future = served.unary_future("Slow")
    assert slow.entered.wait(WAIT)
    stopped = served.server.stop(WAIT)
    assert not stopped.wait(0.1)  # the call is still in flight
    error = failure(lambda: served.unary("Echo", timeout=1.0))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    slow.release.set()
    assert future.result(WAIT) == b"done"
    assert stopped.wait(WAIT)
    assert served.server.close(WAIT)


def test_stop_with_a_short_grace_cancels_the_call(serve: Serve) -> None:
    stuck = Held()
    served = serve({"Stuck": stuck})
    future = served.unary_future("Stuck")
    assert stuck.entered.wait(WAIT)
    stopped = served.server.stop(0.1)
    assert stopped.wait(WAIT)
    error = failure(lambda: future.result(WAIT))
    assert error.code() in {grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE}
    stuck.release.set()


def test_stop_before_start_stop_twice_and_start_twice(serve: Serve, socket_dir: Path) -> None:
    never = CallServer(1, name="core-test-never")
    assert never.stop(None).is_set()
    assert never.stop(1.0).is_set()
    assert never.close(WAIT)

    served = serve({"Echo": echo})
    with pytest.raises(RuntimeError, match="twice"):
        served.server.start()
    first, second = served.server.stop(1.0), served.server.stop(None)
    assert first.wait(WAIT) and second.wait(WAIT)
    assert served.server.stop(None).is_set()
    assert served.server.close(WAIT)
    with pytest.raises(RuntimeError, match="twice"):
        served.server.start()


def test_at_least_one_thread() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        CallServer(0)


# -- 7b. servers sharing one queue -------------------------------------------------------------


def test_two_servers_on_one_queue_are_served_by_its_threads_and_stop_apart(
        serve: Serve) -> None:
    first = serve({"Where": where})
    second = serve({"Where": where, "Echo": echo}, queue=first.server.queue)
    assert second.server.queue is first.server.queue
    assert second.unary("Where").decode().startswith(f"{first.name}-")
    assert first.unary("Where").decode().startswith(f"{first.name}-")
    threads = first.live_threads()

    assert first.server.stop(None).wait(WAIT)
    assert failure(lambda: first.unary("Where", timeout=1.0)).code() \
        == grpc.StatusCode.UNAVAILABLE
    # The queue serves on while a server on it runs: same threads, none ended.
    assert second.unary("Echo", b"on") == b"echo:on"
    assert first.live_threads() == threads

    assert second.server.stop(None).wait(WAIT)
    assert first.server.close(WAIT) and first.live_threads() == 0


def test_a_server_on_a_shared_queue_stopped_before_start_lets_the_queue_end(
        serve: Serve) -> None:
    first = serve({"Echo": echo})
    never = CallServer(queue=first.server.queue)
    assert never.stop(None).is_set()
    assert first.unary("Echo", b"x") == b"echo:x"
    assert first.server.stop(None).wait(WAIT)
    assert first.server.close(WAIT) and first.live_threads() == 0
    with pytest.raises(RuntimeError, match="shut down"):
        CallServer(queue=first.server.queue)


# -- 8. the fallback to gRPC's synchronous server --------------------------------------------


def test_the_installed_grpcio_has_the_core_api() -> None:
    assert core_server.available()


def test_without_the_core_api_the_daemon_serves_with_grpcs_synchronous_server(
        socket_dir: Path, monkeypatch: pytest.MonkeyPatch,
        registration: RegistrationServicer) -> None:
    preparer = TestPreparer()
    socket = socket_dir / "dra.sock"
    with monkeypatch.context() as patch:
        # Gone only while the server is built: gRPC's own server needs it to serve calls.
        patch.delattr(cygrpc, core_server._NEEDED[-1])
        assert not core_server.available()
        with pytest.raises(RuntimeError, match="core API"):
            CallServer(1)
        server, waiter = plugin_server._serve_calls(
            socket, [DraV1Servicer(ClaimCalls(preparer))], 2)
        reg_server, threads = plugin_server._serve_registration(
            socket_dir / "reg.sock", [registration], beside=server)
    try:
        assert isinstance(server, grpc.Server) and isinstance(waiter, CallThreads)
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            answer = prepare_one(channel)
        assert answer.claims["uid-1"].error == ""
        assert isinstance(reg_server, grpc.Server) and isinstance(threads, CallThreads)
        assert get_info(socket_dir / "reg.sock").name == "gpu.test"
    finally:
        reg_server.stop(None).wait(WAIT)
        server.stop(None).wait(WAIT)
        assert waiter.close(WAIT) and threads is not None and threads.close(WAIT)


def test_with_the_core_api_the_daemon_serves_with_a_call_server(
        socket_dir: Path, registration: RegistrationServicer) -> None:
    socket = socket_dir / "dra.sock"
    server, waiter = plugin_server._serve_calls(
        socket, [DraV1Servicer(ClaimCalls(TestPreparer()))], 2)
    reg_server, threads = plugin_server._serve_registration(
        socket_dir / "reg.sock", [registration], beside=server)
    try:
        assert isinstance(server, CallServer) and waiter is server
        # The registration socket is served from the DRA server's queue and threads.
        assert isinstance(reg_server, CallServer) and threads is None
        assert reg_server.queue is server.queue
        assert get_info(socket_dir / "reg.sock").endpoint == "/dra.sock"
    finally:
        assert reg_server.stop(None).wait(WAIT)
        assert server.stop(None).wait(WAIT)
        assert waiter.close(WAIT)


@pytest.fixture
def registration() -> Iterator[RegistrationServicer]:
    # GetInfo records nothing on the loop, which therefore never runs.
    loop = asyncio.new_event_loop()
    try:
        yield RegistrationServicer("gpu.test", "/dra.sock", ("v1",), RegistrationState(), loop)
    finally:
        loop.close()


def get_info(socket: Path) -> Any:
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        stub = registration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        return stub.GetInfo(registration_pb2.InfoRequest(), timeout=WAIT)


# -- 9. what grpc.server does that the review found missing -----------------------------------


def test_a_socket_it_cannot_bind_is_an_error_not_a_silent_server(socket_dir: Path) -> None:
    server = CallServer(1)
    try:
        with pytest.raises(RuntimeError, match="Failed to bind"):
            server.add_insecure_port(f"unix:{socket_dir}/missing/dra.sock")
    finally:
        server.stop(None)
    with pytest.raises(plugin_server.ServerStartError, match="cannot listen"):
        plugin_server._serve_calls(socket_dir / "missing" / "dra.sock", [], 1)


def test_a_call_cancelled_while_it_waited_for_a_thread_runs_no_handler(serve: Serve) -> None:
    entered, release = threading.Event(), threading.Event()
    ran: list[bytes] = []

    def work(request: bytes, context: Any) -> bytes:
        ran.append(request)
        if request == b"busy":
            entered.set()
            release.wait(WAIT)
        return b"done"

    served = serve({"Work": work}, max_threads=1)
    busy = served.unary_future("Work", b"busy")
    assert entered.wait(WAIT)
    late = served.unary_future("Work", b"late", timeout=0.3)
    assert late.exception(WAIT).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    release.set()
    assert busy.result(WAIT) == b"done"
    assert served.unary("Work", b"next") == b"done"  # the thread is back
    assert ran == [b"busy", b"next"]


def test_a_response_that_is_not_bytes_ends_the_call_at_once(serve: Serve) -> None:
    def nothing(request: bytes, context: Any) -> None:
        return None

    def nothings(request: bytes, context: Any) -> Iterator[None]:
        yield None

    served = serve({"Nothing": nothing}, streams={"Nothings": nothings})
    error = failure(lambda: served.unary("Nothing", timeout=3))
    assert error.code() == grpc.StatusCode.INTERNAL
    error = failure(lambda: list(served.stream("Nothings", timeout=3)))
    assert error.code() == grpc.StatusCode.INTERNAL


def test_a_handler_ending_its_thread_leaves_the_server_serving(serve: Serve) -> None:
    def leave(request: bytes, context: Any) -> bytes:
        raise SystemExit("the handler's thread ends")

    served = serve({"Leave": leave, "Echo": echo}, max_threads=1)
    for _ in range(3):
        error = failure(lambda: served.unary("Leave", timeout=3))
        assert error.code() == grpc.StatusCode.UNKNOWN
        assert served.unary("Echo", b"x", timeout=3) == b"echo:x"


def test_a_handler_lookup_that_fails_answers_unknown_and_the_call_ends(serve: Serve) -> None:
    class Broken(grpc.GenericRpcHandler):  # type: ignore[misc]
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            raise LookupError("a broken generic handler")

    served = serve({"Echo": echo}, generic=(Broken(),))
    error = failure(lambda: served.unary("Other", timeout=3))
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert error.details() == "Error in service handler!"
    # The fixture's stop then finds no call left behind: its event is set and threads end.


def test_the_code_and_details_a_handler_sets_are_the_calls_status(serve: Serve) -> None:
    def missing(request: bytes, context: Any) -> bytes:
        context.set_code(grpc.StatusCode.NOT_FOUND)
        context.set_details("claim uid-1 is not prepared")
        return b""

    served = serve({"Missing": missing})
    error = failure(lambda: served.unary("Missing"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "claim uid-1 is not prepared"


def test_close_right_after_stop_is_true_when_no_handler_runs(serve: Serve) -> None:
    served = serve({"Echo": echo})
    assert served.unary("Echo", b"x") == b"echo:x"
    assert served.server.stop(None).wait(WAIT)
    assert served.server.close(0.0)
