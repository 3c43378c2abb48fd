"""A kubelet keeps a health stream open to the plugin at all times: SIGTERM ends it rather
than waiting out the shutdown grace for it. ``gpudra node`` as a real process."""

from __future__ import annotations

import asyncio

import grpc

from gpudra.api.proto import health_v1_pb2, health_v1_pb2_grpc
from gpudra.kubeletplugin.serving.sockets import dra_socket_path
from tests.integration.daemon import DRIVER, node_daemon


async def test_sigterm_with_an_open_health_stream_exits_at_once(fake_api):
    # An hour's grace: a stream the stop waited for would outlast daemon.stop()'s 20 s.
    with node_daemon(fake_api, kubelet=False, extra_args=["--shutdown-grace", "3600"]) as daemon:
        daemon.start()
        socket = dra_socket_path(daemon.plugins, DRIVER)
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            call = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_v1_pb2.NodeWatchResourcesRequest())
            assert len((await call.read()).devices) > 0
            assert await asyncio.to_thread(daemon.stop) == 0
            assert await call.read() is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
        assert daemon.sockets() == []
