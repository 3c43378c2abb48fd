"""The DRA socket's call threads: results and errors come back through futures, threads
start only when all are busy, they are daemon threads, close waits for work in progress."""

from __future__ import annotations

import threading

import pytest

from gpudra.kubeletplugin.call_threads import CallThreads


def where() -> str:
    return threading.current_thread().name


def test_a_job_runs_in_a_daemon_thread_and_its_result_comes_back():
    threads = CallThreads(4)
    assert threads.submit(where).result(5) == "gpudra-call-0"
    assert threads.submit(lambda x, *, y: x * y, 21, y=2).result(5) == 42
    assert threads.submit(lambda: threading.current_thread().daemon).result(5) is True
    assert threads.close(5)


def test_an_exception_reaches_the_future_and_the_thread_goes_on():
    threads = CallThreads(4)

    def fail(message: str) -> None:
        raise OSError(message)

    with pytest.raises(OSError, match="disk gone"):
        threads.submit(fail, "disk gone").result(5)
    assert threads.submit(where).result(5) == "gpudra-call-0"
    assert threads.started == 1
    assert threads.close(5)


def test_one_job_at_a_time_uses_one_thread():
    threads = CallThreads(4)
    names = {threads.submit(where).result(5) for _ in range(20)}
    assert names == {"gpudra-call-0"} and threads.started == 1
    assert threads.close(5)


def test_jobs_at_once_get_threads_of_their_own_up_to_the_limit():
    threads = CallThreads(2)
    release = threading.Event()
    inside = threading.Semaphore(0)

    def blocked() -> str:
        inside.release()
        release.wait(5)
        return where()

    futures = [threads.submit(blocked) for _ in range(3)]
    for _ in range(2):
        assert inside.acquire(timeout=5)
    assert threads.started == 2  # the third waits for one of them
    assert not futures[2].running()
    release.set()
    names = {future.result(5) for future in futures}
    assert names == {"gpudra-call-0", "gpudra-call-1"}
    assert threads.close(5)


def test_a_job_cancelled_before_it_ran_is_skipped():
    threads = CallThreads(1)
    release = threading.Event()
    ran: list[str] = []
    first = threads.submit(release.wait, 5)
    second = threads.submit(ran.append, "second")
    assert second.cancel()
    release.set()
    assert first.result(5) is True
    assert threads.submit(where).result(5) == "gpudra-call-0"
    assert ran == []
    assert threads.close(5)


def test_close_waits_for_the_work_in_progress_and_refuses_more():
    threads = CallThreads(4)
    finished = threading.Event()

    def work() -> None:
        threading.Event().wait(0.05)
        finished.set()

    future = threads.submit(work)
    assert threads.close(5) is True
    assert finished.is_set() and future.done()
    with pytest.raises(RuntimeError, match="closed"):
        threads.submit(where)


def test_close_says_when_work_outlives_its_timeout():
    threads = CallThreads(4)
    release = threading.Event()
    future = threads.submit(release.wait, 5)
    assert threads.close(0.05) is False
    release.set()
    assert future.result(5) is True


def test_at_least_one_thread():
    with pytest.raises(ValueError, match="at least 1"):
        CallThreads(0)
