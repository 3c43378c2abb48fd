"""A health stream the kubelet opens before the daemon knows its devices sends nothing until
it does: an empty list would turn every device Unknown; and every stream ends when the
daemon stops. Over a real unix socket."""

from __future__ import annotations

import asyncio
import time

import grpc

from gpudra.api.proto import health_v1_pb2
from gpudra.driver.health import DeviceHealth
from gpudra.kubeletplugin.serving.health_service import HealthService

from .conftest import Dirs, TestPreparer, eventually, health_server, watch

POOL = "node-a"


async def opened(service: HealthService, streams: int) -> None:
    """Wait until ``streams`` streams are open on the server's side."""
    assert await eventually(lambda: service.open_streams >= streams, 3)


async def test_a_stream_opened_before_the_devices_are_known_waits_for_them(
        dirs: Dirs, preparer: TestPreparer) -> None:
    service = HealthService(POOL)
    async with health_server(dirs, preparer, service) as (_, channel):
        call = watch(channel)
        first = asyncio.ensure_future(call.read())
        await opened(service, 1)
        await asyncio.sleep(0.2)
        assert not first.done()  # the stream is open, and says nothing yet

        now = int(time.time())
        service.set_source(lambda: [DeviceHealth("gpu-0", "Healthy", "", now),
                                    DeviceHealth("gpu-1", "Unhealthy", "XID 79", now)])
        response = await asyncio.wait_for(first, timeout=3)
        assert [(h.device.device_name, h.health) for h in response.devices] == [
            ("gpu-0", health_v1_pb2.HEALTHY), ("gpu-1", health_v1_pb2.UNHEALTHY)]
        service.notify()  # and from then on as before
        again = await asyncio.wait_for(call.read(), timeout=3)
        assert len(again.devices) == 2
        call.cancel()


async def test_close_ends_open_streams_so_a_graceful_stop_does_not_wait_for_them(
        dirs: Dirs, preparer: TestPreparer) -> None:
    service = HealthService(POOL)  # one stream waits for a source, one is sending
    async with health_server(dirs, preparer, service) as (server, channel):
        waiting = watch(channel)
        await opened(service, 1)
        service.set_source(lambda: [DeviceHealth("gpu-0", "Healthy", "", int(time.time()))])
        sending = watch(channel)
        await asyncio.wait_for(sending.read(), timeout=3)
        await asyncio.wait_for(waiting.read(), timeout=3)

        await asyncio.to_thread(service.close)  # any thread may close it
        # A stream left open would hold the stop for the whole grace, three times as long
        # as this wait (and the failure's clean-up no longer than that).
        await asyncio.wait_for(server.stop(grace=60), timeout=20)
        for call in (waiting, sending):
            assert await call.read() is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
        assert service.open_streams == 0


async def test_a_stream_waiting_for_the_devices_ends_when_its_kubelet_leaves(
        dirs: Dirs, preparer: TestPreparer) -> None:
    """No source ever comes here, so only the call's end can free the stream's thread."""
    service = HealthService(POOL)
    async with health_server(dirs, preparer, service) as (_, channel):
        call = watch(channel)
        await opened(service, 1)
        call.cancel()
        # Within 2 s: not the 30 s resend, nor for ever.
        assert await eventually(lambda: service.open_streams == 0, 2)
