"""What the hot-path targets cannot go below on this machine, whatever the driver does.

    python -m bench.floors [--calls 2000]

Each line is a cost the node daemon pays on its hot path and does not control:

- a unary gRPC call over a unix socket between two Python processes (the client is
  grpc.aio, as the kubelet emulator; the server gRPC's synchronous server with a thread
  pool, as the daemon's), with a handler that does nothing: round trip p50 and the
  server's CPU per call;
- a durable checkpoint commit of a 2 KiB file (write a temporary file, fsync, rename, fsync
  the directory) on the checkpoint's disk (``--dir``, default /tmp) and on tmpfs: what a
  compaction costs;
- a durable append of one journal line (write on ``O_APPEND``, fdatasync): what a commit
  that changes only claims costs;
- the resident memory of the third-party packages the daemon imports, before any of ours;
- the interpreter's start and those imports, in wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_CLIENT = r"""
import asyncio, sys, time
import grpc
from gpudra.api.proto import dra_v1_pb2, dra_v1_pb2_grpc

async def main(target: str, calls: int) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        request = dra_v1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace="ns", name="c", uid="u")])
        for _ in range(100):
            await stub.NodeUnprepareResources(request)
        took = []
        for _ in range(calls):
            started = time.perf_counter()
            await stub.NodeUnprepareResources(request)
            took.append(time.perf_counter() - started)
        took.sort()
        print(took[len(took) // 2] * 1000)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""

_IMPORTS = ("asyncio, ssl, json, grpc, grpc.aio, google.protobuf, pydantic, structlog, "
            "pynvml, yaml")


def grpc_floor(calls: int) -> tuple[float, float]:
    """(round trip p50 ms, server CPU ms per call) of a do-nothing unprepare served by
    ``grpc.server`` with a thread pool, as the daemon serves its DRA socket."""
    import grpc

    from gpudra.api.proto import dra_v1_pb2, dra_v1_pb2_grpc
    from gpudra.kubeletplugin.serving.grpc_types import RpcServer

    class Nothing(dra_v1_pb2_grpc.DRAPluginServicer):
        def NodeUnprepareResources(
                self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: object,
        ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
            return dra_v1_pb2.NodeUnprepareResourcesResponse(claims={
                c.uid: dra_v1_pb2.NodeUnprepareResourceResponse() for c in request.claims})

    with tempfile.TemporaryDirectory(prefix="gd-floor-") as tmp:
        target = f"unix:{tmp}/floor.sock"
        pool = ThreadPoolExecutor(max_workers=8)
        server: RpcServer = grpc.server(pool)
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(Nothing(), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(target)
        server.start()
        try:
            cpu = time.process_time()  # every thread of this process, ended ones too
            out = subprocess.run([sys.executable, "-c", _CLIENT, target, str(calls)],
                                 capture_output=True, text=True, check=True).stdout
            cpu = time.process_time() - cpu
        finally:
            server.stop(None).wait(5)
            pool.shutdown(wait=True)
    return float(out), cpu / (calls + 100) * 1000


def commit_floor(directory: Path, count: int = 300) -> float:
    """Median ms of one atomic, durable replace of a 2 KiB file in ``directory``."""
    content = os.urandom(2048)
    took = []
    with tempfile.TemporaryDirectory(prefix="gd-floor-", dir=directory) as tmp:
        target, temp = Path(tmp) / "checkpoint.json", Path(tmp) / "checkpoint.json.tmp"
        for _ in range(count):
            started = time.perf_counter()
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, content)
                os.fsync(fd)
            finally:
                os.close(fd)
            temp.replace(target)
            dir_fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def append_floor(directory: Path, count: int = 300) -> float:
    """Median ms of one durable append of a 400-byte line (write on O_APPEND, fdatasync):
    a claims-only checkpoint commit since the journal."""
    line = os.urandom(199).hex().encode() + b"\n"
    took = []
    with tempfile.TemporaryDirectory(prefix="gd-floor-", dir=directory) as tmp:
        fd = os.open(Path(tmp) / "checkpoint.journal",
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for _ in range(count):
                started = time.perf_counter()
                os.write(fd, line)
                os.fdatasync(fd)
                took.append(time.perf_counter() - started)
        finally:
            os.close(fd)
    return statistics.median(took) * 1000


def import_floor() -> tuple[float, float]:
    """(RSS MiB, wall ms) of a fresh interpreter that imports only third-party packages."""
    code = (f"import {_IMPORTS}\n"
            "print(next(l.split()[1] for l in open('/proc/self/status') "
            "if l.startswith('VmRSS')))")
    walls, rss = [], 0.0
    for _ in range(5):
        started = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout
        walls.append(time.perf_counter() - started)
        rss = int(out) / 1024
    return rss, statistics.median(walls) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp"),
                        help="a directory on the disk the checkpoint lives on")
    args = parser.parse_args()
    round_trip, server_cpu = grpc_floor(args.calls)
    print(f"gRPC unary call, Python to Python over a unix socket, no work, grpc.server: "
          f"round trip p50 {round_trip:.2f} ms, server CPU {server_cpu:.2f} ms per call")
    print(f"durable replace of a 2 KiB file (write, fsync, rename, fsync dir): "
          f"{commit_floor(args.dir):.2f} ms on {args.dir}, "
          f"{commit_floor(Path('/dev/shm')):.3f} ms on /dev/shm (tmpfs)")
    print(f"durable append of a 400-byte line (write, fdatasync): "
          f"{append_floor(args.dir):.2f} ms on {args.dir}")
    rss, wall = import_floor()
    print(f"interpreter + {_IMPORTS}: RSS {rss:.1f} MiB, {wall:.0f} ms from exec")


if __name__ == "__main__":
    main()
