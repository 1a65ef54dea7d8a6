"""Several threads calling backward at once: separate graphs, and shared leaves."""
import threading

import numpy as np

import distgrad


def _run_threads(target, n=8, timeout=30):
    errors = []

    def wrapped(i):
        try:
            target(i)
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)
    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a backward thread hung"
    if errors:
        raise errors[0]


def test_concurrent_backward_into_a_shared_leaf_sums_exactly():
    w = distgrad.ones(64, dtype=distgrad.float64, requires_grad=True)
    per_thread = 50

    def work(i):
        for _ in range(per_thread):
            ((w * (i + 1)).tanh() * 0 + w * (i + 1)).sum().backward()
    _run_threads(work)
    expected = per_thread * sum(range(1, 9))
    np.testing.assert_array_equal(w.grad.numpy(), np.full(64, float(expected)))


def test_concurrent_separate_graphs_get_their_own_gradients():
    results = {}

    def work(i):
        x = distgrad.tensor([float(i)], dtype=distgrad.float64, requires_grad=True)
        for _ in range(20):
            y = (x ** 2).sum()
            (g,) = distgrad.autograd.grad(y, x)
        results[i] = g.item()
    _run_threads(work)
    assert results == {i: 2.0 * i for i in range(8)}
