"""A kubelet keeps a health stream open to the plugin at all times: SIGTERM ends it rather
than waiting out the shutdown grace for it. ``gpudra node`` as a real process."""

from __future__ import annotations

import asyncio
import time

import grpc

from gpudra.api.proto import health_v1_pb2, health_v1_pb2_grpc
from gpudra.kubeletplugin.sockets import dra_socket_path
from tests.integration.daemon import DRIVER, node_daemon


async def test_sigterm_with_an_open_health_stream_exits_at_once(fake_api):
    with node_daemon(fake_api, kubelet=False) as daemon:
        daemon.start()
        socket = dra_socket_path(daemon.plugins, DRIVER)
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            call = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_v1_pb2.NodeWatchResourcesRequest())
            assert len((await call.read()).devices) > 0
            started = time.monotonic()
            assert await asyncio.to_thread(daemon.stop) == 0
            assert time.monotonic() - started < 5  # the shutdown grace is 10 s
            assert await call.read() is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
        assert daemon.sockets() == []
