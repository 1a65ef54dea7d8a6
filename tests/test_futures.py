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
