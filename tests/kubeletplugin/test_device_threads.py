"""The device work's thread hop: results and errors come back, threads start only when all
are busy, a cancelled wait leaves the work running, close waits for it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpudra.kubeletplugin.device_threads import DeviceThreads


def where(_: object) -> str:
    return threading.current_thread().name


async def test_the_work_runs_off_the_loop_and_its_result_comes_back():
    threads = DeviceThreads()
    assert await threads.run(where, None) == "gpudra-device-0"
    assert await threads.run(lambda x: x * 2, 21) == 42
    threads.close()


async def test_an_exception_reaches_the_awaiting_task():
    threads = DeviceThreads()

    def fail(message: str) -> None:
        raise OSError(message)

    with pytest.raises(OSError, match="disk gone"):
        await threads.run(fail, "disk gone")

    def stop(_: object) -> None:
        raise StopIteration("odd")

    with pytest.raises(RuntimeError, match="StopIteration"):
        await threads.run(stop, None)
    assert await threads.run(where, None) == "gpudra-device-0"  # still serving
    threads.close()


async def test_one_call_at_a_time_uses_one_thread():
    threads = DeviceThreads()
    names = {await threads.run(where, None) for _ in range(20)}
    assert names == {"gpudra-device-0"} and threads.started == 1
    threads.close()


async def test_calls_at_once_get_threads_of_their_own_up_to_the_limit():
    threads = DeviceThreads(max_threads=2)
    release = threading.Event()
    inside = threading.Semaphore(0)

    def blocked(_: object) -> str:
        inside.release()
        release.wait(5)
        return threading.current_thread().name

    calls = [asyncio.ensure_future(threads.run(blocked, None)) for _ in range(3)]
    for _ in range(2):
        assert await asyncio.to_thread(inside.acquire, True, 5)
    assert threads.started == 2  # the third waits for one of them
    release.set()
    names = await asyncio.gather(*calls)
    assert len(names) == 3 and set(names) == {"gpudra-device-0", "gpudra-device-1"}
    threads.close()


async def test_a_cancelled_wait_leaves_the_work_running_and_the_threads_usable():
    threads = DeviceThreads()
    release, done = threading.Event(), threading.Event()

    def slow(_: object) -> None:
        release.wait(5)
        done.set()

    call = asyncio.ensure_future(threads.run(slow, None))
    await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    release.set()
    assert await asyncio.to_thread(done.wait, 5)
    assert await threads.run(where, None) == "gpudra-device-0"
    assert threads.started == 1  # the cancelled job's thread is free again
    threads.close()


async def test_close_waits_for_the_work_in_progress():
    threads = DeviceThreads()
    finished = threading.Event()

    def work(_: object) -> None:
        threading.Event().wait(0.05)
        finished.set()

    call = asyncio.ensure_future(threads.run(work, None))
    await asyncio.sleep(0)
    assert await asyncio.to_thread(threads.close) is True
    assert finished.is_set()
    await call
    with pytest.raises(RuntimeError, match="closed"):
        threads.run(where, None)


async def test_close_says_when_work_outlives_its_timeout():
    threads = DeviceThreads()
    release = threading.Event()
    call = asyncio.ensure_future(threads.run(lambda _: release.wait(5), None))
    await asyncio.sleep(0)
    assert await asyncio.to_thread(threads.close, 0.05) is False
    release.set()
    assert await call is True
