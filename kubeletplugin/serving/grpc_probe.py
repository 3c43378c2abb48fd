"""Ask a plugin's registration socket for ``GetInfo``: the liveness check the kubelet does."""

from __future__ import annotations

from pathlib import Path

import grpc

from gpudra.api.proto import registration_pb2, registration_pb2_grpc


def answers_get_info(socket: Path, timeout: float = 2.0) -> bool:
    """Whether the gRPC server behind ``socket`` answers ``GetInfo`` within ``timeout``."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = registration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.GetInfo(registration_pb2.InfoRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return True
