"""The parts of grpcio's public synchronous server API the kubelet's services use, typed.

grpcio ships no type information, so to mypy ``grpc.Server`` and ``grpc.ServicerContext``
are ``Any``. These protocols name exactly what our code calls, so a typo or a call that the
server object does not have is a type error, not a runtime surprise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import NoReturn, Protocol

import grpc


class CallContext(Protocol):
    """The context a synchronous handler gets (``grpc.ServicerContext``)."""

    def is_active(self) -> bool:
        """False once the client cancelled, its deadline passed or the server stopped."""
        ...

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` when the call ends; False if it has ended already."""
        ...

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        """End the call with ``code`` and ``details`` (raises)."""
        ...

    def time_remaining(self) -> float | None: ...


class RpcServer(Protocol):
    """A ``grpc.Server``: what the generated ``add_*Servicer_to_server`` functions and
    :mod:`.server` call on it."""

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Iterable[object]) -> None: ...

    def add_registered_method_handlers(self, service_name: str,
                                       method_handlers: Mapping[str, object]) -> None: ...

    def add_insecure_port(self, address: str) -> int: ...

    def start(self) -> None: ...

    def stop(self, grace: float | None) -> threading.Event:
        """Refuse new calls at once; cancel those still running after ``grace`` seconds
        (None: at once). The event is set once every call ended."""
        ...


class Servicer(Protocol):
    """Something that registers its gRPC service(s), with synchronous handlers, on a
    :class:`RpcServer`."""

    def add_to_server(self, server: RpcServer) -> None: ...
