import threading

import pytest

from distgrad.futures import Future, collect_all

pytestmark = pytest.mark.timeout(60)


def test_future_then_chain_and_errors():
    f = Future()
    g = f.then(lambda fut: fut.value() * 2)
    assert not f.done()
    threading.Timer(0.01, f.set_result, (21,)).start()
    assert g.wait(5) == 42 and f.done() and f.value() == 21
    h = Future()
    k = h.then(lambda fut: fut.value())
    h.set_exception(KeyError("x"))
    with pytest.raises(KeyError):
        k.wait(1)
    with pytest.raises(RuntimeError):
        h.set_result(1)
    with pytest.raises(TimeoutError):
        Future().wait(0.01)
    both = collect_all([f, Future()])
    assert not both.done()


def test_torch_futures_names():
    import distgrad
    from distgrad.futures import wait_all
    assert distgrad.futures.Future is Future
    done = [Future(), Future()]
    for i, fut in enumerate(done):
        fut.set_result(i)
    assert wait_all(done) == [0, 1]


def test_wait_all_raises_the_first_error_without_waiting_for_the_others():
    from distgrad.futures import Future, wait_all
    hanging, failing = Future(), Future()
    failing.set_exception(ValueError("stage 2 failed"))
    with pytest.raises(ValueError, match="stage 2 failed"):
        wait_all([hanging, failing], timeout=30)   # returns at once: hanging never completes
    done = [Future(), Future()]
    for i, f in enumerate(done):
        f.set_result(i)
    assert wait_all(done) == [0, 1] and wait_all([]) == []
    with pytest.raises(TimeoutError, match="1 of 1 futures not completed within 0.01 s"):
        wait_all([Future()], timeout=0.01)


def test_wait_all_wakes_for_futures_completed_by_other_threads():
    import threading
    from distgrad.futures import Future, wait_all
    futures = [Future() for _ in range(3)]
    threads = [threading.Thread(target=f.set_result, args=(i,)) for i, f in enumerate(futures)]
    for t in threads:
        t.start()
    assert wait_all(futures, timeout=30) == [0, 1, 2]
    for t in threads:
        t.join()
