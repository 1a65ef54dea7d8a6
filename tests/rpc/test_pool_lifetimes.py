"""Every thread has an owner that joins it; one that cannot be joined is reported by name
and stack."""
import logging
import threading

import pytest

from distgrad.utils.lifetimes import join_all
from distgrad.rpc.pool import HandlerPool

pytestmark = pytest.mark.timeout(30)


def _pool_threads(name):
    return [t for t in threading.enumerate() if t.name.startswith(name + "-")]


def test_handler_pool_shutdown_joins_its_threads():
    pool = HandlerPool(3, name="joined-pool")
    done = threading.Event()
    for _ in range(10):   # more jobs than threads: the pool grows
        pool.submit(done.wait, 0.05)
    assert _pool_threads("joined-pool")
    assert pool.shutdown(join_timeout=10) == []
    assert _pool_threads("joined-pool") == []


def test_a_thread_that_cannot_be_joined_is_reported_by_name_and_stack(caplog):
    pool = HandlerPool(1, name="stuck-pool")
    release, started = threading.Event(), threading.Event()

    def stuck_in_a_job():
        started.set()
        release.wait(20)
    pool.submit(stuck_in_a_job)
    assert started.wait(10)
    try:
        with caplog.at_level(logging.WARNING, logger="distgrad"):
            stuck = pool.shutdown(join_timeout=0.2)
        assert [t.name for t in stuck] == ["stuck-pool-1"]
        assert "thread 'stuck-pool-1' did not stop within 0.2 s" in caplog.text
        assert "in stuck_in_a_job" in caplog.text and "release.wait(20)" in caplog.text
    finally:
        release.set()
    assert join_all(stuck, 10, "test") == []


def test_a_pool_thread_may_shut_its_own_pool_down():
    pool = HandlerPool(2, name="self-pool")
    out = []
    done = threading.Event()
    pool.submit(lambda: (out.append(pool.shutdown(join_timeout=5)), done.set()))
    assert done.wait(10) and out == [[]]
